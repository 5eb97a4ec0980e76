#include "crashcap/supervisor/job.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/clock.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/python_frames.hpp"
#include "crashcap/formats/signal_name.hpp"
#include "crashcap/inspect/story.hpp"
#include "crashcap/supervisor/job_archive.hpp"
#include "crashcap/supervisor/run_log.hpp"
#include "crashcap/supervisor/summary.hpp"

namespace crashcap::supervisor {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// A termination request from outside (a scheduler, a launcher, a person), not a failure.
bool isStopSignal(const std::string& name) { return name == "SIGTERM" || name == "SIGINT" || name == "SIGHUP"; }

std::string signalText(int signal) {
  const char* name = formats::signalName(signal);
  return name ? name : fmt::format("signal {}", signal);
}

/// What a launcher printed of one of its ranks' deaths by a signal: the signal and the launcher's
/// own line. torchrun's failure report names the process by pid ("exitcode  : -9 (pid: 4242)",
/// "Signal 9 (SIGKILL) received by PID 4242"); torch.multiprocessing.spawn by its index, which is
/// the rank as spawn hands it out ("process 1 terminated with signal SIGKILL").
struct LauncherAccount {
  int signal = 0;
  std::string line;
};
std::optional<LauncherAccount> launcherAccount(const std::string& output, uint32_t pid, int rank) {
  std::smatch m;
  const std::string p = std::to_string(pid);
  if (pid && std::regex_search(output, m, std::regex("Signal (\\d+) \\(SIG[A-Z0-9]+\\) received by PID " + p + "\\b")))
    return LauncherAccount{std::stoi(m[1]), m[0]};
  if (pid && std::regex_search(output, m, std::regex("exitcode\\s*:\\s*-(\\d+)\\s*\\(pid:\\s*" + p + "\\)")))
    return LauncherAccount{std::stoi(m[1]), m[0]};
  if (std::regex_search(output, m, std::regex("process " + std::to_string(rank) + " terminated with signal (SIG[A-Z0-9]+)")))
    for (int s = 1; s < 65; ++s)
      if (const char* name = formats::signalName(s); name && m[1] == name) return LauncherAccount{s, m[0]};
  return std::nullopt;
}

/// What one bundle says of its rank; nullopt when the bundle has no distributed record.
std::optional<JobRank> rankOf(const std::string& path, const formats::BundleReader& reader,
                              const formats::BundleRecords& v, std::string& jobId, int& worldSize) {
  if (!v.distributed) return std::nullopt;
  const auto& d = *v.distributed;
  jobId = d.jobId;
  worldSize = d.worldSize;
  JobRank r;
  r.rank = d.rank;
  r.bundle = path;
  r.backend = d.backend;
  if (auto info = reader.recordingInfo()) r.pid = info->pid;
  // crashcap run's record of the process it started says how a launcher that started the ranks
  // (torchrun, torch.multiprocessing.spawn, a script starting copies of itself) ended: whichever
  // rank's failure it reported first, not this rank's. crashcap run adds it to one rank's bundle,
  // and seals with it the recordings of ranks that could not seal their own (SIGKILL). A rank
  // that wrote its own crash record is told by that record; the launcher's is kept for a rank
  // without one, as the only account of it there is.
  uint32_t recorder = 0;  // the process that recorded the rank (the bundle's writer may be crashcap run)
  if (auto env = reader.environment()) recorder = uint32_t(std::strtoul(env->fact("process.pid").c_str(), nullptr, 10));
  // A rank killed before its environment record reached the disk: run.ccap's first record, written
  // when its Recorder started, names the same process.
  if (auto info = reader.recordingInfo(); !recorder && info) recorder = info->pid;
  bool launcherRecord = false;  // the record is a launcher's, not this rank's process's
  if (v.supervision && recorder && v.supervision->pid != recorder) {
    const auto& started = v.supervision->environment;  // crashcap run --nproc started it as this rank
    launcherRecord = std::find(started.begin(), started.end(), fmt::format("RANK={}", d.rank)) == started.end();
  }
  const bool ownCrash = v.crash && v.crash->pid == recorder;
  if (v.supervision && !(launcherRecord && ownCrash)) {
    const auto& sv = *v.supervision;
    r.pid = sv.pid;
    r.timeNs = sv.endNs;
    r.classification = sv.classification;
    r.error = errorLine(sv.evidence);
    r.signal = sv.signal;
    r.runStartNs = sv.startNs;
    if (sv.stopped) {
      r.outcome = "stopped";
      r.how = fmt::format("stopped by crashcap run ({})", sv.signal ? sv.signalName : "exited");
    } else if (sv.signal) {
      r.outcome = isStopSignal(sv.signalName) ? "stopped" : "failed";
      r.how = "killed by " + sv.signalName;
    } else if (sv.exitCode != 0) {
      r.outcome = "failed";
      r.how = fmt::format("exit status {}", sv.exitCode);
    } else {
      r.outcome = "healthy";
      r.how = "exit status 0";
    }
  }
  if (v.crash) {
    const auto& c = *v.crash;
    if (r.outcome.empty()) r.outcome = c.signal && isStopSignal(c.signalName) ? "stopped" : "failed";
    // How the recorder saw it fail says more than the exit status that followed.
    if (c.signal && r.outcome == "failed") r.how = "killed by " + c.signalName;
    else if (c.signal && r.outcome == "stopped") {  // by a launcher that stops its ranks when one dies (torchrun)
      if (r.how.empty()) r.how = "stopped by " + c.signalName;
    } else if (c.kind == "exception") r.how = "raised";
    else if (c.kind == "nonfinite") r.how = "stopped by crashcap for a non-finite value";
    else if (c.kind == "terminate") r.how = "terminated (std::terminate)";
    else if (r.how.empty()) r.how = c.kind;
    if (r.classification.empty()) r.classification = classificationOf(c);
    // The recorder's own account of the error is the program's; the supervisor's evidence for a
    // stopped rank says why it was stopped, which the outcome already tells.
    if (!c.error.empty() && r.outcome != "stopped") r.error = errorLine(c.error);
    if (c.timeNs && !r.timeNs) r.timeNs = c.timeNs;  // crashcap run's clock, when there is one, is every rank's
    if (!r.pid) r.pid = c.pid;
    if (!r.signal) r.signal = c.signal;
    if (c.step >= 0) {
      r.step = c.step;
      r.phase = c.phase;
    }
    r.nonfiniteLoss = c.kind == "nonfinite" && c.error.rfind("non-finite loss", 0) == 0;
    if (auto line = formats::programFrame(c.stack)) r.pythonLine = *line;
    r.fromPeer = r.outcome == "failed" && isPeerError(c.error);
  }
  // A rank without an account of its own (SIGKILLed), under a launcher: the signal the launcher saw
  // it die of, when it said, not the launcher's exit; and no time, the launcher's end being no
  // rank's (it may notice a death seconds later).
  if (launcherRecord && !ownCrash) {
    r.timeNs = 0;
    if (auto said = launcherAccount(v.supervision->stderrTail + "\n" + v.supervision->evidence, recorder, d.rank)) {
      r.signal = said->signal;
      r.how = "killed by " + signalText(said->signal);
      r.outcome = isStopSignal(signalText(said->signal)) ? "stopped" : "failed";
      r.classification = "signal";
      r.error = said->line + " (the launcher's report)";
    }
  }
  if (r.outcome.empty()) {
    r.outcome = "healthy";
    r.how = "no failure recorded";
  }
  // A recorder killed before it could say (SIGKILL) left where it was in its run status.
  if (r.step < 0 && v.status && v.status->stepsBegun > 0 && v.status->lastStep >= 0) {
    r.step = v.status->lastStep;
    r.phase = v.status->lastPhase;
  }
  if (r.step < 0 && !v.stepBegins.empty()) r.step = v.stepBegins.back().step;
  // (A launcher's output holds every rank's: another's peer error is not this rank's.)
  if (!r.fromPeer && r.outcome == "failed" && v.supervision && !launcherRecord) r.fromPeer = isPeerError(v.supervision->stderrTail.substr(
      v.supervision->stderrTail.size() > 2048 ? v.supervision->stderrTail.size() - 2048 : 0));
  if (v.opTrace) {
    r.opTrace = true;
    r.collectivesIssued = v.opTrace->totalCollectives;
    if (!v.opTrace->collectives.empty()) r.lastCollective = v.opTrace->collectives.back();
    // The op that was running names where an error came from; a non-finite value is found at the
    // step's end, after ops that have nothing to do with it.
    if (r.step >= 0 && !(v.crash && v.crash->kind == "nonfinite"))
      for (auto it = v.opTrace->ops.rbegin(); it != v.opTrace->ops.rend(); ++it)
        if (it->step == r.step) {
          r.op = it->name;
          break;
        }
  }
  // A process killed before it could write its op trace (SIGKILL) left its newest op and
  // collective in its progress file, which seal put into its run status.
  if (!v.opTrace && v.status && (!v.status->lastOp.empty() || v.status->collectivesIssued)) {
    r.progressOps = true;
    if (r.op.empty() && r.step == v.status->lastStep) r.op = v.status->lastOp;
    r.collectivesIssued = v.status->collectivesIssued;
    if (r.collectivesIssued) {
      formats::CollectiveData c;
      c.seq = r.collectivesIssued - 1;
      c.name = v.status->lastCollective;
      c.step = v.status->lastCollectiveStep;
      r.lastCollective = c;
    }
  }
  for (const auto& k : v.keyframes) r.keyframes.push_back(k.step);
  for (const auto& b : v.stepBegins) r.steps.push_back(b.step);
  std::sort(r.steps.begin(), r.steps.end());
  r.lostSteps = formats::lostSteps(v);
  return r;
}

/// A rank the run log knows and no bundle does (it ended cleanly, or its bundle is elsewhere).
JobRank rankFromLog(const json& e) {
  JobRank r;
  r.rank = e.value("rank", -1);
  r.pid = e.value("pid", 0u);
  int signal = e.value("signal", 0), exitCode = e.value("exit_code", -1);
  r.signal = signal;
  r.classification = e.value("classification", "");
  r.bundle = e.value("bundle", "");
  if (e.value("stopped", false)) {
    r.outcome = "stopped";
    r.how = fmt::format("stopped by crashcap run ({})", signal ? signalText(signal) : "exited");
  } else if (signal) {
    r.outcome = "failed";
    r.how = "killed by " + signalText(signal);
  } else if (exitCode != 0) {
    r.outcome = "failed";
    r.how = fmt::format("exit status {}", exitCode);
  } else {
    r.outcome = "healthy";
    r.how = "exit status 0";
  }
  return r;
}

/// The rank that failed first; nullptr when none did.
const JobRank* firstToFail(const Job& job) {
  for (const auto& r : job.ranks)
    if (r.failedFirst) return &r;
  return nullptr;
}

std::string collectiveName(const formats::CollectiveData& c) {
  return fmt::format("#{} {}{}", c.seq, c.name, c.step >= 0 ? fmt::format(" (step {})", c.step) : " (between steps)");
}

/// Where a rank was: "at step 3 (forward, last op aten::linear)"; "after step 3 (between-steps)"
/// when it was past the step its phase names (formats::phaseInStep).
std::string whereText(const JobRank& r) {
  if (r.step < 0) return r.bundle.empty() ? "(no bundle: where it was is not known)" : "before any step";
  std::string in = r.phase.empty() ? "phase unknown" : r.phase;
  if (!r.op.empty()) in += ", last op " + r.op;
  return fmt::format("{} step {} ({})", formats::stepPreposition(r.phase), r.step, in);
}

/// What a rank's collectives say: the one it waits in, or the last it completed and what it never
/// issued that another rank did.
std::string collectiveStory(const JobRank& r, const Job& job) {
  if (!r.opTrace && !r.progressOps)
    return r.bundle.empty() ? "no bundle" : "its collectives were not recorded (nothing in the process could write them: "
                                             "SIGKILL, or no op trace)";
  if (!r.lastCollective) return "it issued no collective";
  const auto& c = *r.lastCollective;
  std::string s = r.progressOps ? fmt::format("the last collective it issued was {} (from its progress file: whether it "
                                              "ended is not known)",
                                              collectiveName(c))
                  : !inspect::collectiveEndObservable(c.name)
                      ? fmt::format("its last collective {} was issued (the GPU's completion of it is not observable)",
                                    collectiveName(c))
                  : c.endNs ? fmt::format("its last collective {} ended", collectiveName(c))
                            : fmt::format("waiting in collective {}", collectiveName(c));
  if (job.furthestCollective && job.furthestCollective->seq > c.seq) {
    const auto& f = *job.furthestCollective;
    s += fmt::format("; it never issued #{}{}", c.seq + 1, f.seq == c.seq + 1 ? " " + f.name : "");
  }
  return s;
}

}  // namespace

