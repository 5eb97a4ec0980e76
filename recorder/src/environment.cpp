#include "crashcap/recorder/environment.hpp"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/environment_facts.hpp"

extern char** environ;

namespace crashcap::recorder {
namespace {

std::string upper(std::string_view s) {
  std::string u(s);
  for (auto& c : u) c = char(std::toupper(static_cast<unsigned char>(c)));
  return u;
}

bool startsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string readFirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return {};
  return line;
}

std::string readAll(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The value of `key:` in /proc/cpuinfo or /proc/meminfo style files.
std::string procField(const char* path, std::string_view key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!startsWith(line, key)) continue;
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    return value;
  }
  return {};
}

std::string osPrettyName() {
  std::ifstream in("/etc/os-release");
  std::string line;
  while (std::getline(in, line))
    if (startsWith(line, "PRETTY_NAME=")) {
      auto v = line.substr(12);
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      return v;
    }
  return {};
}

}  // namespace

bool isSecretName(std::string_view name) {
  std::string u = upper(name);
  // Erase the few common words that merely contain a secret word, so that `--keyframe-every
  // 50` or TOKENIZERS_PARALLELISM stay readable. Anything else that contains one is redacted:
  // a false positive costs a value in a report, a false negative leaks a secret.
  for (const char* benign : {"KEYFRAME", "KEYBOARD", "TOKENIZER", "AUTHOR"}) {
    for (auto at = u.find(benign); at != std::string::npos; at = u.find(benign)) u.erase(at, std::strlen(benign));
  }
  for (const char* word : {"KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "SESSION"})
    if (u.find(word) != std::string::npos) return true;
  for (const char* prefix : {"WANDB_", "AWS_", "HF_", "HUGGING_FACE_", "OPENAI_", "GITHUB_", "AZURE_", "GOOGLE_"})
    if (startsWith(u, prefix)) return true;
  return false;
}

bool isRelevantVariable(std::string_view name) {
  for (const char* prefix : {"CUDA_", "CUDNN_", "CUBLAS_", "NCCL_", "PYTORCH_", "TORCH_", "OMP_", "MKL_", "KMP_",
                             "NVIDIA_", "PYTHON", "CRASHCAP_"})
    if (startsWith(name, prefix)) return true;
  return name == "LD_LIBRARY_PATH" || name == "LD_PRELOAD" || isSecretName(name);
}

std::vector<std::string> redactArguments(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  out.reserve(args.size());
  bool nextIsSecret = false;
  for (const auto& a : args) {
    if (nextIsSecret) {
      out.emplace_back(kRedacted);
      nextIsSecret = false;
      continue;
    }
    auto eq = a.find('=');
    std::string_view name = std::string_view(a).substr(0, eq);
    while (!name.empty() && name.front() == '-') name.remove_prefix(1);
    if (eq != std::string::npos && isSecretName(name)) {
      out.push_back(a.substr(0, eq + 1) + std::string(kRedacted));
    } else {
      out.push_back(a);
      // "--api-key VALUE": the value is the next argument.
      nextIsSecret = eq == std::string::npos && startsWith(a, "-") && isSecretName(name);
    }
  }
  return out;
}

bool looksLikeWsl(std::string_view procVersion, std::string_view osRelease) {
  auto has = [](std::string_view s, std::string_view w) { return upper(s).find(upper(w)) != std::string::npos; };
  return has(procVersion, "microsoft") || has(procVersion, "WSL") || has(osRelease, "microsoft") ||
         has(osRelease, "WSL");
}

formats::EnvironmentData captureEnvironment(const EnvironmentOptions& options) {
  formats::EnvironmentData env;
  auto add = [&](std::string key, std::string value) {
    env.facts.emplace_back(std::move(key), value.empty() ? "unknown" : std::move(value));
  };
  add("crashcap.version", formats::toolVersion());
  add(formats::kReplayProgressFact, "1");  // this crashcap's replay writes its progress
  utsname u{};
  if (uname(&u) == 0) {
    add("os.kernel", std::string(u.sysname) + " " + u.release);
    add("os.machine", u.machine);
    add("host.name", u.nodename);
  }
  add("os.name", osPrettyName());
  const std::string procVersion = readFirstLine("/proc/version");
  const std::string osRelease = readFirstLine("/proc/sys/kernel/osrelease");
  add("os.wsl2", looksLikeWsl(procVersion, osRelease) ? "yes" : "no");
  add("cpu.model", procField("/proc/cpuinfo", "model name"));
  add("cpu.logical", std::to_string(std::thread::hardware_concurrency()));
  add("memory.total", procField("/proc/meminfo", "MemTotal"));
  add("process.pid", std::to_string(getpid()));
  char cwd[4096];
  add("process.cwd", getcwd(cwd, sizeof cwd) ? cwd : "");

  std::vector<std::string> args;
  const std::string cmdline = readAll("/proc/self/cmdline");
  for (size_t start = 0; start < cmdline.size();) {
    size_t end = cmdline.find('\0', start);
    if (end == std::string::npos) end = cmdline.size();
    args.push_back(cmdline.substr(start, end - start));
    start = end + 1;
  }
  env.commandLine = redactArguments(args);
  for (size_t i = 0; i < args.size(); ++i)
    if (env.commandLine[i] != args[i]) env.redacted.push_back("argv[" + std::to_string(i) + "]");

  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    std::string name(entry.substr(0, eq));
    if (!options.allVariables && !isRelevantVariable(name)) continue;
    if (isSecretName(name)) {
      env.variables.emplace_back(name, std::string(kRedacted));
      env.redacted.push_back(name);
    } else {
      env.variables.emplace_back(name, std::string(entry.substr(eq + 1)));
    }
  }
  std::sort(env.variables.begin(), env.variables.end());
  return env;
}

}  // namespace crashcap::recorder
