#include "crashcap/supervisor/summary.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <regex>
#include <set>

#include <sys/stat.h>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/clock.hpp"
#include "crashcap/formats/directory.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/recorder/recording_dir.hpp"
#include "crashcap/supervisor/classify.hpp"
#include "crashcap/supervisor/run_log.hpp"

namespace crashcap::supervisor {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kMaxDepth = 8;
constexpr size_t kMaxLogLines = 100000;
constexpr size_t kMaxLogLineBytes = 1 << 20;
/// A separator is named when at most this share of the healthy runs meets it too.
constexpr double kMaxHealthyShare = 0.1;

/// `line` without the whitespace it ends with.
std::string trimmed(std::string line) {
  line.erase(line.find_last_not_of(" \t\r") + 1);
  return line;
}

std::optional<double> number(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno != 0) return std::nullopt;
  return v;
}

int64_t parseTime(const std::string& s) {  // formats::formatTime's "2026-11-21 21:40:01 UTC"
  std::tm tm{};
  if (!strptime(s.c_str(), "%Y-%m-%d %H:%M:%S", &tm)) return 0;
  return static_cast<int64_t>(timegm(&tm)) * 1'000'000'000;
}

std::string underRoot(const fs::path& p, const fs::path& root) {
  std::error_code ec;
  auto r = fs::relative(p, root, ec);
  return ec || r.empty() ? p.string() : r.string();
}

/// What a crash bundle says about its run.
struct BundleFacts {
  std::string path;
  std::string classification, error, op, phase;
  int64_t timeNs = 0;
  std::map<std::string, std::string> params;
  bool claimed = false;  ///< a runs.jsonl line names it
};

/// What the bundle at `path` says of its crash; nullopt, with `why` saying so, when it holds none.
/// `damage` is what the reader could not read ("" for an intact bundle).
std::optional<BundleFacts> readBundle(const std::string& path, std::string& why, std::string& damage) {
  auto reader = formats::BundleReader::open(path);
  if (!reader->report().complete()) damage = reader->report().summary();
  auto v = formats::readRecords(*reader);
  if (!v.crash && !v.supervision) {
    why = damage.empty() ? "no crash in it (a sealed recording, or an imported bundle)" : "";
    return std::nullopt;
  }
  BundleFacts f;
  f.path = path;
  if (v.supervision) {
    f.classification = v.supervision->classification;
    f.error = errorLine(v.supervision->evidence);
    f.timeNs = v.supervision->endNs;
    for (const auto& p : v.supervision->params) {
      auto eq = p.find('=');
      f.params[p.substr(0, eq)] = eq == std::string::npos ? "" : p.substr(eq + 1);
    }
  }
  if (v.crash) {
    if (f.classification.empty()) f.classification = classificationOf(*v.crash);
    if (!v.crash->error.empty()) f.error = errorLine(v.crash->error);
    f.phase = v.crash->phase;
    if (v.crash->timeNs) f.timeNs = v.crash->timeNs;
    // The op that was running names where an exception came from; a non-finite loss is found at
    // the step's end, after ops that have nothing to do with it (replay names the first bad op);
    // loading a batch or the time between steps runs none of the step's ops (the trace's last one
    // is the step before's).
    if (v.crash->step >= 0 && v.opTrace && v.crash->kind != "nonfinite" && formats::phaseInStep(v.crash->phase))
      for (auto it = v.opTrace->ops.rbegin(); it != v.opTrace->ops.rend(); ++it)
        if (it->step == v.crash->step) {
          f.op = it->name;
          break;
        }
  }
  if (f.classification.empty()) f.classification = "unknown";
  return f;
}

std::string signatureOf(const SummaryRun& r) {
  return fmt::format("{} | {} | {}", normalizeError(r.error), r.op.empty() ? "-" : r.op, r.phase.empty() ? "-" : r.phase);
}

/// One condition on one parameter, as a predicate over values.
struct Condition {
  std::string param, text;
  enum Kind { Equal, AtLeast, AtMost } kind = Equal;
  std::string value;
  double bound = 0;
  bool holds(const std::string& v) const {
    if (kind == Equal) return v == value;
    auto n = number(v);
    return n && (kind == AtLeast ? *n >= bound : *n <= bound);
  }
};

std::string shortNumber(double v) { return fmt::format("{:g}", v); }