bool isPeerError(std::string e) {
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* words : {"connection closed by peer", "connection reset by peer", "broken pipe", "timed out",
                            "remote process exited", "socket timeout", "connection refused"})
    if (e.find(words) != std::string::npos) return true;
  return false;
}

JobStories readJobs(const std::string& dir) {
  RunDirListing listing = listRunDir(dir);
  JobStories out;
  out.dir = dir;
  out.unsealed = listing.unsealed;
  out.unreadable = listing.unreadable;
  const std::string root = fs::absolute(dir).string();
  std::map<std::string, size_t> byId;
  for (const auto& path : listing.bundles) {
    try {
      auto reader = formats::BundleReader::open(path);
      if (isJobArchive(*reader)) {
        out.archives.push_back(path);  // a whole job of its own, told by inspect FILE
        continue;
      }
      auto v = formats::readRecords(*reader);
      std::string jobId;
      int worldSize = 0;
      auto r = rankOf(path, *reader, v, jobId, worldSize);
      if (!reader->report().complete())
        out.unreadable.emplace_back(path, reader->report().summary() + (r ? " (read what survived)" : ""));
      if (!r) {
        out.notInJob.push_back(path);
        continue;
      }
      auto [it, fresh] = byId.emplace(jobId, out.jobs.size());
      if (fresh) {
        out.jobs.emplace_back();
        out.jobs.back().jobId = jobId;
        out.jobs.back().worldSize = worldSize;
        out.jobs.back().backend = r->backend;
      }
      Job& job = out.jobs[it->second];
      if (worldSize != job.worldSize)
        job.problems.push_back(fmt::format("{} says the world has {} ranks, an earlier bundle of the job says {}",
                                           fs::path(path).filename().string(), worldSize, job.worldSize));
      auto same = std::find_if(job.ranks.begin(), job.ranks.end(), [&](const JobRank& x) { return x.rank == r->rank; });
      if (same == job.ranks.end()) {
        job.ranks.push_back(std::move(*r));
      } else {
        // Two bundles of one rank: a crash the program recorded and went on from, then its end.
        // The newer tells how the rank ended.
        if (r->runStartNs && same->runStartNs && r->runStartNs != same->runStartNs)
          job.problems.push_back(fmt::format(
              "rank {} has bundles of different runs under one job id ({} and {}): the newest is told; keep each run's "
              "bundles in a directory of its own (a job id from a reused rendezvous address, or given to several runs)",
              r->rank, fs::path(same->bundle).filename().string(), fs::path(r->bundle).filename().string()));
        bool newer = r->timeNs > same->timeNs;
        std::string older = newer ? same->bundle : r->bundle;
        auto others = same->otherBundles;
        if (newer) *same = std::move(*r);
        same->otherBundles = others;
        same->otherBundles.push_back(older);
      }
    } catch (const Error& e) {
      out.unreadable.emplace_back(path, e.what());
    }
  }
  // The run log: ranks that ended cleanly left no bundle, and crashcap run saw which rank failed
  // first (its watch, not the clocks of the ranks' own records).
  std::set<std::string> noFailure;  // jobs whose run log says no rank failed
  for (const auto& log : listing.logs)
    for (const auto& line : readRunLog(log, root, out.unreadable)) {
      try {
        if (!line.contains("job_id") || !line["job_id"].is_string()) continue;
        auto it = byId.find(line["job_id"].get<std::string>());
        if (it == byId.end() || it->first.empty() || !line.contains("ranks") || !line["ranks"].is_array()) continue;
        Job& job = out.jobs[it->second];
        for (const auto& e : line["ranks"]) {
          if (!e.is_object()) continue;
          JobRank r = rankFromLog(e);
          if (r.rank < 0) continue;
          auto same = std::find_if(job.ranks.begin(), job.ranks.end(), [&](const JobRank& x) { return x.rank == r.rank; });
          if (same != job.ranks.end()) {
            // Its bundle holds a crash the program recorded and went on from: how it ended is the log's.
            if (r.outcome == "healthy" && same->outcome != "healthy") {
              same->outcome = "healthy";
              same->how = "exit status 0 (it recorded a failure and went on)";
            }
            continue;
          }
          if (!r.bundle.empty()) {
            job.problems.push_back(fmt::format("rank {}'s bundle {} is not in {}", r.rank, r.bundle, dir));
            r.bundle.clear();
          }
          job.ranks.push_back(std::move(r));
        }
        if (line.contains("first_failed_rank")) {
          if (line["first_failed_rank"].is_number_integer()) {
            job.firstFailed = line["first_failed_rank"].get<int>();
            noFailure.erase(job.jobId);
          } else if (line["first_failed_rank"].is_null()) {
            job.firstFailed = -1;
            noFailure.insert(job.jobId);
          }
        }
      } catch (const json::exception& e) {
        out.unreadable.emplace_back(fmt::format("{}:{}", log, line.value("_line", 0)), fmt::format("not a run log line crashcap wrote: {}", e.what()));
      }
    }
  for (auto& job : out.jobs) {
    std::sort(job.ranks.begin(), job.ranks.end(), [](const JobRank& a, const JobRank& b) { return a.rank < b.rank; });
    for (int r = 0; r < job.worldSize; ++r)
      if (std::none_of(job.ranks.begin(), job.ranks.end(), [&](const JobRank& x) { return x.rank == r; }))
        job.missing.push_back(r);
    // A non-finite gradient on a rank whose loss was finite came from another rank's through the
    // all-reduce.
    bool lossWentBad = std::any_of(job.ranks.begin(), job.ranks.end(), [](const JobRank& x) { return x.nonfiniteLoss; });
    for (auto& r : job.ranks)
      if (lossWentBad && !r.nonfiniteLoss && r.error.rfind("non-finite gradient", 0) == 0) r.fromPeer = true;
    // The rank that failed first is one that failed on its own: crashcap run's word for it when it
    // saw one (which rank's exit it noticed first), else the earliest by the ranks' end times (one
    // machine's clock).
    bool anyOwn = std::any_of(job.ranks.begin(), job.ranks.end(),
                              [](const JobRank& x) { return x.outcome == "failed" && !x.fromPeer; });
    auto candidate = [&](const JobRank& x) { return x.outcome == "failed" && (!anyOwn || !x.fromPeer); };
    bool known = std::any_of(job.ranks.begin(), job.ranks.end(),
                             [&](const JobRank& x) { return x.rank == job.firstFailed && candidate(x); });
    if (!known && !noFailure.count(job.jobId)) {
      job.firstFailed = -1;
      const JobRank* first = nullptr;
      for (const auto& r : job.ranks)
        if (candidate(r) && (!first || (r.timeNs && (!first->timeNs || r.timeNs < first->timeNs)))) first = &r;
      if (first) job.firstFailed = first->rank;
    }
    for (auto& r : job.ranks) {
      r.failedFirst = r.rank == job.firstFailed;
      if (r.lastCollective && (!job.furthestCollective || r.lastCollective->seq > job.furthestCollective->seq))
        job.furthestCollective = r.lastCollective;
    }
  }
  // The job whose failure is newest last: it is the one on the screen's bottom.
  auto failedAt = [](const Job& j) {
    const JobRank* first = firstToFail(j);
    return first ? first->timeNs : int64_t{0};
  };
  std::stable_sort(out.jobs.begin(), out.jobs.end(), [&](const Job& a, const Job& b) { return failedAt(a) < failedAt(b); });
  return out;
}

