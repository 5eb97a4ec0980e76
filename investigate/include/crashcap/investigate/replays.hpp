#pragma once
// Replay of any bundle. A TorchScript recording replays in this process (replayer::replay); a
// setModel recording replays in its own program, which `crashcap` starts again from the recorded
// command line and working directory with a replay request (crashcap/replayer/program_replay.hpp)
// and whose answer it reads back. Every command that replays goes through here, so `replay`,
// `bisect` and `triage` treat both kinds alike.

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "crashcap/replayer/replay.hpp"

namespace crashcap::investigate {

/// The recorded program died of a signal while it replayed: the failure under test in another
/// form (a segfault where the recording saw an exception), as when an in-process replay dies.
/// SIGKILL is not one (something outside killed it, the OOM killer most likely): an Error.
/// `progress` is how far its replay had got (ReplayOptions::progressPath): the keyframe restored
/// and the step begun when it died.
class ProgramKilled : public std::runtime_error {
 public:
  ProgramKilled(int signal, const std::string& what, replayer::ReplayProgress progress = {})
      : std::runtime_error(what), signal_(signal), progress_(progress) {}
  int signal() const { return signal_; }
  const replayer::ReplayProgress& progress() const { return progress_; }

 private:
  int signal_;
  replayer::ReplayProgress progress_;
};

/// How a bundle replays: "in-process" (a TorchScript step program), "program" (setModel with a
/// step function: the recorded program serves the replay) or "job" (one rank of a multi-process
/// job: it replays with every rank of its job, replayJob). Throws Error{Unsupported} naming what
/// is missing when it cannot be replayed from the command line at all.
std::string replayRoute(const std::string& bundle);

/// From now on, every replay this process runs in a recorded program lets it run source files
/// that differ from the recorded ones (ReplayOptions::allowChangedSources): the CLI's
/// --allow-changed-source, which applies to every experiment of a bisection or triage.
void allowChangedSources(bool allow);
bool changedSourcesAllowed();

/// From now on, a replay that runs in a recorded program, or in the programs of a job's ranks, is
/// stopped when it has not ended `seconds` after it started (0, the default: no limit): the CLI's
/// `replay --timeout`. A program a replay waits for can hang where the training hung (a collective
/// no peer joins, a DataLoader worker that never answers); a job whose ranks all wait is ended by
/// nothing else. The stopped program is Error{LimitExceeded}; each stopped rank of a job says so.
void setReplayTimeout(double seconds);

/// Replays `bundle` by its route. Throws crashcap::Error as replayer::replay does (an error the
/// program hands back keeps its code and hint), Error{Unsupported} when the program cannot be
/// started or ends without an answer (its exit status and the last lines of its output say why),
/// and ProgramKilled. A rank of a job replays with its job (replayJob); the result is its own
/// rank's (askedRankReplay).
///
/// A replay that departs from the recording may have started from a keyframe that misses state
/// the program keeps between steps: a model outside the optimizer (an EMA teacher, a target
/// network), a counter of its own. The earliest keyframe holds that state as the program made it,
/// since a program started again makes it again up to there. When no keyframe was asked for, the
/// replay is tried again from the earliest one; when that runs the step where the first departed
/// as recorded and departs nowhere (runsFurther), it is the result, with the newer keyframe named
/// in ReplayResult::skippedKeyframe (keyframeToTryInstead says when it is tried).
replayer::ReplayResult replay(const std::string& bundle, const replayer::ReplayOptions& options);

/// The keyframe to try instead of the one `r`, a replay with `options`, started from: the earliest
/// in the bundle before it, when `r` departed from the recording, `options` asked for no keyframe,
/// and the bundle replays in its own program (replayRoute "program": a TorchScript step program
/// keeps no state of its own, a job's ranks keep the keyframe they all hold). nullopt otherwise.
std::optional<int64_t> keyframeToTryInstead(const std::string& bundle, const replayer::ReplayOptions& options,
                                            const replayer::ReplayResult& r);

/// `earlier`, a replay from an earlier keyframe than `newer`'s, ran the step where `newer` departed
/// from the recording bit for bit as recorded, and departs nowhere.
bool runsFurther(const replayer::ReplayResult& earlier, const replayer::ReplayResult& newer);

/// `first`, a result of `run(options)`, or the same run from the keyframe keyframeToTryInstead
/// names when its replay runsFurther than `first`'s (ReplayResult::skippedKeyframe then names the
/// keyframe given up). `replayOf` gives a result's replay. The run from the earlier keyframe may
/// fail any way (a lost step, a refusal, a program killed on the way): `first` then stands.
template <class Result, class Run, class ReplayOf>
Result fromEarlierKeyframeIfItRunsFurther(const std::string& bundle, const replayer::ReplayOptions& options,
                                          Result first, Run&& run, ReplayOf&& replayOf) {
  const replayer::ReplayResult& r = replayOf(first);
  const auto earlier = keyframeToTryInstead(bundle, options, r);
  if (!earlier) return first;
  replayer::ReplayOptions from = options;
  from.keyframe = *earlier;
  try {
    Result second = run(from);
    replayer::ReplayResult& e = replayOf(second);
    if (!runsFurther(e, r)) return first;  // the departure is not the keyframe's
    e.skippedKeyframe = replayer::ReplayResult::SkippedKeyframe{r.keyframe, *r.divergedAt};
    return second;
  } catch (const std::exception&) {
    return first;
  }
}

/// One rank's replay within its job's.
struct RankReplay {
  int rank = 0;
  std::string bundle;
  std::optional<replayer::ReplayResult> result;  ///< nullopt: it gave none, `error` says why
  std::string error;
  /// The result's verdict; without a result, "reproduced" when the replay died of the signal the
  /// recorded rank died of (a SIGKILL, a SIGSEGV: nothing in the process could answer) or hung
  /// again where crashcap run had stopped the recorded rank, else "".
  std::string verdict;
  /// Killed again: the step it had begun (its progress file), when it says.
  std::optional<int64_t> diedInStep;
  /// Stopped without an answer (a hang, again or not): the step it had begun, when it says.
  std::optional<int64_t> stoppedInStep;
};

/// The ranks of a multi-process job replayed together.
struct JobReplay {
  std::string jobId;
  int worldSize = 0;
  int rank = -1;          ///< the rank of the bundle asked for: the one ReplayOptions::rows cut
  int64_t step = -1;      ///< the target step, the same for every rank
  int64_t keyframe = -1;  ///< the keyframe every rank started from
  std::vector<RankReplay> ranks;  ///< by rank
  std::vector<std::string> notes;  ///< what bounds the replay (a step the bundle lacks), in words
};

/// Whether `bundle` is one rank of a job of several processes (its distributed record's world).
bool isJobRank(const std::string& bundle);

/// Replays the job `bundle` is a rank of: every rank's bundle from the same directory, each in its
/// recorded program started again on this machine with the launcher's variables (RANK,
/// WORLD_SIZE, MASTER_ADDR 127.0.0.1, a free MASTER_PORT), all from the newest keyframe they all
/// hold at or before the target step (options.step, else `bundle`'s crash step), in lockstep
/// through their collectives. A rank still running `hangSeconds` after another ended is stopped.
/// options.rows cut the batch of `bundle`'s own rank only (the experiment of a sample bisection
/// across ranks); every other rank feeds its whole batch. Throws Error{NotFound} naming the ranks
/// whose bundles are missing, or the keyframes each rank holds when they share none; a rank that
/// gives no result has its `error`.
JobReplay replayJob(const std::string& bundle, const replayer::ReplayOptions& options, double hangSeconds = 30);

/// The asked rank's replay within `job`, its notes prefixed by the job's and a line on how every
/// other rank ended. A rank reproduced without a result (it died of its recorded signal again, or
/// hung again) gives a result with that verdict, the job's step and keyframe and its error; a
/// rank that gave neither throws Error{Unsupported} with its error.
replayer::ReplayResult askedRankReplay(const JobReplay& job);

/// Where the failure of a job's rank came from, by the job's story (supervisor::readJobs over the
/// bundle's directory): `firstFailed` is the rank that failed on its own first (-1: none known, or
/// the first failure itself came from a peer), `firstFailedBundle` its bundle; `fromPeer`: the
/// asked rank's own failure reached it from a peer, or crashcap run stopped it after another failed.
struct JobRankOrigin {
  int rank = -1;
  int worldSize = 0;
  std::string jobId;
  int firstFailed = -1;
  std::string firstFailedBundle;
  bool fromPeer = false;
};
JobRankOrigin jobRankOrigin(const std::string& bundle);

/// replayer::compareWithReference by the bundle's route.
replayer::ReferenceComparison compareWithReference(const std::string& bundle, const replayer::ReplayOptions& options,
                                                   double tolerance);

}  // namespace crashcap::investigate
