#pragma once
// crashcap::recorder::Recorder — the flight recorder a training loop calls. It records, per
// step, the batch, the generator states and the learning rates before the step runs, and the
// loss and gradient norm after backward; every K steps a keyframe (weights, buffers,
// optimizer state); a ring of the last ATen ops; and, when the process fails (exception,
// std::terminate, fatal signal, non-finite loss), a crash record, after which it seals
// <outputDir>/crash-<time>-<pid>.ccap. The disk work happens on a background thread; a full disk
// degrades the recording and never the training.
//
//   crashcap::recorder::Recorder rec("runs/crashes");
//   rec.setProgram(module, {"image", "label"});     // the TorchScript step program, or
//   // rec.setModel(*net); rec.setStep([&](const auto& b) { return loss_of(net, b); });
//   rec.setOptimizer(optimizer);
//   for (int64_t step = 0; step < steps; ++step) {
//     auto guard = rec.beginStep(step, {{"image", image}, {"label", label}});
//     optimizer.zero_grad();
//     auto loss = module.forward({image, label}).toTensor();
//     loss.backward();
//     guard.end(loss);         // fingerprints; throws NonFiniteError on a NaN/Inf loss
//     optimizer.step();
//   }
//
// One Recorder per process at a time (the crash guard is process-wide).

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crashcap/formats/records.hpp"

namespace torch {
template <typename Key, typename Value>
class OrderedDict;
}
namespace torch::nn {
class Module;
}
namespace torch::jit {
struct Module;
}
namespace torch::optim {
class Optimizer;
}

