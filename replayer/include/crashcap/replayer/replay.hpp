#pragma once
// crashcap::replayer — re-executes recorded training steps from a bundle: restores the newest
// keyframe before the target step, replays the steps after it with the recorded batches,
// generator states and learning rates, compares each step's fingerprints (loss, gradient
// norm) with the recording bit for bit, and runs the target step instrumented (each op's
// outputs checked for NaN/Inf) to name the first op whose output goes non-finite.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "crashcap/formats/error.hpp"

namespace crashcap::replayer {

/// What a replay concludes about the recorded failure at its target step.
enum class Verdict {
  ReproducedBitwise,  ///< the failure came back, and every replayed step equals the recording bit for bit
  Reproduced,         ///< the same class of failure came back; numbers or setup differ
  Diverged,           ///< a step before the target departs from the recording (nondeterminism)
  NotReproduced,      ///< the target step runs without the recorded failure
  /// The recording lost a step between the keyframe and the target (its records were dropped):
  /// replay stops before it, since every later step would start from the wrong state. Says
  /// nothing about the training; ReplayResult::lostSteps names the steps.
  RecordingIncomplete,
};
/// "reproduced-bitwise", "reproduced", "diverged", "not-reproduced", "recording-incomplete": the
/// CLI's and JSON's words.
const char* verdictName(Verdict verdict);
/// The inverse of verdictName; nullopt for any other text.
std::optional<Verdict> parseVerdict(const std::string& text);
/// Reproduced or ReproducedBitwise: the recorded failure showed up again.
inline bool reproduces(Verdict verdict) { return verdict == Verdict::ReproducedBitwise || verdict == Verdict::Reproduced; }

struct ReplayOptions {
  int64_t step = -1;             ///< target step; -1: the crash's step, else the last recorded
  bool instrument = true;        ///< per-op output checks on the target step
  /// "cpu", "cuda", "cuda:K"; "": the recorded device when this machine has it, else the CPU.
  std::string device;
  /// "": as recorded; "float64": parameters, optimizer state and floating batch tensors in
  /// double precision (the reference that ops bisection compares against).
  std::string dtype;
  /// Settings (formats/torch/settings.hpp names) that replace the recorded values, e.g.
  /// {"cudnn.benchmark", "false"}: the experiments of config bisection.
  std::map<std::string, std::string> settings;
  /// The `settings` apply to the target step alone: the steps from the keyframe to it run with the
  /// recorded values, so the target starts from the recording's state and only its own computation
  /// changes (config bisection's trials). False: from the keyframe on.
  bool settingsAtTarget = false;
  /// Keep only these rows of the target step's batch, each tensor cut along its row dimension
  /// (formats::batchRows): the experiment of a sample bisection. Empty: the whole batch.
  std::vector<int64_t> rows;
  /// Start from the earliest keyframe in the bundle instead of the newest before the step
  /// (step bisection: the whole retained history).
  bool fromEarliestKeyframe = false;
  /// Start from the keyframe of this step (-1: as above): the ranks of a job replay from one
  /// keyframe they all hold. NotFound when the bundle has none at that step.
  int64_t keyframe = -1;
  /// A program that replays itself (a Python training) may run even when its source files differ
  /// from the ones the recording hashed; without it, it refuses and names them.
  bool allowChangedSources = false;
  /// Materialise a keyframe at the target step: when every step from the replay's keyframe to the
  /// target replayed bit for bit as recorded, the state the target step starts from (weights,
  /// buffers, optimizer state, the program's documents) is written to this path as a bundle
  /// holding that one keyframe (`crashcap pack` puts it into the attachment). ReplayResult says
  /// whether it was written and, when not, why. "": none.
  std::string keyframeOut;
  /// A file the replay rewrites as it goes: "keyframe K" once the keyframe's state is restored,
  /// then "step S" as each step begins. A recorded program that dies without answering leaves in
  /// it how far its replay got (readReplayProgress). "": none.
  std::string progressPath;
};

/// What a ReplayOptions::progressPath file says: the keyframe the replay started from and the last
/// step it began (-1 for what it had not reached); nullopt when there is no such file.
struct ReplayProgress {
  int64_t keyframe = -1;
  int64_t step = -1;
};
std::optional<ReplayProgress> readReplayProgress(const std::string& path);

/// Summary statistics of one op input or output.
struct ValueStats {
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t nanCount = 0, infCount = 0;
  std::optional<double> min, max;  ///< over finite elements
};

/// An element of a CTC loss's batch whose target cannot be aligned with its input: a path through
/// its frames emits each label and a blank between two equal ones, so it needs `framesNeeded`
/// (the target's length plus its repeated neighbours) and has `inputLength`. Its loss is
/// infinite by definition (zero_infinity=True makes it 0), whatever the weights.
struct UnalignableTarget {
  int64_t element = 0;  ///< its place in the loss's batch
  int64_t targetLength = 0, framesNeeded = 0, inputLength = 0;
};

/// A mean with nothing to average, NaN (0/0) whatever the values: a negative log-likelihood
/// (cross_entropy's) with reduction='mean' none of whose targets counts, each being ignore_index
/// or of a class whose weight is 0 (`targets` may be 0 too); or a mean, or a loss's mean, over an
/// empty tensor (`empty`: a mask that selected nothing).
struct EmptyMean {
  bool empty = false;                   ///< over an empty tensor, not over targets that all weigh 0
  int64_t targets = 0;                  ///< the loss's targets
  int64_t ignored = 0;                  ///< of them, equal to ignore_index (the rest weigh 0 by class)
  std::optional<int64_t> ignoreIndex;   ///< the loss's, when it has one
  /// The op the step called with the empty tensor, when the NaN came from an op inside it (the
  /// division of mse_loss's mean); "" when the op itself was.
  std::string of;
};

/// An op of the target step that the replay singled out (the first whose output holds a NaN or
/// Inf, the one the step's error came out of), with its inputs' values as the op began and its
/// outputs'.
struct ProbedOp {
  std::string name;
  std::string phase;             ///< "forward" | "backward"
  /// In backward: the autograd node whose gradient the op computes ("SqrtBackward0": the gradient
  /// of the forward's sqrt); "" in forward, or when no node was under way.
  std::string node;
  int64_t seq = -1;              ///< autograd sequence number
  uint64_t index = 0;            ///< ops into the target step (counted as they end)
  /// Ops that had ended when it began: an op whose index is below it ran before it, one at or
  /// above it (up to its own index) inside it. 0 when not known (a result from before it was kept).
  uint64_t began = 0;
  std::vector<ValueStats> inputs, outputs;
  /// An op before it in the step wrote an infinity it was given (an attention mask's
  /// masked_fill(-inf)): infinities in its inputs may be the program's, not a finding.
  bool afterGivenInfinity = false;
  /// A CTC loss's elements whose targets need more frames than they have (UnalignableTarget).
  std::vector<UnalignableTarget> unalignable;
  /// Its NaN is the mean of nothing (EmptyMean).
  std::optional<EmptyMean> emptyMean;
};

struct StepReplay {
  int64_t step = 0;
  double loss = 0, gradNorm = 0;
  bool hasLoss = false;          ///< the step got as far as its loss (a step that threw before has none)
  bool hasGradNorm = false;
  bool recorded = false;         ///< the recording has this step's fingerprint
  double recordedLoss = 0, recordedGradNorm = 0;
  uint8_t recordedGradNormMethod = 0;   ///< formats::GradNormMethod of the recorded norm
  bool bitwise = false;          ///< loss and gradient norm equal the recording bit for bit
  /// The program drew the step's batch and trained on none of it, here as when it was recorded
  /// (it left its loop with `break`, or skipped the batch): no fingerprint on either side, and
  /// nothing that differs, so it counts as bit for bit.
  bool untrained = false;
  std::string error;             ///< the step threw
  double learningRate = 0;       ///< of the first parameter group
  /// Total 2-norm of the weights after this step's update; only for a step before the target
  /// that completed its optimizer step (the target stops before it, a step that threw has none).
  std::optional<double> weightNorm;
  bool weightsFinite = true;     ///< every weight finite after the update (steps before the target)
  /// The target step of a driven replay whose recorded failure is a non-finite loss that its
  /// first backward() did not see (DrivenReplay::endStep): the first later backward() whose loss
  /// is non-finite, counted from 1 (2: the step's second), and its loss. 0: none was.
  int32_t laterBackward = 0;
  double laterLoss = 0;
};

/// The first replayed step that fails: it throws, or its loss, gradient norm or (after the
/// update) weights are NaN/Inf. nullopt when none does.
struct FirstFailure {
  int64_t step = -1;
  std::string reason;            ///< "error" | "loss" | "grad_norm" | "weights"
};
std::optional<FirstFailure> firstFailure(const std::vector<StepReplay>& steps);

/// The first op of the target step whose output departs from the float64 reference beyond
/// the tolerance (ops bisection). Ops are matched by position among the step's outermost ops
/// (those the program or an autograd node calls directly), which are the same in both dtypes.
struct DepartingOp {
  std::string name;
  std::string phase;             ///< "forward" | "backward"
  uint64_t index = 0;            ///< among the step's outermost ops
  double error = 0;              ///< max |replay - reference| / max |reference|
  int64_t elements = 0;          ///< elements beyond the tolerance (or non-finite in one only)
  ValueStats replayed, reference;
};

/// A sample of a batch that failed to load, which fails on its own (BatchLoad::culprits).
struct LoadCulprit {
  int64_t position = -1;      ///< its place in the batch (the sampler's order)
  int64_t index = -1;         ///< into the loader's dataset
  int64_t datasetIndex = -1;  ///< in the data under any Subset
  std::string error;          ///< what loading it raised, as the program would print it
};

/// A crash while the training's DataLoader loaded the batch after the target step (crash phase
/// "loading", which names the step before it): that batch loaded again by the program, from its
/// recorded indices, with its own dataset and collate function.
struct BatchLoad {
  std::vector<int64_t> indices, datasetIndices;  ///< as the sampler drew them (Crash.loadingIndices)
  std::string error;                             ///< what loading it raised here ("" none)
  /// The samples that fail: those that raise when loaded alone; else those that raise when
  /// collated alone; else those the rest collate without and not with. Empty: none found.
  std::vector<LoadCulprit> culprits;
  std::string culpritsBy;  ///< "loaded alone" | "collated alone" | "collated with the rest" | ""
  /// The culprits were searched: a plain replay of the recorded setup does (not an experiment
  /// under other settings, device or dtype, nor a step bisection's or a pack's replay).
  bool searched = false;
};

/// Which sample each row of the target step's batch is. The batch's `index` tensor holds the
/// dataset indices in the order the sampler drew them, which is the rows' order unless the
/// program's collate function reorders the samples (sorting them by length to pack sequences). A
/// plain replay in the program loads the samples again, collates each alone and finds the row that
/// holds it. Absent: the batch has no `index` tensor, the loader collates with default_collate
/// (which keeps the order), or the replay was not a plain one of the whole batch.
struct RowOrder {
  /// "sampler": each row holds the sample the sampler drew at its place; "reordered": the collate
  /// function put the samples in another order, and datasetIndices says which row holds which;
  /// "partial": reordered, and some rows match several samples alike in every tensor compared
  /// (`why`), whose datasetIndices are -1; "unchecked": the samples could not be matched to the
  /// rows (`why`), so the rows are named in the sampler's order, which may not be theirs.
  std::string order;
  std::vector<int64_t> datasetIndices;  ///< of each row ("sampler", "reordered", "partial")
  std::string why;                      ///< "partial", "unchecked": the reason
  bool checked() const { return order == "sampler" || order == "reordered"; }
  /// The rows were matched, all or some: datasetIndices names them, not the sampler's order.
  bool matched() const { return checked() || order == "partial"; }
};

struct ReplayResult {
  Verdict verdict = Verdict::NotReproduced;
  int64_t step = -1;             ///< target
  int64_t keyframe = -1;         ///< replay started from this keyframe
  std::string recordedError;     ///< what the recording says happened at the target
  std::string error;             ///< what replay saw at the target ("" when it ran clean)
  std::optional<int64_t> divergedAt;
  /// A recorded program that died of a signal while it replayed, so that no step came back
  /// (`steps` is empty): the step it had begun when it died (its progress file), when it says.
  std::optional<int64_t> diedInStep;
  /// A rank of a job stopped without an answer while it replayed (a hang, again or not), so that no
  /// step came back: the step it had begun when it was stopped (its progress file), when it says.
  std::optional<int64_t> stoppedInStep;
  /// The first op of the target step whose output holds a NaN or Inf. Infinities the program means
  /// are not one: an op that writes an infinity it was given (masked_fill(mask, -inf), an attention
  /// mask), and after one, an op that only passes infinities on (no NaN, infinite inputs).
  std::optional<ProbedOp> firstNonFiniteOp;
  /// The outermost op of the target step whose call the step's error came out of (no outputs);
  /// nullopt when the step raised none, or raised it outside an op.
  std::optional<ProbedOp> raisingOp;
  std::vector<StepReplay> steps;
  double loadMs = 0, replayMs = 0;
  int threads = 0;
  std::string device;            ///< where it ran ("cpu", "cuda:0")
  std::string recordedDevice;    ///< where the recording ran ("" unknown)
  std::string dtype;             ///< "as-recorded" | "float64" | "float64 (target step)"
  std::map<std::string, std::string> settings;          ///< the settings replay ran under
  /// `settings` ran at the target step alone; the steps before it ran with `recordedSettings`
  /// (ReplayOptions::settingsAtTarget).
  bool settingsAtTarget = false;
  std::map<std::string, std::string> recordedSettings;  ///< the recording's
  /// Device, dtype and settings equal the recording's, so fingerprints are compared bit for
  /// bit and a departure is `diverged`. Otherwise only the failure itself is compared.
  bool sameSetup = true;
  int64_t batchSize = 0;         ///< rows (samples) of the target step's batch (formats::batchRows)
  std::vector<int64_t> rows;     ///< the batch rows the target step kept (ReplayOptions::rows); empty: all
  /// Steps from the keyframe to the target that the recording lost (Verdict::RecordingIncomplete).
  std::vector<int64_t> lostSteps;
  /// What differs from the recording beyond device, dtype and settings, in words: another torch
  /// version, changed source files. Each makes the setup not the recorded one.
  std::vector<std::string> notes;
  /// ReplayOptions::keyframeOut: the step of the keyframe written, or why none was.
  std::optional<int64_t> keyframeWritten;
  std::string keyframeNotWritten;
  /// A loading crash's replay: the batch that never came, loaded again after the target step. Its
  /// error, when it raised one, is the target step's `error` (the crash record's step too).
  std::optional<BatchLoad> batchLoad;
  /// The target step's rows matched to the samples the sampler drew (RowOrder).
  std::optional<RowOrder> rowOrder;
  /// The newer keyframe this replay was tried from first and gave up (investigate::replay): its
  /// replay departed from the recording at `divergedAt`, where this one, from an earlier keyframe,
  /// ran on as recorded. That keyframe does not hold all the state the program keeps between
  /// steps (a model outside the optimizer, a counter of its own).
  struct SkippedKeyframe {
    int64_t step = -1;
    int64_t divergedAt = -1;
  };
  std::optional<SkippedKeyframe> skippedKeyframe;
};

/// The errors name the same failure: their last lines (the exception's own, after any traceback)
/// are equal once numbers and hex addresses are taken out ("Target 7 is out of bounds." and
/// "Target 12 is out of bounds." are one failure; an IndexError and a ValueError, or two different
/// messages, are two). A DataLoader worker's death is one failure in whichever words the loader
/// raised it ("is killed by signal: …" or "exited unexpectedly"), unless both texts say how the
/// worker ended and the two differ (a segmentation fault and a bus error are two). A replay of the
/// recorded setup reproduces an error only with the same failure.
bool sameFailure(const std::string& replayed, const std::string& recorded);

/// The replay shows a failure: it reproduces the recording (reproduces(verdict)) at a step where
/// something failed. A replay of a step the recording saw pass, which passes again, reproduces the
/// recording but shows no failure: what a replay of a bundle whose failing step was lost (a
/// SIGKILL before the writer had it) gives. Every investigation's "the step fails" is this.
inline bool showsFailure(const ReplayResult& r) { return reproduces(r.verdict) && !r.error.empty(); }

/// A crash while the DataLoader loaded the batch after the target step (`crashPhase` "loading")
/// that this replay could not load again (an IterableDataset's batch: no indices to load its
/// samples by): nothing that could bring the error back ran, so "not reproduced" is no finding.
/// An error of the replayed step's own is a finding, and does not count.
inline bool loadNotRepeated(const ReplayResult& r, std::string_view crashPhase) {
  return crashPhase == "loading" && r.verdict == Verdict::NotReproduced && !r.batchLoad && r.error.empty();
}

/// Replays `bundle`. Throws crashcap::Error (NotFound: no such step or keyframe; Unsupported:
/// the bundle has no step program, or the device is not available here).
ReplayResult replay(const std::string& bundle, const ReplayOptions& options = {});

/// Ops bisection against a float64 reference: replays up to the target step on the CPU as
/// recorded and runs the target step in float64 from that state; then replays as `options`
/// say, comparing each outermost op's output of the target step; `firstDeparting` is the first op
/// whose normalised error exceeds `tolerance` or whose output is non-finite in one replay only.
struct ReferenceComparison {
  ReplayResult replay, reference;
  uint64_t opsCompared = 0;
  std::optional<DepartingOp> firstDeparting;
  std::string stoppedBecause;    ///< "" or why the comparison stopped early (op sequences differ)
  double tolerance = 0;
};
ReferenceComparison compareWithReference(const std::string& bundle, ReplayOptions options, double tolerance = 1e-3);

/// Which part of an ops bisection one replay performs. The engine's own loop runs both sides in one
/// process. A program that drives its own loop (driven_replay.hpp) runs that loop once per
/// process, so there the float64 reference and the replay compared with it are two replays in two
/// processes, the reference's op outputs handed from one to the other in a file.
enum class ComparisonSide { Both, Reference, Replay };
/// "both", "reference", "replay"; the inverse throws Error{Corrupt} on any other text.
const char* comparisonSideName(ComparisonSide side);
ComparisonSide parseComparisonSide(const std::string& text);

/// Devices replay can run on here: "cpu", each "cuda:K", and the fault-injection hook's fake
/// devices (tests only).
std::vector<std::string> availableDevices();

/// Whether changing `setting` can change what a replay on `device` computes: not on the CPU for a
/// setting that changes only CUDA kernels (cudnn.*, TF32), unless the fault-injection hook
/// (testing/) conditions a fault on it, which it tests on any device.
bool settingActsOn(const std::string& setting, const std::string& device);

/// The error for a bundle with no step program record, saying why it has none: a Python training
/// recorded from outside without a DataLoader records no steps; otherwise how to record one.
/// `pythonCapture`: the environment's python.capture fact ("" for a C++ recording);
/// `observedLoader`: its python.observed.loader fact.
Error noStepProgram(const std::string& bundle, const std::string& pythonCapture, const std::string& observedLoader);

}  // namespace crashcap::replayer
