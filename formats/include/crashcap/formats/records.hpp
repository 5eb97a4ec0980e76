#pragma once
// The recorder's record kinds (the CRASHCAP_RECORDER_RECORD rows of record_types.def) as
// plain structs, with their encoders and checked decoders, a bundle's recorder records decoded
// (BundleRecords), and the fixed tensor paths they refer to. No LibTorch: the CLI, `inspect` and
// the replayer read these without it.

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/layout.hpp"
#include "crashcap/formats/limits.hpp"

namespace crashcap::formats {

class BundleWriter;

/// A named number (optimizer options, scalar optimizer state).
using NumberEntry = std::pair<std::string, double>;

/// Type 5: the TorchScript step program; its archive is the uint8 tensor named `archive`.
/// A source file of a Python program (StepProgram.sources).
struct SourceFileData {
  std::string path;
  std::string sha256;
  uint64_t bytes = 0;
  std::string tensor;                   ///< "" when not kept
};

struct StepProgramData {
  std::string format = "torchscript";
  std::vector<std::string> inputs;      ///< forward's batch arguments, in order
  std::vector<std::string> parameters;  ///< trainable parameters, module order
  std::vector<std::string> buffers;     ///< buffers, module order
  std::string archive = "program/torchscript";
  std::string device;                   ///< the parameters' device: "cpu", "cuda:0"; "" unknown
  /// Format "module": the recording's own program replays it (it gave the Recorder its step
  /// function), re-run from the environment record's command line and working directory.
  bool servesReplay = false;
  std::vector<SourceFileData> sources;  ///< format "python": the program's own source files
};

struct ParamGroupData {
  std::vector<std::string> parameters;
  std::vector<NumberEntry> options;     ///< "lr", "momentum", "beta1", ...
  /// The option named `key`, or `fallback` when absent.
  double option(const std::string& key, double fallback) const;
};

/// Type 6: optimizer and recipe.
struct OptimizerSpecData {
  std::string kind;                     ///< "sgd" | "adam" | "adamw" | "rmsprop" | "adagrad" | "unknown"
  std::vector<ParamGroupData> groups;
  double gradClipNorm = 0;              ///< 0 = no clipping
  double gradClipNormType = 2;
};

/// Type 7: a step began; its batch and generator states precede this record.
struct StepBeginData {
  int64_t step = 0;
  std::vector<std::string> batch;       ///< tensor names
  std::vector<std::string> rng;         ///< tensor names
  std::vector<double> learningRates;    ///< per parameter group
  int64_t timeNs = 0;
  int64_t keyframe = -1;                ///< newest keyframe at or before this step
  /// The step the process began before this one: -1 none (the first), -2 unknown (an older
  /// bundle). A previous step the bundle lacks, inside its retained window, was lost.
  int64_t previousStep = -2;
  std::string structure;                ///< how the batch nests (JSON); "" flat
  /// Per batch tensor (parallel to `batch`): the dimension that holds the batch's rows (its
  /// samples), -1 none. Empty in a bundle written before it: rowDimensionsOf falls back.
  std::vector<int8_t> rowDims;
  /// The step begins with gradients earlier steps accumulated (no optimizer update since their
  /// backward): a keyframe at it would not hold them. False when not known.
  bool accumulating = false;
};

/// The row dimension of each of a step's batch tensors, given their shapes, for the recorder.
/// `rows`: the batch's sample count when the training's loader says it (a sampler's batch of
/// indices), -1 when not: then a tensor's rows are its dimension 0 when that equals the first
/// shaped tensor's dimension 0. With a count, a tensor's rows are dimension 0 when its size is
/// the count, else dimension 1 (a sequence-first batch: time, then samples) unless dimension 0 is
/// 1 (a [1, N] tensor is one row broadcast over the batch: position ids), else none. When both
/// have the count (a sequence-first batch whose time steps happen to be as many as its samples),
/// `before` decides: the tensor's row dimension at an earlier step where it was not in doubt
/// (parallel to `shapes`, -1 none known: then dimension 0).
std::vector<int8_t> rowDimensions(const std::vector<std::vector<int64_t>>& shapes, int64_t rows,
                                  const std::vector<int8_t>& before = {});
/// Whether rowDimensions had to choose between `shape`'s first two dimensions for `rows`.
bool rowDimensionInDoubt(const std::vector<int64_t>& shape, int64_t rows);

/// A step's batch seen by its rows: each tensor's row dimension (-1 none) and the row count
/// (0 when no tensor has rows).
struct BatchRows {
  std::vector<int> dims;  ///< parallel to the StepBegin's batch
  int64_t count = 0;
};
/// The rows of `begin`'s batch, whose tensors have `shapes` (parallel to begin.batch): its
/// recorded row dimensions, or for a bundle that has none, the rule of rowDimensions(shapes, -1).
/// Row dimensions that do not fit a shape (a damaged record) count as none.
BatchRows batchRows(const StepBeginData& begin, const std::vector<std::vector<int64_t>>& shapes);
/// The same, with the shapes of the tensors `reader` holds (one it lacks has none).
BatchRows batchRows(const StepBeginData& begin, const BundleReader& reader);

/// Type 8: a step's fingerprints.
/// How a step's gradient norm was computed (formats/torch/fingerprint.hpp).
enum class GradNormMethod : uint8_t {
  ForeachNorm = 0,  ///< at::_foreach_norm, then the norm of the norms
  Blocked = 1,      ///< float32 squares in fixed blocks and lanes, summed in double
};

struct StepEndData {
  int64_t step = 0;
  double loss = 0;
  double gradNorm = 0;
  bool hasGradNorm = false;
  bool nonFinite = false;
  int64_t durationNs = 0;
  GradNormMethod gradNormMethod = GradNormMethod::ForeachNorm;
  /// Per parameter group, as the optimizer held them at end(loss), for the update, when the
  /// program set them after beginStep; empty: the step's begin learningRates (see updateLearningRates()).
  std::vector<double> updateLearningRates;
};

/// The learning rates a step's update used: those at its end(loss) when the program changed them
/// after the step began, else those at its begin. `end` may be null (the step did not end).
const std::vector<double>& updateLearningRates(const StepBeginData& begin, const StepEndData* end);

/// Type 9: a full pre-step snapshot; its tensors precede this record.
struct KeyframeData {
  int64_t step = 0;
  std::vector<std::string> parameters, buffers, optimizerState;  ///< tensor names
  std::vector<NumberEntry> optimizerScalars;                     ///< "<parameter>/step"
  std::vector<std::string> documents;   ///< uint8 tensors holding JSON (keyframes/<step>/documents/<name>)
};

struct OpInputData {
  std::string dtype;                    ///< "float32", ...; "scalar", "none", "other" for non-tensors
  std::vector<int64_t> shape;
};

struct OpData {
  uint64_t index = 0;
  std::string name;
  std::string phase;                    ///< "forward" | "backward"
  int64_t sequenceNr = -1;
  int64_t step = -1;
  uint64_t thread = 0;
  std::vector<OpInputData> inputs;
  int64_t startNs = 0, endNs = 0;       ///< CLOCK_MONOTONIC; 0 unknown
};

/// A collective the process issued to its torch.distributed backend (bundle.capnp: Collective).
struct CollectiveData {
  uint64_t seq = 0;                     ///< n-th collective since recording began, from 0
  std::string name;                     ///< "gloo:all_reduce"
  int64_t step = -1;
  uint64_t thread = 0;
  std::vector<OpInputData> inputs;
  int64_t startNs = 0, endNs = 0;       ///< CLOCK_MONOTONIC; endNs 0: not completed
};

/// Type 10: the last ops before a crash, oldest first, and the last collectives.
struct OpTraceData {
  std::vector<OpData> ops;
  uint64_t totalOps = 0;
  uint32_t capacity = 0;
  std::vector<CollectiveData> collectives;
  uint64_t totalCollectives = 0;
  /// The last calls of ops that declare an index domain (declaresIndexDomain) older than `ops`'
  /// oldest, oldest first: what triage judges a batch's integers against, kept beyond the ring.
  std::vector<OpData> indexOps;
};

/// Whether an op of this name takes an index input with a domain triage can read from its input
/// shapes: an embedding's table rows ("aten::embedding", "aten::embedding_bag"), a classification
/// loss's classes ("aten::nll_loss*", "aten::cross_entropy_loss"), the positions a gather or a
/// scatter indexes ("aten::gather", "aten::scatter*", "aten::take_along_dim"); not their
/// backwards. Cheap enough for every op the recorder observes.
bool declaresIndexDomain(const char* name);

/// Type 11: how the recorded process failed.
struct CrashData {
  std::string kind;                     ///< "exception" | "terminate" | "signal" | "nonfinite"
  int64_t step = -1;
  std::string phase;  ///< "setup" | "forward" | "backward" | "optimizer" | "between-steps" | "loading" (phaseInStep)
  std::string error;
  std::string errorType;
  int32_t signal = 0;
  std::string signalName;
  std::vector<std::string> stack;       ///< innermost frame first
  int64_t timeNs = 0;
  uint32_t pid = 0;
  uint64_t thread = 0;
  /// Phase "loading": the batch that never came, as the loader's sampler drew it (empty: unknown).
  std::vector<int64_t> loadingIndices;         ///< into the loader's own dataset
  std::vector<int64_t> loadingDatasetIndices;  ///< the same samples in the data under any Subset
  /// A crash between steps while the program held a batch of a DataLoader other than the
  /// training's (a validation pass's): that loader's number (-1 none) and its batch as it was at
  /// the crash, named batchTensorName(kCrashBatchStep, ...), nested and with rows as a step's
  /// (StepBeginData::structure, rowDims; otherBatchBegin).
  int32_t otherLoader = -1;
  std::vector<std::string> otherBatch;
  std::string otherStructure;
  std::vector<int8_t> otherRowDims;
};

/// At most this many indices of a batch that failed to load are kept.
inline constexpr size_t kMaxLoadingIndices = size_t{1} << 20;

/// Type 12: the recorder's own health.
struct RunStatusData {
  std::string state;                    ///< "finished" | "crashed" | "interrupted"
  uint64_t stepsBegun = 0;
  int64_t lastStep = -1;
  uint64_t droppedRecords = 0;
  uint64_t droppedBytes = 0;
  std::vector<std::string> warnings;
  uint64_t segmentsDeleted = 0;
  std::vector<int64_t> lostSteps;       ///< steps whose records were dropped, ascending (the first 4096)
  uint64_t lostStepCount = 0;           ///< all of them
  uint64_t keyframesSkipped = 0;        ///< keyframes not taken: the writer was still writing the last
  std::string lastPhase;                ///< where in lastStep the run was ("" unknown)
  int64_t keyframeInterval = 0;         ///< steps between keyframes at the end; 0 unknown
  uint64_t bufferPoolPeakBytes = 0;     ///< the most host memory the recorder's copies held
  uint64_t keyframesWrittenRaw = 0;     ///< keyframes finished uncompressed: the writer fell behind
  /// From the progress file, for a process that could not write its op trace (a SIGKILL): the
  /// newest op it began, how many collectives it issued and the last one's name and step.
  std::string lastOp;                   ///< "" unknown
  uint64_t collectivesIssued = 0;       ///< 0: none, or unknown
  std::string lastCollective;           ///< "" none
  int64_t lastCollectiveStep = -1;      ///< -1: between steps, or unknown
};
/// The most lost steps a run_status record lists.
inline constexpr size_t kMaxListedLostSteps = 4096;

/// Type 13: what `crashcap run` saw of one run of the supervised command.
struct SupervisionData {
  std::vector<std::string> command;     ///< argv, secrets redacted
  uint32_t attempt = 1;
  uint32_t pid = 0;
  int32_t exitCode = -1;                ///< -1 when a signal ended it
  int32_t signal = 0;
  std::string signalName;
  std::string classification;
  std::string evidence;
  std::string stdoutTail, stderrTail;
  int64_t startNs = 0, endNs = 0;
  std::string trace;                    ///< "recorded: ..." | "unavailable: <reason>"
  bool interrupted = false;
  std::vector<std::string> environment; ///< NAME=VALUE set for the child
  std::string cudnnLogTail;             ///< `--cudnn-log`: the last bytes of cuDNN's API log
  /// "NAME=VALUE": the run's hyperparameters (its command line's options and what the program
  /// declared through crashcap.hyperparameters), which `crashcap summary` compares across runs.
  std::vector<std::string> params;
  /// `crashcap run --nproc` stopped this rank after another rank of its job failed.
  bool stopped = false;
};

/// Type 16: one rank of a multi-process job (torch.distributed, c10d). All ranks' recordings
/// of one job carry the same jobId.
struct DistributedData {
  std::string jobId;
  std::string jobIdSource;   ///< "crashcap run", "torchelastic", "rendezvous", "program"
  int32_t rank = 0;
  int32_t worldSize = 1;
  int32_t localRank = -1;    ///< -1: not known
  std::string backend;       ///< "gloo", "nccl", ...; "" not known
  std::string rendezvous;    ///< "tcp://HOST:PORT", "file://PATH", "env://HOST:PORT"
  std::string source;        ///< "environment", "torch.distributed", "c10d", "program"
};

/// One CUPTI activity, converted (recorder/cupti/). Names are resolved from the record's
/// string table.
struct TraceActivityData {
  enum class Kind : uint8_t { Kernel, Memcpy, Memset, Runtime, Driver, Overhead };
  Kind kind = Kind::Kernel;
  std::string name;                     ///< kernel symbol, API function, copy direction, ...
  uint64_t startNs = 0, endNs = 0;      ///< tracer clock
  uint32_t deviceId = 0, contextId = 0, streamId = 0, correlationId = 0;
  int64_t opIndex = -1;                 ///< the ATen op that launched it (external correlation)
  int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
  uint64_t bytes = 0;
  int32_t returnCode = 0;
  uint32_t threadId = 0;
};
/// "kernel", "memcpy", ...
const char* activityKindName(TraceActivityData::Kind kind);

/// One kernel launch as the host thread made it (the callback API): the evidence that
/// survives an asynchronous error.
struct KernelLaunchData {
  uint64_t index = 0;
  std::string symbol, api;
  int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
  uint64_t stream = 0;
  uint32_t correlationId = 0;
  uint64_t timeNs = 0;                  ///< tracer clock
  uint32_t threadId = 0;
  int32_t returnCode = -1;              ///< -1: the call had not returned
  int64_t opIndex = -1;
};

/// The first CUDA API call that returned an error.
struct ApiErrorData {
  std::string domain, api;              ///< "runtime" | "driver"; "cudaLaunchKernel"
  int32_t code = 0;
  std::string name;                     ///< "cudaErrorIllegalInstruction"; "" unknown
  uint32_t correlationId = 0;
  uint64_t timeNs = 0;
  uint32_t threadId = 0;
  std::string symbol;                   ///< the kernel, for a launch
  int64_t opIndex = -1;
};

/// Type 14: one process's kernel trace (bundle.capnp states the invariants).
struct KernelTraceData {
  std::string status;                   ///< "recorded" | "unavailable: <reason>"
  uint32_t pid = 0;
  std::vector<TraceActivityData> activities;  ///< oldest first
  std::vector<KernelLaunchData> launches;     ///< oldest first
  std::optional<ApiErrorData> firstError;   ///< the first call that returned an error, of any kind
  /// The first call whose error poisons the context: firstError itself, or a later call when
  /// firstError was soft (an allocation failure the caching allocator recovered from).
  std::optional<ApiErrorData> stickyError;
  uint64_t totalActivities = 0, droppedActivities = 0, totalLaunches = 0;
  int64_t clockOffsetNs = 0;            ///< CLOCK_MONOTONIC = tracer + offset
  uint32_t cuptiVersion = 0;
  uint64_t truncatedNames = 0;
  bool available() const { return status == "recorded"; }
};
/// The longest name a kernel trace keeps; longer ones are cut (and counted).
inline constexpr size_t kMaxTraceNameBytes = 4096;

// Encoders: the meta bytes for BundleWriter::writeRecord. Decoders throw Error{Corrupt}
// naming the invariant that failed (texts bounded, steps >= 0, names valid tensor names).
std::vector<uint8_t> encodeMeta(const StepProgramData& v);
std::vector<uint8_t> encodeMeta(const OptimizerSpecData& v);
std::vector<uint8_t> encodeMeta(const StepBeginData& v);
std::vector<uint8_t> encodeMeta(const StepEndData& v);
std::vector<uint8_t> encodeMeta(const KeyframeData& v);
std::vector<uint8_t> encodeMeta(const OpTraceData& v);
std::vector<uint8_t> encodeMeta(const CrashData& v);
std::vector<uint8_t> encodeMeta(const RunStatusData& v);
std::vector<uint8_t> encodeMeta(const SupervisionData& v);
std::vector<uint8_t> encodeMeta(const DistributedData& v);
std::vector<uint8_t> encodeMeta(const EnvironmentData& v);
/// Interns names into the string table; a trace too large for one meta (1 MiB) loses its
/// oldest activities, then its oldest launches, and counts them as dropped.
std::vector<uint8_t> encodeMeta(const KernelTraceData& v);

StepProgramData decodeStepProgram(const std::vector<uint8_t>& meta, const ReaderLimits& limits = {});
OptimizerSpecData decodeOptimizerSpec(const std::vector<uint8_t>& meta, const ReaderLimits& limits = {});
StepBeginData decodeStepBegin(const std::vector<uint8_t>& meta, const ReaderLimits& limits = {});
StepEndData decodeStepEnd(const std::vector<uint8_t>& meta, const ReaderLimits& limits = {});
KeyframeData decodeKeyframe(const std::vector<uint8_t>& meta, const ReaderLimits& limits = {});
OpTraceData decodeOpTrace(const std::vector<uint8_t>& meta, const ReaderLimits& limits = {});
CrashData decodeCrash(const std::vector<uint8_t>& meta, const ReaderLimits& limits = {});
RunStatusData decodeRunStatus(const std::vector<uint8_t>& meta, const ReaderLimits& limits = {});
SupervisionData decodeSupervision(const std::vector<uint8_t>& meta, const ReaderLimits& limits = {});
DistributedData decodeDistributed(const std::vector<uint8_t>& meta, const ReaderLimits& limits = {});
KernelTraceData decodeKernelTrace(const std::vector<uint8_t>& meta, const ReaderLimits& limits = {});

/// The record type each struct is written as: one overload per recorder row of the record table.
#define CRASHCAP_RECORDER_RECORD(number, Enum, name, Data, decoder, keep, member) \
  inline RecordType recordTypeOf(const Data&) { return RecordType::Enum; }
#include "crashcap/formats/record_types.def"
/// The environment fingerprint, a record the reader interprets itself (BundleReader::environment).
inline RecordType recordTypeOf(const EnvironmentData&) { return RecordType::Environment; }

/// Writes one recorder record (recorder records have no body).
template <typename T>
uint64_t writeMetaRecord(BundleWriter& writer, const T& value, const std::vector<uint8_t>& body = {});

/// Decodes the meta of any recorder record type, throwing Error{Corrupt} when it breaks an
/// invariant; does nothing for other types. For verify and scans.
void validateRecorderMeta(uint16_t type, const uint8_t* meta, size_t size, const ReaderLimits& limits);

/// True for the record types this header describes (the recorder rows of record_types.def).
bool isRecorderRecord(uint16_t type);

// Tensor paths (see bundle.capnp).
std::string batchTensorName(int64_t step, const std::string& name);
/// The step number of a batch no step took: another loader's, kept at a crash between steps
/// (CrashData::otherBatch). Its tensors are "crash/batch/<name>".
inline constexpr int64_t kCrashBatchStep = -1;
/// The crash's other-loader batch as the step_begin of step kCrashBatchStep (batch, structure,
/// row dimensions; no generator states), so that what reads a step's batch reads it alike;
/// nullopt when the crash holds none.
std::optional<StepBeginData> otherBatchBegin(const CrashData& crash);
/// A batch tensor of this name (integer, [B]) maps the batch's rows to dataset indices: sample
/// bisection reports culprits by both. A TorchScript replay does not feed it to the program
/// unless the program names it as an input.
inline constexpr const char* kDatasetIndexName = "index";
std::string rngTensorName(int64_t step, const std::string& device);
/// `part` is "parameters", "buffers" or "optimizer".
std::string keyframeTensorName(int64_t step, const std::string& part, const std::string& name);

/// Which of several records of one type BundleRecords keeps (the `keep` column of the table).
enum class KeepPolicy { First, Last, All };

/// The BundleRecords member type for a record kept by `keep`: one value or all of them.
template <typename Data, KeepPolicy keep>
using RecordsSlot = std::conditional_t<keep == KeepPolicy::All, std::vector<Data>, std::optional<Data>>;

/// Everything the recorder wrote into one bundle, decoded, in file order. One member per
/// recorder row of record_types.def: its `member` column names it and its `keep` column says
/// whether it holds the first, the last or all such records (e.g. `crash`: the first;
/// `status`: the last; `kernelTraces`: all, in file order). Damaged recorder records are
/// skipped and described in `problems`.
struct BundleRecords {
#define CRASHCAP_RECORDER_RECORD(number, Enum, name, Data, decoder, keep, member) \
  RecordsSlot<Data, KeepPolicy::keep> member;
#include "crashcap/formats/record_types.def"
  std::vector<std::string> problems;
};

/// Reads every recorder record of `reader`.
BundleRecords readRecords(const BundleReader& reader);

/// The steps the recording lost, ascending: those the run status lists (the writer could not
/// queue them), a previous step (StepBeginData::previousStep) at or after the earliest retained
/// keyframe that has no step_begin, and a keyframe's own step, the crash's step or the run
/// status's last step without one. Steps before the
/// earliest keyframe were deleted by the retention budget, not lost.
std::vector<int64_t> lostSteps(const BundleRecords& records);

/// The step a process was in when it ended without its recorder saying why — SIGKILL, the
/// kernel's OOM killer: no crash record, and a run status never closed ("interrupted") — from the
/// run status, which outlives the process. nullopt when a crash record says what happened, when
/// the run ended cleanly, or when it had begun no step.
std::optional<int64_t> killedInStep(const BundleRecords& records);

/// Whether a crash or run status phase lies inside a step (forward, backward, the optimizer, or a
/// phase not known). Not "setup", "between-steps" (validation, logging, a signal while the loader
/// waits) and "loading" (the DataLoader raised while it loaded the next batch): the step a crash
/// then names is the one before, which completed, and its ops are not the failure's.
bool phaseInStep(const std::string& phase);

/// The word that places a crash of this phase against its step: "at" step N inside it (or a phase
/// not known), "after" step N when the step named is the one before, which completed (phaseInStep).
const char* stepPreposition(const std::string& phase);

/// The step the process failed in, which began but never completed: the crash record's step, else
/// killedInStep, when its phase is in a step (phaseInStep). nullopt when the process failed
/// between steps, while loading, in its set-up, or did not fail.
std::optional<int64_t> failedInStep(const BundleRecords& records);

}  // namespace crashcap::formats