namespace crashcap::recorder {

enum class NonFinitePolicy {
  Raise,   ///< end(loss) throws NonFiniteError: the step fails before the optimizer runs
  Record,  ///< only recorded in the step's fingerprint
};

/// What the recorder keeps and how hard it tries. Defaults suit a long run on one machine.
struct Policy {
  /// keyframeEvery's value for a cadence the recorder chooses from what keyframes cost.
  static constexpr int64_t kKeyframeEveryAuto = 0;
  /// Steps between keyframes (>= 1), or kKeyframeEveryAuto (the default): at least
  /// kAutoKeyframeEveryMin, and as many more as keep a keyframe's cost under keyframeBudget of the
  /// step time and the writer within its pace (docs/RECORDING.md, "Keyframe cadence"). Every
  /// step's batch is kept whatever the cadence.
  int64_t keyframeEvery = kKeyframeEveryAuto;
  static constexpr int64_t kAutoKeyframeEveryMin = 50;
  /// With the automatic cadence: the share of the training's time keyframes may cost (the copy
  /// on the training thread, and the writer's time on one of the machine's cores).
  double keyframeBudget = 0.01;
  size_t retainSegments = 4;            ///< keep at most this many segments (one per keyframe); 0 = all
  /// And at most this many bytes of recording on disk (run.ccap and the segments, the one being
  /// written included; 0 = no limit): the oldest segment is deleted as soon as the growing one
  /// crosses it. The two newest segments always stay, so that the window starts at a keyframe
  /// and holds the steps before the newest one; the automatic cadence keeps two within it.
  uint64_t retainBytes = 8ull << 30;
  size_t opTraceDepth = 256;            ///< ops kept in the ring; 0 turns the op observer off
  /// Trace CUDA kernels with CUPTI (crashcap::cupti) and put the trace into crash bundles;
  /// without a GPU the bundle says why there is none. Off when libcrashcap_inject.so already
  /// traces the process (`crashcap run`): its trace file goes into the bundle instead.
  bool kernelTrace = true;
  NonFinitePolicy nonFinite = NonFinitePolicy::Raise;
  /// What lets the training go on past a non-finite step, in the words of the API that made the
  /// recorder (the Python package's option, crashcap run's flag): the NonFiniteError says it.
  std::string nonFiniteGoOn = "NonFinitePolicy::Record";
  bool checkGradients = true;           ///< a non-finite gradient norm is non-finite too
  int zstdLevel = 1;                    ///< 0 stores raw
  /// compressionThreads's value for: chosen by the keyframe's size (compressionThreadsFor).
  static constexpr unsigned kCompressionThreadsAuto = ~0u;
  /// A keyframe of at least this many bytes is compressed by threads under kCompressionThreadsAuto.
  static constexpr uint64_t kAutoCompressionMinBytes = 64ull << 20;
  /// Threads that compress a segment's tensors while the writer thread writes; 0 = the writer
  /// thread compresses alone. kCompressionThreadsAuto (the default): one per core (at most 8)
  /// for a segment whose keyframe is kAutoCompressionMinBytes or more, else 0. The work is the
  /// same either way; threads finish a large keyframe sooner, so the next one can come sooner.
  unsigned compressionThreads = kCompressionThreadsAuto;
  /// When the writer falls behind while writing a keyframe (the steps waiting behind it fill half
  /// of queueBytes, or the next keyframe came due and was skipped) and the rates it measured say
  /// that raw bytes reach the disk sooner than zstd makes them smaller, the rest of that keyframe
  /// is stored raw: larger on disk, but no step is dropped and the next keyframe comes sooner.
  /// Counted in RecorderStats::keyframesWrittenRaw (docs/RECORDING.md, "When the writer falls behind").
  bool rawWhenBehind = true;
  /// What compressionThreads means for a segment whose keyframe holds `keyframeBytes`.
  static unsigned compressionThreadsFor(unsigned setting, uint64_t keyframeBytes) {
    if (setting != kCompressionThreadsAuto) return setting;
    if (keyframeBytes < kAutoCompressionMinBytes) return 0;
    // Asked once: the cadence asks at every step, and the answer can cost a file read.
    static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    return std::min(8u, cores);
  }
  /// The writer's queue budget, once for steps and once for keyframes. Step records (batches,
  /// generator states, fingerprints) beyond it are dropped and the step is counted as lost; a
  /// keyframe beyond it is skipped and tried again at the next step, and the step is kept. An
  /// empty lane takes one item of any size, so a keyframe larger than the budget is still
  /// recorded. The step program's archive (once per run) is always taken. Memory held by the
  /// queue: up to queueBytes of steps plus queueBytes (or one larger keyframe) of keyframes.
  uint64_t queueBytes = 512ull << 20;
  /// Host memory kept idle between keyframes for the next keyframe's copies, beyond the
  /// queueBytes the batches' copies may keep: a keyframe copied into memory the last one used
  /// costs a memcpy, one copied into fresh memory several times that (every page is faulted in,
  /// and unmapped again after the write). 0 (the default): one keyframe's worth, at most a quarter
  /// of the machine's memory; a state larger than that is said in one warning.
  uint64_t keyframePoolBytes = 0;
  uint64_t syncEveryBytes = 64ull << 20;  ///< fdatasync cadence of the writer thread
  double crashDrainSeconds = 10;        ///< how long the crash path may spend draining
  bool crashGuard = true;               ///< install signal and std::terminate handlers
  bool allEnvironmentVariables = false; ///< record every variable (secret values still redacted)
  bool quiet = false;                   ///< no messages on stderr (tests)
};

/// How replay steps the optimizer: zero_grad -> forward -> backward -> [clip] -> step.
struct Recipe {
  double gradClipNorm = 0;              ///< max total gradient norm; 0 = no clipping
  double gradClipNormType = 2;
};

/// Named batch tensors, in the step program's input order.
using Batch = std::vector<std::pair<std::string, at::Tensor>>;

/// The forward and loss of one step of a setModel training, for a batch named as beginStep was
/// given it; backward, clipping and the optimizer step are the recipe's. The same type as
/// crashcap::replayer::StepFunction.
using StepFunction = std::function<at::Tensor(const std::map<std::string, at::Tensor>& batch)>;

/// Named tensors, as setModel takes them.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// What a keyframe holds of a foreign training beyond its weights and buffers.
struct ForeignKeyframe {
  /// The optimizer's state tensors, named "<parameter>/<key>" (keyframes/<step>/optimizer/...).
  NamedTensors optimizerState;
  /// JSON documents of state that is not tensors, by name: "optimizer" (a state_dict with its
  /// tensors referred to by name), "scheduler", "grad_scaler" (keyframes/<step>/documents/<name>).
  std::vector<std::pair<std::string, std::string>> documents;
};

/// A training the recorder cannot see into, a Python one (the crashcap Python package is its
/// front end): its optimizer is not a torch::optim::Optimizer, its generators are more than
/// LibTorch's, and it replays itself. The callbacks run on the training thread, inside
/// beginStep; one that throws is reported in one warning and what it would have given is left
/// out, the training goes on.
struct ForeignTraining {
  std::string format = "python";                  ///< StepProgram.format
  /// The program's own source files and their bytes (kept in the bundle as uint8 tensors
  /// program/sources/<path>; an empty `contents` keeps only the hash).
  std::vector<std::pair<formats::SourceFileData, std::string>> sources;
  formats::OptimizerSpecData optimizer;           ///< parameter groups by parameter name
  std::function<std::vector<double>()> learningRates;   ///< per group, at every step
  std::function<NamedTensors()> generators;       ///< per step, beyond LibTorch's: "python", "numpy"
  std::function<ForeignKeyframe(int64_t step)> keyframe;
  /// The program's own stack, innermost frame first, for a crash the recorder itself detects
  /// (a non-finite loss): the Python frames, where the native ones say little.
  std::function<std::vector<std::string>()> stack;
  /// Facts for the environment record: "python.executable", "python.version", "python.torch_version".
  /// One the recorder captures itself is replaced: "process.cwd", the directory the program started
  /// in (replay runs it there), which the recorder, made later, may not see (an os.chdir before).
  std::vector<std::pair<std::string, std::string>> facts;
  /// Opt-in: the step as a TorchScript archive (torch.jit.save of a module that takes the batch's
  /// tensors in order and returns the loss, and whose parameters and buffers are setModel's, by
  /// their names). The program is then recorded as "torchscript", with the first batch's tensor
  /// names as its inputs, and replays in crashcap without the training's language; the optimizer
  /// spec must be one LibTorch has. Empty: the program replays itself.
  std::string torchScript;
};

/// A failure described by a front end that is not C++ (a Python exception and its traceback).
struct Failure {
  std::string kind = "exception";               ///< Crash.kind
  std::string errorType;                        ///< "ValueError", "torch.cuda.OutOfMemoryError"
  std::string error;                            ///< the text as the program would print it
  std::vector<std::string> stack;               ///< innermost first
  std::string phase;                            ///< Crash.phase; "" for the phase the step is in
  /// Phase "loading": the batch that never came, as its sampler drew it, in the loader's dataset
  /// and in the data under any Subset, place by place (Crash.loadingIndices; empty: unknown).
  std::vector<int64_t> loadingIndices, loadingDatasetIndices;
  /// A crash between steps while the program held a batch of a DataLoader other than the
  /// training's (a validation pass's): that loader's number (-1 none), its batch with its nesting
  /// and number of samples (-1 unknown), as beginStep takes them. Copied at the crash into
  /// crash/batch/<name> (Crash.otherBatch); CPU tensors only (a device's may be unreadable after
  /// its error).
  int32_t otherLoader = -1;
  Batch otherBatch;
  std::string otherStructure;
  int64_t otherRows = -1;
};

/// Thrown by StepGuard::end when the loss (or the gradient norm) is NaN or Inf under
/// NonFinitePolicy::Raise.
class NonFiniteError : public std::runtime_error {
 public:
  NonFiniteError(int64_t step, std::string what) : std::runtime_error(std::move(what)), step_(step) {}
  int64_t step() const { return step_; }