/// The conditions on `param` that every run of `failing` meets.
std::vector<Condition> conditionsOn(const std::string& param, const std::vector<const SummaryRun*>& failing) {
  std::vector<Condition> out;
  std::set<std::string> values;
  std::vector<double> numbers;
  for (const auto* r : failing) {
    const auto& v = r->params.at(param);
    values.insert(v);
    if (auto n = number(v)) numbers.push_back(*n);
  }
  if (values.size() == 1) out.push_back({param, fmt::format("{} = {}", param, *values.begin()), Condition::Equal, *values.begin()});
  if (values.size() > 1 && numbers.size() == failing.size()) {
    double lo = *std::min_element(numbers.begin(), numbers.end()), hi = *std::max_element(numbers.begin(), numbers.end());
    out.push_back({param, fmt::format("{} >= {}", param, shortNumber(lo)), Condition::AtLeast, "", lo});
    out.push_back({param, fmt::format("{} <= {}", param, shortNumber(hi)), Condition::AtMost, "", hi});
  }
  return out;
}

/// The best separators of a group of failing runs from the healthy runs: single conditions that
/// at most a tenth of the healthy runs meet, and a pair of conditions on two parameters when
/// together they separate completely and no single one does.
std::vector<Separator> separate(const std::vector<const SummaryRun*>& failing, const std::vector<const SummaryRun*>& healthy) {
  if (failing.size() < 2 || healthy.empty()) return {};
  std::set<std::string> common;
  for (const auto& [k, v] : failing.front()->params) common.insert(k);
  for (const auto* r : failing)
    for (auto it = common.begin(); it != common.end();) it = r->params.count(*it) ? std::next(it) : common.erase(it);
  std::vector<Condition> conditions;
  for (const auto& p : common)
    for (auto& c : conditionsOn(p, failing)) conditions.push_back(std::move(c));
  auto score = [&](const std::vector<const Condition*>& cs) {
    Separator s;
    s.failing = failing.size();
    for (const auto* h : healthy) {
      bool has = true, meets = true;
      for (const auto* c : cs) {
        auto it = h->params.find(c->param);
        // A run without the parameter does not meet an equality (a lone --amp flag absent is
        // amp off); a bound says nothing about it.
        if (it == h->params.end()) (c->kind == Condition::Equal ? meets : has) = false;
        else if (!c->holds(it->second)) meets = false;
      }
      if (!has) continue;
      ++s.healthyTotal;
      if (meets) ++s.healthy;
    }
    for (size_t i = 0; i < cs.size(); ++i) s.rule += (i ? " and " : "") + cs[i]->text;
    return s;
  };
  auto share = [](const Separator& s) { return s.healthyTotal ? double(s.healthy) / double(s.healthyTotal) : 1.0; };
  std::vector<Separator> singles;
  for (const auto& c : conditions) {
    auto s = score({&c});
    if (s.healthyTotal >= 2 && share(s) <= kMaxHealthyShare) singles.push_back(s);
  }
  auto better = [&](const Separator& a, const Separator& b) {
    if (share(a) != share(b)) return share(a) < share(b);
    return a.rule < b.rule;
  };
  std::sort(singles.begin(), singles.end(), better);
  std::vector<Separator> out;
  if (singles.empty() || singles.front().healthy > 0) {
    std::optional<Separator> bestPair;
    for (size_t i = 0; i < conditions.size(); ++i)
      for (size_t j = i + 1; j < conditions.size(); ++j) {
        if (conditions[i].param == conditions[j].param) continue;
        auto s = score({&conditions[i], &conditions[j]});
        if (s.healthyTotal >= 2 && s.healthy == 0 && (!bestPair || better(s, *bestPair))) bestPair = s;
      }
    if (bestPair) out.push_back(*bestPair);
  }
  for (auto& s : singles)
    if (out.size() < 3) out.push_back(std::move(s));
  return out;
}

}  // namespace

std::string normalizeError(const std::string& error) {
  // An address starts a word: "30x12" in "shapes (30x12 and 10x32)" is a shape, not one.
  static const std::regex hex("\\b0x[0-9a-fA-F]+"), num("[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?"),
      signedNan("-nan\\b");
  std::string s = std::regex_replace(errorLine(error), hex, "ADDR");  // first: its digits are not numbers
  s = std::regex_replace(s, num, "N");
  s = std::regex_replace(s, signedNan, "nan");  // a NaN's sign says nothing
  if (s.size() > 200) s = s.substr(0, 200) + "...";
  return s;
}