std::string jobHeadline(const Job& job) {
  const JobRank* first = firstToFail(job);
  std::string s;
  if (first) {
    s = fmt::format("rank {} failed first: {} {}", first->rank, first->how, whereText(*first));
    if (!first->error.empty() && first->how.rfind("killed by", 0) != 0) s += ": " + first->error;
  } else {
    s = "no rank failed";
  }
  for (const auto& r : job.ranks) {
    if (&r == first || r.outcome == "healthy") continue;
    s += fmt::format("; rank {} {} {}", r.rank,
                     r.outcome == "stopped" ? "was stopped" : r.fromPeer ? "failed from it" : "failed too,", whereText(r));
    if (r.opTrace || !r.bundle.empty()) s += ", " + collectiveStory(r, job);
  }
  return s;
}

namespace {

json rankJson(const JobRank& r, const Job& job, int64_t firstNs) {
  json last = r.lastCollective ? inspect::collectiveJson(*r.lastCollective) : json(nullptr);
  if (r.lastCollective && r.progressOps) {
    // From the progress file: its number, name and step; whether it ended, its thread and its
    // tensors are not known.
    last["ended"] = nullptr;
    last["thread"] = nullptr;
    last["inputs"] = nullptr;
    last["seconds"] = nullptr;
  }
  if (r.lastCollective) last["from_progress"] = r.progressOps;
  return {{"rank", r.rank},
          {"bundle", r.bundle.empty() ? json(nullptr) : json(r.bundle)},
          {"other_bundles", r.otherBundles},
          {"pid", r.pid},
          {"outcome", r.outcome},
          {"failed_first", r.failedFirst},
          {"from_peer", r.fromPeer},
          {"how", r.how},
          {"classification", r.classification},
          {"error", r.error},
          {"python_line", r.pythonLine.empty() ? json(nullptr) : json(r.pythonLine)},
          {"step", r.step >= 0 ? json(r.step) : json(nullptr)},
          {"phase", r.phase.empty() ? json(nullptr) : json(r.phase)},
          {"op", r.op.empty() ? json(nullptr) : json(r.op)},
          {"op_trace", r.opTrace},
          {"ops_from_progress", r.progressOps},
          {"collectives_issued", r.opTrace || r.progressOps ? json(r.collectivesIssued) : json(nullptr)},
          {"last_collective", last},
          {"collective_story", r.bundle.empty() && !r.opTrace ? "" : collectiveStory(r, job)},
          {"time", r.timeNs ? json(formats::formatTime(r.timeNs)) : json(nullptr)},
          {"seconds_after_first", firstNs && r.timeNs ? json(double(r.timeNs - firstNs) / 1e9) : json(nullptr)},
          {"keyframes", r.keyframes}};
}

}  // namespace