 private:
  int64_t step_;
};

struct RecorderStats {
  uint64_t stepsBegun = 0;
  uint64_t keyframes = 0;
  uint64_t droppedRecords = 0;          ///< records that could not be written (queue or disk full)
  uint64_t droppedBytes = 0;
  uint64_t segmentsDeleted = 0;         ///< by the retention budget
  uint64_t recordingPeakBytes = 0;      ///< the most the recording's files (run.ccap, segments) held at once
  /// Steps whose records could not be queued (the writer was behind on steps): replay cannot
  /// cross them, and says so. The first formats::kMaxListedLostSteps; lostStepCount counts all.
  std::vector<int64_t> lostSteps;
  uint64_t lostStepCount = 0;
  /// Keyframes not taken because the last one was still being written (each is tried again at
  /// the next step; the steps themselves are kept).
  uint64_t keyframesSkipped = 0;
  /// Keyframes whose rest the writer stored uncompressed because it had fallen behind
  /// (Policy::rawWhenBehind).
  uint64_t keyframesWrittenRaw = 0;
  /// Steps between keyframes now: Policy::keyframeEvery, or what the automatic cadence chose.
  int64_t keyframeInterval = 0;
  /// What the automatic cadence would choose from the same measurements (with a fixed cadence too).
  int64_t autoKeyframeInterval = 0;
  /// What the last keyframe cost: its copy on the training thread, and the writer's time for it
  /// (0 until one is written).
  double keyframeCopySeconds = 0, keyframeWriteSeconds = 0;
  uint64_t keyframeBytes = 0;           ///< the last keyframe's tensors, uncompressed
  unsigned keyframeCopyThreads = 0;     ///< threads its copy used (every core for a large state)
  double stepSeconds = 0;               ///< the training's step time, a moving average
  int64_t writtenThrough = -1;          ///< newest step whose batch reached the OS
  /// Host memory the recorder's copies hold: reused buffers, in the writer's queue or idle
  /// (at most queueBytes plus Policy::keyframePoolBytes idle).
  uint64_t bufferPoolBytes = 0;
  uint64_t bufferPoolPeakBytes = 0;     ///< the most they held at once
  bool degraded = false;                ///< a write failed; see warnings
  bool recording = false;               ///< false when the directory could not be used at all
  std::vector<std::string> warnings;
};

class Recorder;

/// One step in flight. Destroyed normally: the step is complete. Destroyed while an
/// exception unwinds: the step failed; the crash is recorded with its step and phase (pass
/// the exception to Recorder::fail to keep its text). Move-only.
class StepGuard {
 public:
  StepGuard(StepGuard&& other) noexcept;
  StepGuard& operator=(StepGuard&&) = delete;
  ~StepGuard();