std::string errorLine(const std::string& text) {
  static const std::regex typed("^[A-Za-z_][A-Za-z0-9_.]*: .*");
  std::string last, named;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    std::string line = trimmed(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (!line.empty()) {
      last = line;
      if (std::regex_match(line, typed)) named = line;
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return named.empty() ? last : named;
}

std::string classificationOf(const formats::CrashData& c) {
  if (c.kind == "nonfinite") return "nonfinite-loss";
  auto found = classifyExit(c.signal ? -1 : 1, c.signal, "", c.error);
  if (found.id.empty() || found.id == "exit-nonzero") return c.kind.empty() ? "unknown" : c.kind;
  return found.id;
}

RunDirListing listRunDir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(ErrorCode::NotFound, fmt::format("{} is not a directory", dir),
                "give the directory `crashcap run --dir` (or a study) wrote its bundles into");
  RunDirListing out;
  const fs::path root = fs::absolute(dir);
  // DEPTH: how deep D lies under ROOT (ROOT's own entries are at 0).
  std::function<void(const fs::path&, int)> walk = [&](const fs::path& d, int depth) {
    std::vector<formats::DirectoryEntry> entries;
    const std::string error = formats::listDirectory(d.string(), entries);
    if (!error.empty()) {
      // A subdirectory removed since its parent was listed (a run cleaning up) is no loss.
      struct stat st {};
      if (depth > 0 && ::lstat(d.c_str(), &st) != 0 && errno == ENOENT) return;
      out.unreadable.emplace_back(underRoot(d, root), error);
    }
    for (const auto& entry : entries) {
      const fs::path path = d / entry.name;
      if (entry.name[0] == '.') continue;  // a tool's own (crashcap.optuna's .trial/), never runs
      if (entry.directory) {
        if (entry.name.rfind(recorder::kRecordingPrefix, 0) == 0) {
          // A finished recording is a clean run's (kept with --keep-recording); one that was not
          // closed may hold a crash nobody sealed.
          if (recorder::isRecording(path.string()) && recorder::recordingState(path.string()) != "finished")
            out.unsealed.push_back(underRoot(path, root));
        } else if (!entry.symlink && depth < kMaxDepth) {
          walk(path, depth + 1);
        }
        continue;
      }
      if (entry.name == kRunLogName) out.logs.push_back(path.string());
      else if (path.extension() == ".ccap") out.bundles.push_back(path.string());
      // crashcap's own passing files: a half-written bundle, a kernel trace not yet collected.
      else if (path.extension() == ".partial" || path.extension() == ".cctrace")
        continue;
      else out.skipped.push_back(underRoot(path, root));
    }
  };
  walk(root, 0);
  std::sort(out.bundles.begin(), out.bundles.end());
  std::sort(out.logs.begin(), out.logs.end());
  std::sort(out.unsealed.begin(), out.unsealed.end());
  std::sort(out.skipped.begin(), out.skipped.end());
  return out;
}

std::vector<nlohmann::json> readRunLog(const std::string& log, const std::string& root,
                                       std::vector<std::pair<std::string, std::string>>& unreadable) {
  std::ifstream in(log);
  std::vector<json> lines;
  std::string line;
  size_t number = 0;
  while (std::getline(in, line) && number < kMaxLogLines) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = line.size() <= kMaxLogLineBytes ? json::parse(line, nullptr, false) : json();
    if (!j.is_object()) {
      unreadable.emplace_back(fmt::format("{}:{}", underRoot(log, root), number), "not a run log line (JSON object)");
      continue;
    }
    j["_line"] = number;
    lines.push_back(std::move(j));
  }
  return lines;
}

