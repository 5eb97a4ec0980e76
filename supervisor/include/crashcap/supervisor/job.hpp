#pragma once
// `crashcap inspect DIR`: one story across the ranks of a multi-process job. Reads every bundle
// under DIR and the runs.jsonl lines `crashcap run` wrote there, puts the bundles that carry a
// distributed record together by job id (two jobs in one directory stay apart), and tells for
// each job which rank failed first (its step, phase and op), what every other rank was doing then
// (its step and phase, its last collective and whether that completed), which ranks were healthy
// and which are missing. No LibTorch here.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "crashcap/formats/records.hpp"

namespace crashcap::supervisor {

/// One rank of a job, from its bundle or, for a rank that ended cleanly, the run log.
struct JobRank {
  int rank = -1;
  std::string bundle;                   ///< "" when only the run log knows the rank
  std::vector<std::string> otherBundles;  ///< more bundles of the same rank (older ones)
  uint32_t pid = 0;
  /// "failed": it failed on its own (an error, a signal, a non-zero exit); "stopped": `crashcap
  /// run` stopped it after another rank failed; "healthy": it exited 0.
  std::string outcome;
  bool failedFirst = false;
  /// Its failure is one another rank's reached it through the collectives: a peer's connection
  /// closed or timed out, or a gradient made non-finite by an all-reduce with a rank whose loss
  /// was. Such a rank is never the one that failed first while a rank failed on its own.
  bool fromPeer = false;
  bool nonfiniteLoss = false;           ///< its recorder stopped it for a non-finite loss
  std::string how;                      ///< "killed by SIGKILL", "exit status 1", "raised", ...
  int signal = 0;                       ///< the signal that ended it; 0 none
  std::string classification;
  std::string error;                    ///< the error's own line
  int64_t step = -1;                    ///< the failing step, else the last step begun; -1 none
  std::string phase;                    ///< "" unknown
  std::string op;                       ///< the last op observed in `step`; "" unknown
  /// The program's Python line it was at when it failed or was stopped (its crash's stack: a
  /// signal's Python stack, an exception's traceback); "" unknown.
  std::string pythonLine;
  bool opTrace = false;                 ///< its op trace (ops and collectives) is in the bundle
  /// No op trace (a SIGKILL), but its progress file kept the newest op and the collectives issued
  /// (the last one's name and step; whether it ended is not known).
  bool progressOps = false;
  uint64_t collectivesIssued = 0;       ///< with opTrace or progressOps
  std::optional<formats::CollectiveData> lastCollective;
  int64_t timeNs = 0;                   ///< when it failed or ended (Unix ns; 0 unknown)
  int64_t runStartNs = 0;               ///< when the `crashcap run` attempt that started it began; 0 unknown
  std::vector<int64_t> keyframes;       ///< the keyframe steps its bundle holds
  std::vector<int64_t> steps;           ///< the steps its bundle holds (begun), ascending
  std::vector<int64_t> lostSteps;       ///< the steps its recording lost
  std::string backend;
};

struct Job {
  std::string jobId;                    ///< "" when the recordings did not know theirs
  int worldSize = 0;
  std::string backend;
  std::vector<JobRank> ranks;           ///< by rank
  std::vector<int> missing;             ///< ranks of the world no bundle and no log line names
  int firstFailed = -1;                 ///< the rank that failed first; -1 none failed
  /// The highest collective any rank issued, and the ranks that issued it: a rank that did not
  /// is the one the others wait for.
  std::optional<formats::CollectiveData> furthestCollective;
  std::vector<std::string> problems;    ///< disagreements between the ranks' records
};

struct JobStories {
  std::string dir;
  /// The job archive the stories were read from (crashcap merge; then `dir` names it too, and
  /// each bundle is "ARCHIVE:member"), "" for a directory.
  std::string archive;
  std::vector<Job> jobs;                ///< the job with the newest failure last
  std::vector<std::string> notInJob;    ///< bundles without a distributed record
  std::vector<std::string> unsealed;    ///< recording directories nobody sealed
  std::vector<std::string> archives;    ///< job archives in DIR (crashcap merge's): read with inspect FILE
  std::vector<std::pair<std::string, std::string>> unreadable;  ///< (path, why)
};

/// Whether `error` is what a rank sees when another rank of its job went away or stopped answering
/// (Gloo, NCCL, the TCP store: "Connection closed by peer", "timed out", ...).
bool isPeerError(std::string error);

/// Reads DIR as `crashcap summary` does (recursively; recording directories are listed, not
/// entered). Throws crashcap::Error{NotFound} when DIR is not a directory.
JobStories readJobs(const std::string& dir);

/// The headline of a job: "rank 1 failed first: killed by SIGKILL at step 3 (forward); rank 0 was
/// stopped at step 3 (forward), its last collective #4 gloo:all_reduce completed".
std::string jobHeadline(const Job& job);

/// Keys: dir, jobs [{job_id, world_size, backend, first_failed (rank or null), headline,
/// ranks [{rank, bundle, other_bundles, pid, outcome, failed_first, how, classification, error,
/// step, phase, op, op_trace, ops_from_progress, collectives_issued, last_collective, time, seconds_after_first,
/// keyframes, from_peer, collective_story}], healthy [ranks], missing [ranks], furthest_collective, problems}],
/// not_in_a_job, unsealed, archives, unreadable [{path, why}], archive (null for a directory).
nlohmann::json jobsJson(const JobStories& stories);
std::string jobsText(const JobStories& stories);

}  // namespace crashcap::supervisor