  /// Call after loss.backward() and before optimizer.step(): records the loss and the
  /// gradient norm (no host-device synchronisation: device values are read when they are
  /// ready) and applies the non-finite policy. Throws NonFiniteError.
  void end(const at::Tensor& loss);
  int64_t step() const { return step_; }

 private:
  friend class Recorder;
  StepGuard(Recorder* recorder, int64_t step);
  Recorder* recorder_;
  int64_t step_;
  int uncaught_;
  bool ended_ = false;
};

class Recorder {
 public:
  /// Starts a recording in the output directory `outputDir` (created if needed): the recording is
  /// the directory <outputDir>/recording-<time>-<pid>/ (recordingDir()), and crash bundles land in
  /// <outputDir> itself. An empty `outputDir` means $CRASHCAP_DIR, which `crashcap run` sets for
  /// the command it supervises. When the directory cannot be used the training still runs:
  /// stats().recording is false and one warning says why.
  explicit Recorder(std::string outputDir, Policy policy = {});
  ~Recorder();  ///< close()
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  /// The TorchScript step program; `inputs` name forward's batch arguments in order. Its
  /// parameters and buffers are what keyframes hold. The module is shared, not copied.
  void setProgram(const torch::jit::Module& module, std::vector<std::string> inputs);
  /// Without a step program (a torch::nn::Module): the named tensors keyframes hold, as the
  /// module gives them (named_parameters(), named_buffers()), the module itself, or a list.
  /// They must be the tensors the optimizer updates (setOptimizer checks), not copies.
  void setModel(const torch::nn::Module& module);
  void setModel(const torch::OrderedDict<std::string, at::Tensor>& parameters,
                const torch::OrderedDict<std::string, at::Tensor>& buffers);
  void setModel(std::vector<std::pair<std::string, at::Tensor>> parameters,
                std::vector<std::pair<std::string, at::Tensor>> buffers);
  /// With setModel: the step's forward and loss, which lets `crashcap replay`, `bisect` and
  /// `triage` replay the recording from the command line. They run this program again, with its
  /// recorded command line and working directory, in replay mode: there the Recorder records
  /// nothing, and the call that completes setModel + setStep (whichever comes second) replays the
  /// requested steps with this function, hands the result to crashcap and ends the process, so it
  /// must come before the training loop. Call it before the first step; the function must
  /// compute what the loop computes (same modules, same loss), reading only the batch it is given.
  void setStep(StepFunction step);
  /// The optimizer (must outlive the recorder) and the recipe. Call after setProgram/setModel.
  /// Throws crashcap::Error{InvalidArgument} when the optimizer updates a tensor that is not
  /// among the program's or model's parameters (a keyframe could not restore its state).
  void setOptimizer(torch::optim::Optimizer& optimizer, Recipe recipe = {});
  /// Instead of setOptimizer, for a training written in another language (ForeignTraining).
  /// Call after setModel. The optimizer spec must name only setModel's parameters.
  void setForeign(ForeignTraining training);

