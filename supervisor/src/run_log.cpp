#include "crashcap/supervisor/run_log.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "crashcap/formats/clock.hpp"
#include "crashcap/formats/error.hpp"

namespace crashcap::supervisor {
namespace {

constexpr size_t kMaxParams = 256;
constexpr size_t kMaxParamBytes = 4096;

bool isNumber(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

std::string nameOf(const std::string& entry) { return entry.substr(0, entry.find('=')); }

void add(std::vector<std::string>& out, std::set<std::string>& seen, std::string name, std::string value) {
  if (name.empty() || out.size() >= kMaxParams || !seen.insert(name).second) return;
  std::string entry = name + "=" + value;
  if (entry.size() > kMaxParamBytes) entry.resize(kMaxParamBytes);
  out.push_back(std::move(entry));
}

}  // namespace

std::vector<std::string> commandLineParams(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.size() < 3 || a.compare(0, 2, "--") != 0) continue;  // positional, or a short option
    auto eq = a.find('=');
    if (eq != std::string::npos) {
      add(out, seen, a.substr(2, eq - 2), a.substr(eq + 1));
      continue;
    }
    std::string name = a.substr(2);
    const bool hasValue = i + 1 < argv.size() && (argv[i + 1].empty() || argv[i + 1][0] != '-' || isNumber(argv[i + 1]));
    if (hasValue) {
      add(out, seen, name, argv[i + 1]);
      ++i;
    } else {
      add(out, seen, name, "true");
    }
  }
  return out;
}

std::vector<std::string> declaredParams(const std::string& path, std::string* problem) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::string text(1 << 20, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    if (problem) *problem = fmt::format("{} holds no JSON object (cut short, or written by something else)", path);
    return {};
  }
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& [name, value] : j.items())
    add(out, seen, name, value.is_string() ? value.get<std::string>() : value.dump());
  return out;
}

std::vector<std::string> mergeParams(const std::vector<std::string>& commandLine, const std::vector<std::string>& declared) {
  std::map<std::string, std::string> declaredByName;
  for (const auto& d : declared) declaredByName[nameOf(d)] = d;
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& c : commandLine) {
    auto it = declaredByName.find(nameOf(c));
    out.push_back(it == declaredByName.end() ? c : it->second);
    seen.insert(nameOf(c));
  }
  for (const auto& d : declared)
    if (!seen.count(nameOf(d)) && out.size() < kMaxParams) out.push_back(d);
  return out;
}

void appendRunLog(const std::string& dir, const RunLogEntry& e) {
  nlohmann::json params = nlohmann::json::object();
  for (const auto& p : e.params) {
    auto eq = p.find('=');
    params[p.substr(0, eq)] = eq == std::string::npos ? "" : p.substr(eq + 1);
  }
  nlohmann::json j = {{"command", e.command},
                      {"attempt", e.attempt},
                      {"pid", e.pid},
                      {"start", formats::formatTime(e.startNs)},
                      {"end", formats::formatTime(e.endNs)},
                      {"seconds", static_cast<double>(e.endNs - e.startNs) / 1e9},
                      {"exit_code", e.exitCode},
                      {"signal", e.signal},
                      {"classification", e.classification},
                      {"evidence", e.evidence},
                      {"bundle", e.bundle},
                      {"other_bundles", e.otherBundles},
                      {"params", params},
                      {"job_id", e.jobId}};
  if (!e.ranks.empty()) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& r : e.ranks)
      ranks.push_back({{"rank", r.rank},
                       {"pid", r.pid},
                       {"exit_code", r.exitCode},
                       {"signal", r.signal},
                       {"classification", r.classification},
                       {"stopped", r.stopped},
                       {"bundle", r.bundle}});
    j["ranks"] = ranks;
    j["first_failed_rank"] = e.firstFailedRank >= 0 ? nlohmann::json(e.firstFailedRank) : nlohmann::json(nullptr);
  }
  // One write(2) of the whole line with O_APPEND: runs of several supervisors into one
  // directory never interleave inside a line.
  std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  auto path = (std::filesystem::path(dir) / kRunLogName).string();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(ErrorCode::Io, fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  ssize_t n = ::write(fd, line.data(), line.size());
  int saved = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(line.size()))
    throw Error(ErrorCode::Io, fmt::format("cannot append to {}: {}", path, n < 0 ? std::strerror(saved) : "short write"));
}

}  // namespace crashcap::supervisor
