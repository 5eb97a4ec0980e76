#include "crashcap/investigate/experiments.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include "crashcap/formats/error.hpp"
#include "crashcap/investigate/replays.hpp"
#include "crashcap/supervisor/child_process.hpp"

namespace crashcap::investigate {
namespace {

std::string selfPath() {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  return n > 0 ? std::string(exe, static_cast<size_t>(n)) : "crashcap";
}

}  // namespace

ExperimentRunner::ExperimentRunner(ExperimentOptions options) : options_(std::move(options)) {
  options_.progress = options_.progress && isatty(2);
  if (options_.executable.empty()) options_.executable = selfPath();
}

Experiment ExperimentRunner::run(const std::string& name, const std::vector<std::string>& args, double scale) {
  Experiment e;
  e.name = name;
  std::vector<std::string> argv = args;
  if (options_.allowDamaged) argv.push_back("--allow-damaged");
  if (options_.allowChangedSources || changedSourcesAllowed()) argv.push_back("--allow-changed-source");
  e.command = "crashcap";
  for (const auto& a : argv) e.command += " " + a;
  if (options_.progress) {
    std::fprintf(stderr, "  %-15s %s ...", name.c_str(), e.command.c_str());
    std::fflush(stderr);
  }
  argv.insert(argv.begin(), options_.executable);
  const double timeout = options_.timeoutSeconds * scale;
  auto child = supervisor::runCaptured(argv, timeout);
  e.seconds = child.seconds;
  e.exitCode = child.exitCode;
  e.timedOut = child.timedOut;
  if (child.timedOut) {
    e.outcome = fmt::format("timeout after {:.0f} s", timeout);
  } else if (child.exitCode < 0) {
    e.outcome = fmt::format("child killed by signal {}", -child.exitCode);
  } else if (child.exitCode != 0) {
    // crashcap's own error line names the problem; a hint may follow it.
    auto at = child.err.rfind("crashcap: error: ");
    e.outcome = "failed: " + (at == std::string::npos ? lastLine(child.err)
                                                      : child.err.substr(at + 17, child.err.find('\n', at) - at - 17));
  } else {
    try {
      e.output = nlohmann::json::parse(child.out);
      e.outcome = "ok";
    } catch (const std::exception& ex) {
      e.outcome = std::string("unreadable output: ") + ex.what();
    }
  }
  if (options_.progress) std::fprintf(stderr, " %s (%.1f s)\n", e.outcome.c_str(), e.seconds);
  log_.push_back(e);
  return e;
}

nlohmann::json experimentLogJson(const std::vector<Experiment>& log) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : log)
    out.push_back({{"name", e.name}, {"command", e.command}, {"outcome", e.outcome}, {"seconds", e.seconds}});
  return out;
}

}  // namespace crashcap::investigate