CrashSummary summarizeCrashes(const std::string& dir) {
  CrashSummary out;
  out.dir = dir;
  const fs::path root = fs::absolute(dir);
  RunDirListing listing = listRunDir(dir);
  std::vector<fs::path> bundles(listing.bundles.begin(), listing.bundles.end()), logs(listing.logs.begin(), listing.logs.end());
  out.unsealed = listing.unsealed;
  out.skipped = listing.skipped;
  out.unreadable = listing.unreadable;

  std::vector<BundleFacts> facts;
  for (const auto& b : bundles) {
    std::string why, damage;
    try {
      auto f = readBundle(b.string(), why, damage);
      if (f) facts.push_back(std::move(*f));
      if (!damage.empty())  // counted when its crash survived, and listed either way
        (f ? out.damaged : out.unreadable)
            .emplace_back(underRoot(b, root), f ? damage : damage + "; no crash record survived");
      else if (!f)
        out.skipped.push_back(underRoot(b, root) + ": " + why);
    } catch (const Error& e) {
      out.unreadable.emplace_back(underRoot(b, root), e.what());
    }
  }
  auto findFacts = [&](const std::string& bundle) -> BundleFacts* {
    for (auto& f : facts)
      if (f.path == bundle) return &f;
    // The directory may have moved since the line was written: the file name still matches.
    auto name = fs::path(bundle).filename();
    for (auto& f : facts)
      if (fs::path(f.path).filename() == name) return &f;
    return nullptr;
  };
  auto fromFacts = [&](SummaryRun& r, const BundleFacts& f) {
    r.bundle = f.path;
    r.error = f.error;
    r.op = f.op;
    r.phase = f.phase;
    if (r.classification.empty()) r.classification = f.classification;
    if (!r.timeNs) r.timeNs = f.timeNs;
    if (r.params.empty()) r.params = f.params;
  };

  for (const auto& log : logs) {
    std::vector<json> lines = readRunLog(log.string(), root.string(), out.unreadable);
    const std::string where = underRoot(log.parent_path(), root);
    for (const auto& j : lines) {
      SummaryRun r;
      r.name = lines.size() == 1 ? where : fmt::format("{}:{}", where == "." ? kRunLogName : where + "/" + kRunLogName,
                                                       j["_line"].get<size_t>());
      r.classification = j.value("classification", "");
      r.failed = !r.classification.empty();
      r.error = errorLine(j.value("evidence", ""));
      r.timeNs = parseTime(j.value("end", ""));
      if (j.contains("params") && j["params"].is_object())
        for (const auto& [k, v] : j["params"].items()) r.params[k] = v.is_string() ? v.get<std::string>() : v.dump();
      // The run's bundle, and those it left besides (a clean run's program may have sealed a crash
      // and gone on): all the run's, none a run of its own.
      std::vector<std::string> bundles;
      if (!j.value("bundle", "").empty()) bundles.push_back(j["bundle"].get<std::string>());
      if (j.contains("other_bundles") && j["other_bundles"].is_array())
        for (const auto& b : j["other_bundles"])
          if (b.is_string()) bundles.push_back(b.get<std::string>());
      for (size_t k = 0; k < bundles.size(); ++k) {
        auto* f = findFacts(bundles[k]);
        if (f) f->claimed = true;
        if (!r.bundle.empty()) continue;
        if (f) {
          fromFacts(r, *f);
          r.failed = true;
        } else if (k == 0) {
          r.bundle = bundles[k];  // gone or unreadable: the line still tells the crash
        }
      }
      out.runs.push_back(std::move(r));
    }
  }
  for (const auto& f : facts) {
    if (f.claimed) continue;
    SummaryRun r;
    r.name = underRoot(f.path, root);
    r.failed = true;
    fromFacts(r, f);
    out.runs.push_back(std::move(r));
  }

  std::vector<const SummaryRun*> healthy;
  std::map<std::pair<std::string, std::string>, size_t> index;
  for (const auto& r : out.runs) {
    if (!r.failed) {
      healthy.push_back(&r);
      continue;
    }
    auto key = std::make_pair(r.classification, signatureOf(r));
    auto [it, fresh] = index.emplace(key, out.groups.size());
    if (fresh) {
      CrashGroup g;
      g.classification = key.first;
      g.signature = key.second;
      g.error = r.error;
      g.op = r.op;
      g.phase = r.phase;
      out.groups.push_back(std::move(g));
    }
    out.groups[it->second].runs.push_back(&r);
  }
  out.healthy = healthy.size();
  out.failed = out.runs.size() - healthy.size();
  for (auto& g : out.groups) {
    std::stable_sort(g.runs.begin(), g.runs.end(), [](auto* a, auto* b) { return a->timeNs < b->timeNs; });
    g.firstNs = g.runs.front()->timeNs;
    g.lastNs = g.runs.back()->timeNs;
    g.separatedBy = separate(g.runs, healthy);
  }
  std::stable_sort(out.groups.begin(), out.groups.end(),
                   [](const CrashGroup& a, const CrashGroup& b) { return a.runs.size() > b.runs.size(); });
  return out;
}