  /// This process's place in a multi-process job: rank, world size, backend (from the process
  /// group), and the job id every rank's recording shares. What it leaves out (jobId empty,
  /// localRank -1, rendezvous empty) comes from the launcher's variables when they name the
  /// same rank (distributedFromEnvironment, jobIdFromEnvironment). A launcher's RANK/WORLD_SIZE are recorded without
  /// it; this says more, and the last identity given holds. Throws crashcap::Error{InvalidArgument}
  /// for a rank outside its world (checkDistributed). crashcap/recorder/distributed.hpp.
  void setDistributed(formats::DistributedData identity);

  /// Records step `step`'s batch (copied now), generator states and learning rates, and a
  /// keyframe when one is due. Steps must increase.
  StepGuard beginStep(int64_t step, const Batch& batch);
  /// The same, with the batch's nesting (StepBegin.structure: JSON, "" flat) and its number of
  /// samples, `rows`, when the loader says it (-1 not known): with it, tensors whose samples are
  /// not their first dimension (a sequence-first batch) are cut by the right one when a replay
  /// or a pack keeps some rows only (formats::rowDimensions).
  StepGuard beginStep(int64_t step, const Batch& batch, std::string structure, int64_t rows = -1);

  /// Whether the steps begun from now on are between two optimizer updates (gradient
  /// accumulation: the last step ran backward() without one). A keyframe holds no gradients, so
  /// one taken there would replay without those accumulated before it: while held, a keyframe
  /// that comes due waits for the first step begun after the hold is lifted.
  void holdKeyframes(bool held);

  /// The exception that ended training: records it as the crash (with the step and phase of
  /// the failed step) and seals the crash bundle. Returns the bundle path ("" when it
  /// could not be sealed). Call from the handler that caught it.
  std::string fail(const std::exception& error);
  std::string fail(std::exception_ptr error);
  /// A failure a front end describes itself (a Python exception with its traceback).
  std::string fail(const Failure& failure);

  /// Drains and closes the recording (kept on disk for `crashcap seal`), and lets go of the
  /// training: its tensors (setModel), optimizer, step function and a front end's callbacks, so
  /// that a program that trains again (the next fold, the next trial) frees the last one. Idempotent.
  /// `durable` false: the recording is removed if the run ends clean (`crashcap run --record`
  /// without --keep-recording), so its last writes are not synced to the disk; a crash after
  /// close is sealed from the page cache all the same.
  void close(bool durable = true);

  /// A front end's warning (what it could not record, and what it kept instead): printed on
  /// stderr unless quiet or `print` is false (the front end said it already), kept in
  /// stats().warnings and in the run status of the recording.
  void warn(const std::string& warning, bool print = true);

  RecorderStats stats() const;
  /// The live recording directory, <outputDir>/recording-<time>-<pid> ("" when not recording).
  std::string recordingDir() const;
  /// The last crash bundle sealed ("" none).
  std::string crashBundle() const;

 private:
  friend class StepGuard;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crashcap::recorder