json jobsJson(const JobStories& stories) {
  json jobs = json::array();
  for (const auto& job : stories.jobs) {
    const JobRank* first = firstToFail(job);
    const int64_t firstNs = first ? first->timeNs : 0;
    json ranks = json::array(), healthy = json::array();
    for (const auto& r : job.ranks) {
      ranks.push_back(rankJson(r, job, firstNs));
      if (r.outcome == "healthy") healthy.push_back(r.rank);
    }
    json furthest = job.furthestCollective ? inspect::collectiveJson(*job.furthestCollective) : json(nullptr);
    jobs.push_back({{"job_id", job.jobId},
                    {"world_size", job.worldSize},
                    {"backend", job.backend},
                    {"first_failed", job.firstFailed >= 0 ? json(job.firstFailed) : json(nullptr)},
                    {"headline", jobHeadline(job)},
                    {"ranks", ranks},
                    {"healthy", healthy},
                    {"missing", job.missing},
                    {"furthest_collective", furthest},
                    {"problems", job.problems}});
  }
  json unreadable = json::array();
  for (const auto& [path, why] : stories.unreadable) unreadable.push_back({{"path", path}, {"why", why}});
  return {{"dir", stories.dir},
          {"jobs", jobs},
          {"not_in_a_job", stories.notInJob},
          {"unsealed", stories.unsealed},
          {"archives", stories.archives},
          {"unreadable", unreadable},
          {"archive", stories.archive.empty() ? json(nullptr) : json(stories.archive)}};
}