json crashSummaryJson(const CrashSummary& s) {
  json groups = json::array();
  for (const auto& g : s.groups) {
    json runs = json::array(), bundles = json::array(), seps = json::array();
    for (const auto* r : g.runs) {
      runs.push_back(r->name);
      if (!r->bundle.empty()) bundles.push_back(r->bundle);
    }
    for (const auto& x : g.separatedBy)
      seps.push_back({{"rule", x.rule}, {"failing", x.failing}, {"healthy", x.healthy}, {"healthy_total", x.healthyTotal}});
    groups.push_back({{"classification", g.classification},
                      {"signature", g.signature},
                      {"error", g.error},
                      {"op", g.op},
                      {"phase", g.phase},
                      {"count", g.runs.size()},
                      {"runs", runs},
                      {"bundles", bundles},
                      {"first", g.firstNs ? json(formats::formatTime(g.firstNs)) : json(nullptr)},
                      {"last", g.lastNs ? json(formats::formatTime(g.lastNs)) : json(nullptr)},
                      {"separated_by", seps}});
  }
  json unreadable = json::array(), damaged = json::array();
  for (const auto& [path, why] : s.unreadable) unreadable.push_back({{"path", path}, {"error", why}});
  for (const auto& [path, why] : s.damaged) damaged.push_back({{"path", path}, {"error", why}});
  return {{"dir", s.dir},         {"runs", s.runs.size()}, {"healthy", s.healthy},   {"failed", s.failed},
          {"groups", groups},     {"unreadable", unreadable}, {"damaged", damaged}, {"skipped", s.skipped},
          {"unsealed", s.unsealed}};
}

std::string crashSummaryText(const CrashSummary& s) {
  std::string out = fmt::format("crashcap summary of {}: {} run{}, {} healthy, {} crashed", s.dir, s.runs.size(),
                                s.runs.size() == 1 ? "" : "s", s.healthy, s.failed);
  if (!s.groups.empty()) out += fmt::format(" in {} group{}", s.groups.size(), s.groups.size() == 1 ? "" : "s");
  out += "\n";
  for (const auto& g : s.groups) {
    out += fmt::format("\n{:>4}  {}  {}\n", g.runs.size(), g.classification, g.signature);
    out += fmt::format("      error   {}\n", g.error);
    std::string runs;
    for (size_t i = 0; i < g.runs.size() && i < 12; ++i) runs += (i ? ", " : "") + g.runs[i]->name;
    if (g.runs.size() > 12) runs += fmt::format(", and {} more", g.runs.size() - 12);
    out += fmt::format("      runs    {}\n", runs);
    if (g.firstNs)
      out += g.firstNs == g.lastNs ? fmt::format("      when    {}\n", formats::formatTime(g.firstNs))
                                   : fmt::format("      when    {} .. {}\n", formats::formatTime(g.firstNs),
                                                 formats::formatTime(g.lastNs));
    for (const auto& x : g.separatedBy)
      out += fmt::format("      apart   {}: all {} of these, {} of {} healthy run{}\n", x.rule, x.failing, x.healthy,
                         x.healthyTotal, x.healthyTotal == 1 ? "" : "s");
    if (!g.runs.front()->bundle.empty()) out += fmt::format("      next    crashcap inspect {}\n", g.runs.front()->bundle);
  }
  if (!s.unreadable.empty()) {
    out += fmt::format("\nunreadable ({}):\n", s.unreadable.size());
    for (const auto& [path, why] : s.unreadable) out += fmt::format("  {}: {}\n", path, why);
  }
  if (!s.damaged.empty()) {
    out += fmt::format("\ndamaged, counted with what survived ({}; `crashcap verify` says more):\n", s.damaged.size());
    for (const auto& [path, why] : s.damaged) out += fmt::format("  {}: {}\n", path, why);
  }
  if (!s.unsealed.empty()) {
    out += fmt::format("\nrecordings nobody sealed ({}; `crashcap seal DIR` makes each a bundle):\n", s.unsealed.size());
    for (const auto& u : s.unsealed) out += "  " + u + "\n";
  }
  if (!s.skipped.empty()) {
    out += fmt::format("\nskipped ({}: not a crash bundle or run log):", s.skipped.size());
    for (size_t i = 0; i < s.skipped.size() && i < 8; ++i) out += (i ? ", " : " ") + s.skipped[i];
    if (s.skipped.size() > 8) out += fmt::format(", and {} more", s.skipped.size() - 8);
    out += "\n";
  }
  return out;
}

}  // namespace crashcap::supervisor
