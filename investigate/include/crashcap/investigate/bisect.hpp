#pragma once
// The bisections: which step, op, batch rows or setting the failure needs. Steps and ops replay
// in this process (they only read the bundle and compute); rows and settings are searched with
// one child-process replay per experiment (experiments.hpp), since any of them may crash.
// Each returns a typed result; results_json.hpp prints it and reads it back.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "crashcap/investigate/experiments.hpp"
#include "crashcap/replayer/replay.hpp"

namespace crashcap::investigate {

/// `bisect steps`: the retained history replayed from the earliest keyframe.
struct StepBisection {
  int64_t fromKeyframe = -1;
  int64_t target = -1;
  std::optional<replayer::FirstFailure> firstFailure;
  std::optional<int64_t> divergedAt;
  std::vector<int64_t> lostSteps;           ///< steps the recording lost: the replay stops before the first
  std::vector<replayer::StepReplay> steps;  ///< fromKeyframe..target (or the first lost step)
  /// Replays run: one, or more where the program died or hung again without answering and the
  /// failing step was searched for by replaying to earlier targets.
  int replays = 0;
};
StepBisection bisectSteps(const std::string& bundle, int64_t step = -1);

/// One replay of an op bisection, as the comparison needs it.
struct ReplaySide {
  replayer::Verdict verdict = replayer::Verdict::NotReproduced;
  std::string device, dtype;
  std::string error;                             ///< last line; "" when the step ran clean
  std::optional<replayer::ProbedOp> firstNonFiniteOp;
};

/// `bisect ops`: the first op whose output goes non-finite, and the first that departs from a
/// float64 CPU replay of the same step.
struct OpBisection {
  int64_t step = -1;
  ReplaySide replay, reference;                  ///< as recorded; float64 on the CPU
  std::optional<replayer::DepartingOp> firstDeparting;
  double tolerance = 0;
  uint64_t opsCompared = 0;
  std::string stoppedBecause;                    ///< "" or why the comparison stopped early
  /// The float64 reference fails the way the replay does: both go non-finite, or both raise the
  /// same error.
  bool referenceFailsTheSameWay() const;
  /// When the reference fails the same way: the dtype ("Float", "BFloat16") of its first
  /// non-finite output when it is narrower than float64. The step narrowed the widened values
  /// itself before or at that op (a `.float()`, autocast, a tensor it makes in float32), so the op
  /// did not run in float64. nullopt when the reference went non-finite in float64, or did not
  /// fail the same way.
  std::optional<std::string> referenceNarrowedTo() const;
  /// That op is the narrowing itself: a cast (`aten::to`) of finite values of a wider dtype to a
  /// non-finite narrower output (a `.float()` of values past float32's range). The narrower
  /// dtype's range is involved.
  bool referenceNarrowsPastRange() const;
  /// The reference fails the same way and its failure came in float64: the arithmetic itself, not
  /// float32 rounding or range.
  bool failsInFloat64() const { return referenceFailsTheSameWay() && !referenceNarrowedTo(); }
  /// The reference failed another way (a step that makes float32 tensors of its own meets the
  /// widened weights; a step before the target departed): it says nothing about precision.
  bool referenceFailedOtherwise() const { return !reference.error.empty() && !referenceFailsTheSameWay(); }
};
/// `keyframe` >= 0: both sides start from that keyframe (crashcap replay --keyframe), and no other
/// is tried; -1: from the one investigate::replay settles on.
OpBisection bisectOps(const std::string& bundle, int64_t step = -1, double tolerance = 1e-3, int64_t keyframe = -1);

/// One experiment of a row or setting search.
struct Trial {
  bool fails = false;          ///< the failure showed up (a killed child counts: another form of it)
  std::string outcome;         ///< "fails (<error>)", "passes", "timeout after 300 s", ...
  double seconds = 0;
  std::string command;         ///< the crashcap command that reruns it
  /// The replay ran and its step ended without any error: a pass that is evidence. A search that
  /// shrinks a set counts every non-failure as a pass (it only keeps what fails); a row is named
  /// a trigger only on this (not on a timeout, or on another error).
  bool passes = false;
  /// The replay ran and failed with another error than the recorded one ("RuntimeError: Expected
  /// hidden size (1, 4, 16), got [1, 8, 16]"); "" otherwise. Counted as a pass by the search.
  std::string otherFailure{};
};

/// Delta debugging over batch rows, on any predicate.
struct RowSearch {
  bool reproduced = false;                 ///< the whole batch fails
  std::vector<int64_t> rows;               ///< 1-minimal: removing any one of them makes it pass
  /// Of `rows` (when more than one), those without which the whole batch passes (Trial::passes):
  /// the rows that trigger the failure, where the others only let the step run (a batch norm needs
  /// two rows). Empty when rows has one row, and when none or every one of them is such a row
  /// (rows that fail only together are needed alike).
  std::vector<int64_t> triggers;
  int replays = 0;                         ///< experiments run
  std::vector<std::pair<std::vector<int64_t>, Trial>> log;
  /// Every part of the batch tried failed another way, with one error (Trial::otherFailure): the
  /// step cannot run on part of its batch (state carried from step to step with the batch's
  /// size), so no row can be told from another. The search stops there; rows is the whole batch.
  /// "" otherwise.
  std::string cutsFail;
  /// Rows that fail without `rows` (or its triggers): two corrupt samples, one sample the sampler
  /// drew twice. After the first set, the batch without every row named so far is tried, and while
  /// it fails as recorded, the smallest failing set of what is left is searched the same way (its
  /// rows all named: no triggers are told apart in it), up to kOtherSets sets.
  std::vector<std::vector<int64_t>> otherSets;
  /// The batch without every row named still failed after kOtherSets more sets: not all were searched.
  bool restFails = false;
};
inline constexpr size_t kOtherSets = 3;
/// Zeller's ddmin over the rows 0..batchSize-1: the smallest set of rows that still fails. For a
/// single culprit row it halves: at most 2*ceil(log2 B) + 2 experiments, and one more for the
/// batch without it (RowSearch::otherSets). A set of several rows is
/// then tested row by row against the whole batch (one experiment each) for its triggers. When the
/// first kCutsFailTrials parts all fail another way with one error, and so does the batch without
/// one row, it stops (RowSearch::cutsFail).
inline constexpr int kCutsFailTrials = 6;
RowSearch searchRows(int64_t batchSize, const std::function<Trial(const std::vector<int64_t>&)>& test);
/// 2*ceil(log2 max(B, 2)) + 3: the experiments a single culprit row costs at most.
int singleRowBound(int64_t batchSize);

/// `bisect samples`: the samples of the failing step's batch that the failure needs, named by
/// their row in the batch and, when the batch carried an `index` tensor, their dataset index.
struct SampleBisection {
  int64_t step = -1;
  int64_t batchSize = 0;
  bool reproduced = false;                       ///< the whole batch fails
  std::vector<int64_t> rows;                     ///< the smallest set that fails (RowSearch::rows)
  std::vector<int64_t> triggers;                 ///< RowSearch::triggers
  std::vector<std::vector<int64_t>> otherSets;   ///< RowSearch::otherSets
  bool restFails = false;                        ///< RowSearch::restFails
  /// The rows that cause the failure: the triggers when there are, else the smallest failing set;
  /// and the rows of the other sets that fail without them, in row order.
  std::vector<int64_t> culprits() const;
  std::optional<std::vector<int64_t>> datasetIndices;  ///< of culprits(), in their order
  /// How the batch's rows were matched to the sampler's samples (the whole batch's replay's
  /// RowOrder): the dataset indices above follow a collate function's reordering, or are in the
  /// sampler's order, unchecked. nullopt: the loader keeps the sampler's order.
  std::optional<replayer::RowOrder> rowOrder;
  int replays = 0;
  int replayBound = 0;                           ///< singleRowBound(batchSize)
  std::vector<int64_t> lostSteps;                ///< the recording lost these: the step cannot be reached
  std::vector<std::pair<std::vector<int64_t>, Trial>> trials;
  std::string cutsFail;                          ///< RowSearch::cutsFail
  /// Cut to fewer rows, the step failed this other way (the first search's RowSearch::cutsFail),
  /// so the rows were searched again in batches of the whole size (filledRows): `rows` and
  /// `triggers` come from that search, and `trials` holds both. "": each experiment kept only
  /// its rows.
  std::string filledBecause;
};
/// `keyframe` >= 0: every replay starts from that keyframe; -1: from the one the whole batch's
/// replay settles on (investigate::replay).
SampleBisection bisectSamples(const std::string& bundle, int64_t step, ExperimentRunner& runner, int64_t keyframe = -1);

/// The dataset indices of `rows` of step `step`'s batch, when the batch carried an index tensor
/// (formats::kDatasetIndexName); nullopt otherwise. The tensor holds them in the sampler's order;
/// `order`, from a plain replay of the step, says which row holds which when a collate function
/// reordered them (RowOrder::matched(); nullopt for a row it left open), and is otherwise the
/// sampler's order.
std::optional<std::vector<int64_t>> datasetIndices(const std::string& bundle, int64_t step,
                                                   const std::vector<int64_t>& rows,
                                                   const std::optional<replayer::RowOrder>& order = std::nullopt);

/// One replay under a changed setting or on another device.
struct ConfigTrial {
  std::string setting;                           ///< "" for a device trial
  std::string recorded, value;                   ///< the setting's recorded and tried values
  std::string device;                            ///< "" for a setting trial
  bool fails = false;
  std::string outcome;                           ///< the experiment's
  std::string error;                             ///< last line of the replay's error
  /// The change breaks the replay another way (a step throws another error, "step 4 throws:
  /// expected scalar type BFloat16 but found Float"): the trial says nothing about the recorded
  /// failure, and does not count as changing the outcome. "" otherwise.
  std::string otherFailure{};
  std::string command;
  double seconds = 0;
};

/// `bisect config`: the step under the recorded settings, then with each setting flipped and on
/// each other device here: which single change makes the failure come or go.
struct ConfigBisection {
  int64_t step = -1;
  struct Baseline {
    std::string device, recordedDevice;
    std::map<std::string, std::string> settings;
    /// The failing step fails (an error, a NaN/Inf), also when an earlier step departed from the
    /// recording: every trial replays from the same keyframe, so they are compared with it.
    bool fails = false;
    std::string error;                           ///< last line
    std::string command;
    /// The step before the failing one where this replay departs from the recording: the trials
    /// start from a state the training did not have.
    std::optional<int64_t> divergedAt;
  } baseline;
  /// Each flip changed its setting for the failing step alone, from the state the recorded
  /// settings give it (replay --set-at-target); false in results written before that. A device
  /// trial runs on its device from the keyframe on.
  bool flipsAtTarget = false;
  std::vector<ConfigTrial> flips, devices;
  /// Settings not flipped: they change only CUDA kernels and the baseline replays on the CPU, where
  /// a flip would replay the same bits again (replayer::settingActsOn). Empty in older results.
  std::vector<std::string> notTried;
  std::vector<std::string> changesOutcome;       ///< "cudnn.benchmark=false", "device=cuda:0"
  std::vector<Experiment> experiments;
};
/// `keyframe` >= 0: every replay starts from that keyframe; -1: from the one the baseline settles on.
ConfigBisection bisectConfig(const std::string& bundle, int64_t step, ExperimentRunner& runner, int64_t keyframe = -1);

/// The replay arguments every child experiment of a step shares. Uninstrumented (--no-instrument,
/// faster) unless `instrument`: then the replay's first non-finite op is read.
std::vector<std::string> replayArgs(const std::string& bundle, int64_t step, std::vector<std::string> extra,
                                    bool instrument = false);

/// `rows` repeated in turn to `batchSize` rows ({3, 5} in 5: {3, 5, 3, 5, 3}): a batch of the whole
/// size made of the kept rows only, for a step that cannot run on fewer.
std::vector<int64_t> filledRows(const std::vector<int64_t>& rows, int64_t batchSize);

/// `--keyframe K` when `r` started from an earlier keyframe than the newest because the newest's
/// replay departed (ReplayResult::skippedKeyframe), or when `asked` (its keyframe was given), else
/// nothing: the experiments that follow start where it did instead of finding that out again each.
std::vector<std::string> keyframeArgs(const replayer::ReplayResult& r, bool asked = false);

}  // namespace crashcap::investigate