std::string jobsText(const JobStories& stories) {
  std::string s;
  auto name = [&](const std::string& path) {
    if (!stories.archive.empty()) return path;  // "ARCHIVE:member" already
    std::error_code ec;
    auto r = fs::relative(path, fs::absolute(stories.dir), ec);
    return ec || r.empty() ? path : r.string();
  };
  if (stories.jobs.empty()) {
    s += fmt::format("no multi-process job in {}: no bundle there has a distributed record{}\n", stories.dir,
                     stories.notInJob.empty() ? "" : fmt::format(" ({} bundle(s) of single processes: crashcap inspect "
                                                                 "BUNDLE tells each one's story)",
                                                                 stories.notInJob.size()));
  }
  if (stories.jobs.size() > 1)
    s += fmt::format("{} jobs in {}, kept apart by job id; the newest failure last\n\n", stories.jobs.size(), stories.dir);
  for (const auto& job : stories.jobs) {
    s += fmt::format("job        {}  {} rank{}, {}\n", job.jobId.empty() ? "(id not known)" : job.jobId, job.worldSize,
                     job.worldSize == 1 ? "" : "s", job.backend.empty() ? "backend not known" : job.backend);
    const JobRank* first = firstToFail(job);
    if (first) {
      s += fmt::format("FIRST      rank {} {} {}\n", first->rank, first->how, whereText(*first));
      if (!first->error.empty() && first->error != first->how) s += fmt::format("error      {}\n", first->error);
      if (!first->classification.empty()) s += fmt::format("class      {}\n", first->classification);
    } else {
      s += "FIRST      no rank failed\n";
    }
    s += "\n";
    for (const auto& r : job.ranks) {
      std::string when;
      if (first && &r != first && r.timeNs && first->timeNs) {
        double later = double(r.timeNs - first->timeNs) / 1e9;
        when = later >= 0.05    ? fmt::format(" {:.1f} s later", later)
               : later > -0.05 ? std::string(" at about the same time")
                               : fmt::format(" {:.1f} s earlier", -later);
      }
      s += fmt::format("rank {:<4}  {}{}{} {}\n", r.rank, r.failedFirst ? "failed first: " : "", r.how, when,
                       r.outcome == "healthy" && r.bundle.empty() ? std::string("(no bundle: it ended cleanly)") : whereText(r));
      if (&r != first && !r.error.empty() && r.outcome == "failed")
        s += fmt::format("           {}{}\n", r.error, r.fromPeer ? "  (another rank's failure reached it)" : "");
      if (!r.pythonLine.empty()) s += fmt::format("           in Python at {}\n", r.pythonLine);
      if (!r.bundle.empty() || r.opTrace) s += fmt::format("           {}\n", collectiveStory(r, job));
      if (!r.bundle.empty()) s += fmt::format("           {}\n", name(r.bundle));
    }
    for (int m : job.missing)
      s += fmt::format("rank {:<4}  MISSING: no bundle of it in {} and no run log line names it (was it recorded into "
                       "another directory, or did it never start?)\n",
                       m, stories.dir);
    std::string healthy;
    for (const auto& r : job.ranks)
      if (r.outcome == "healthy") healthy += (healthy.empty() ? "" : ", ") + std::to_string(r.rank);
    s += fmt::format("\nhealthy    {}\n", healthy.empty() ? "none" : "rank" + std::string(healthy.find(',') == std::string::npos ? " " : "s ") + healthy);
    for (const auto& p : job.problems) s += fmt::format("problem    {}\n", p);
    if (first && !first->bundle.empty() && !stories.archive.empty())
      s += fmt::format("next       crashcap replay {}   (every rank, from the archive)\n           crashcap triage {}\n",
                       stories.archive, stories.archive);
    else if (first && !first->bundle.empty())
      s += fmt::format("next       crashcap inspect {}\n           crashcap triage {}\n", first->bundle, first->bundle);
    s += "\n";
  }
  for (const auto& b : stories.notInJob) s += fmt::format("single     {} (no distributed record)\n", name(b));
  for (const auto& u : stories.unsealed)
    s += fmt::format("unsealed   {}: a recording nobody sealed; crashcap seal {}/{} adds it\n", u, stories.dir, u);
  for (const auto& a : stories.archives)
    s += fmt::format("archive    {}: a job merged into one file; crashcap inspect {} tells its story\n", name(a), a);
  for (const auto& [path, why] : stories.unreadable) s += fmt::format("unreadable {}: {}\n", name(path), why);
  return s;
}

}  // namespace crashcap::supervisor
