#include "crashcap/recorder/recorder.hpp"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/api/include/torch/version.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/nn/module.h>
#include <torch/optim.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "crash_guard.hpp"
#include "crashcap/formats/clock.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/nan_sign.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/torch/errors.hpp"
#include "crashcap/formats/torch/optimizer.hpp"
#include "crashcap/formats/torch/fingerprint.hpp"
#include "crashcap/formats/torch/settings.hpp"
#include "crashcap/recorder/recording_dir.hpp"
#include "crashcap/formats/torch/tensor_bridge.hpp"
#include "crashcap/replayer/program_replay.hpp"
#include "crashcap/recorder/distributed.hpp"
#include "crashcap/recorder/environment.hpp"
#include "host_pool.hpp"
#include "parallel_copy.hpp"
#include "live_writer.hpp"
#include "crashcap/cupti/trace_file.hpp"
#include "crashcap/cupti/tracer.hpp"
#include "op_ring.hpp"

namespace crashcap::recorder {
namespace {

using detail::Job;

/// The same numbers, a NaN the same as a NaN (a NaN learning rate is kept once, at the begin).
bool sameNumbers(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

/// c10::Error's what() is the message followed by a C++ backtrace: keep them apart.
void describeTorchException(const std::exception& e, formats::CrashData& crash) {
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) {
    std::string message = formats::torch::errorMessage(e);
    std::string full = ce->what();
    crash.error = message;
    if (full.size() > message.size() && full.compare(0, message.size(), message) != 0) {
      // Some versions put the backtrace first; keep everything that is not the message.
      full.erase(full.find(message) == std::string::npos ? full.size() : full.find(message), message.size());
    } else if (full.size() >= message.size()) {
      full.erase(0, message.size());
    }
    std::istringstream lines(full);
    std::string line;
    while (std::getline(lines, line) && crash.stack.size() < 128)
      if (!line.empty()) crash.stack.push_back(line.size() > 4000 ? line.substr(0, 4000) : line);
  }
}

}  // namespace

struct Recorder::Impl {
  std::string outputDir;
  Policy policy;
  std::unique_ptr<detail::LiveWriter> writer;
  /// Reused host buffers for the copies the writer owns (up to queueBytes of them idle).
  std::shared_ptr<detail::HostPool> pool;
  uint64_t keyframeCopyBytes = 0;  ///< host bytes the last keyframe's copies took
  bool poolWarned = false;
  std::string notRecordingReason;

  std::vector<std::pair<std::string, at::Tensor>> parameters, buffers;
  std::optional<torch::jit::Module> module;
  std::vector<std::string> inputs;
  torch::optim::Optimizer* optimizer = nullptr;
  /// A training in another language (setForeign): its optimizer and generators are read through it.
  std::optional<ForeignTraining> foreign;
  std::vector<std::string> foreignFailed;  ///< callbacks that threw (each warned about once)
  Recipe recipe;
  StepFunction step;
  /// setModel's program record, written at the first step (when setStep has had its chance).
  std::optional<formats::StepProgramData> moduleProgram;
  bool moduleProgramWritten = false;
  /// This process was started to serve a replay (replayer/program_replay.hpp): nothing is recorded.
  std::optional<replayer::ReplayRequest> replayRequest;

  int64_t lastStep = -1;
  int64_t lastKeyframe = -1;
  /// The learning rates the last beginStep recorded, for end(loss) to see whether the program
  /// set them after the batch (StepEndData::updateLearningRates).
  std::vector<double> beginLearningRates;
  /// Each batch input's row dimension at the last step where it was not in doubt
  /// (formats::rowDimensions): a [T, B] input whose T is B at one step keeps dimension 1.
  std::map<std::string, int8_t> rowDimBefore;
  bool keyframeDue = true;
  bool keyframesHeld = false;  ///< holdKeyframes: mid-accumulation, a due keyframe waits
  // The keyframe cadence: Policy::keyframeEvery, or chosen from what keyframes cost (interval()).
  int64_t autoInterval = Policy::kAutoKeyframeEveryMin;  ///< what the automatic cadence chooses now
  double stepSeconds = 0;           ///< moving average of the time between beginSteps, keyframe copies left out
  double keyframeCopySeconds = 0;   ///< the last keyframe's copy on the training thread
  double copyThisStep = 0;          ///< the keyframe copy in the last beginStep (not the training's time)
  std::optional<std::chrono::steady_clock::time_point> previousBegin;
  uint64_t stepRecordBytes = 0;     ///< the last step's records as queued (uncompressed)
  unsigned copyThreads = 0;          ///< threads the last keyframe's copy used
  uint64_t lastKeyframeBytes = 0;   ///< the state a keyframe copies (keyframeBytes), at the last one due
  bool cadenceWarned = false;
  uint64_t keyframes = 0;
  bool environmentWritten = false;
  int64_t stepStartNs = 0;
  /// The step whose crash is already recorded (non-finite raise): its unwinding and a
  /// fail() with the same error add nothing.
  int64_t crashRecordedStep = -1;
  bool observerStarted = false;   ///< this recorder owns the process-wide op observer
  /// A step the guard saw fail by exception, not yet handed to fail().
  std::optional<formats::CrashData> pendingCrash;
  std::string lastCrashBundle;
  bool closed = false;
  std::vector<std::string> warnings;
  /// The process this recorder records. A child the training forks (a DataLoader worker, a
  /// helper that then exits normally) inherits the recorder without its writer thread or its
  /// private buffers (host_pool.hpp): there every call does nothing (forkedAway()).
  pid_t ownerPid = ::getpid();

  bool recording() const { return writer != nullptr; }
  bool forkedAway() const { return ::getpid() != ownerPid; }
  /// In a forked child: the writer's thread is not in this process, so it is never joined or
  /// closed here; its memory is left to the child's exit.
  void abandonInChild() {
    closed = true;
    (void)writer.release();
  }

  /// In a process started to serve a replay: serves it once the model and the step function are
  /// both known, and ends the process (the training loop after this point is not the replay's).
  void serveWhenReady() {
    if (!replayRequest || !step || !moduleProgram) return;
    bool written = replayer::serveReplayRequest(*replayRequest, parameters, buffers, step);
    // _Exit: no static destructors while the program's other threads (loader, device) still run,
    // where one could hang after the answer is already written.
    std::fflush(nullptr);
    std::_Exit(written ? 0 : 1);
  }

  /// Written at the first step, whose batch names a foreign TorchScript step's inputs.
  void writeModuleProgram(const Batch& firstBatch) {
    if (!writer || !moduleProgram || moduleProgramWritten) return;
    moduleProgram->servesReplay = static_cast<bool>(step);
    std::vector<Job> jobs;
    if (foreign) {
      // A foreign training replays itself: its own loop is the step function.
      moduleProgram->format = foreign->format;
      moduleProgram->servesReplay = true;
      moduleProgram->sources.clear();
      for (auto& [file, contents] : foreign->sources) {
        formats::SourceFileData d = file;
        d.tensor.clear();
        if (!contents.empty()) {
          d.tensor = "program/sources/" + file.path;
          Job a;
          a.kind = Job::Kind::RunTensor;
          a.tensor = bytesTensor(d.tensor, std::make_shared<std::string>(std::move(contents)));
          jobs.push_back(std::move(a));
        }
        moduleProgram->sources.push_back(std::move(d));
      }
      if (!foreign->torchScript.empty()) {
        // Unless it gave its step as TorchScript: crashcap replays that in its own process, as a
        // setProgram one, and the sources are there for the reader.
        moduleProgram->format = "torchscript";
        moduleProgram->servesReplay = false;
        moduleProgram->archive = formats::StepProgramData().archive;
        moduleProgram->inputs.clear();
        for (const auto& [name, t] : firstBatch) moduleProgram->inputs.push_back(name);
        Job a;
        a.kind = Job::Kind::RunTensor;
        a.tensor = bytesTensor(moduleProgram->archive, std::make_shared<std::string>(std::move(foreign->torchScript)));
        foreign->torchScript.clear();
        jobs.push_back(std::move(a));
      }
    }
    jobs.push_back(recordJob(*moduleProgram, Job::Kind::RunRecord));
    writer->push(std::move(jobs), detail::Lane::Program);
    moduleProgramWritten = true;
  }

  /// Calls a foreign training's callback; one that throws is warned about once and gives nothing.
  template <typename Fn>
  auto foreignCall(const char* what, Fn&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const std::exception& e) {
      if (std::find(foreignFailed.begin(), foreignFailed.end(), what) == foreignFailed.end()) {
        foreignFailed.push_back(what);
        warn(fmt::format("could not read the training's {}: {}; recording goes on without it", what, e.what()));
      }
      return {};
    }
  }

  void setPhase(Phase p) {
    if (writer) writer->phase.store(static_cast<int>(p), std::memory_order_relaxed);
  }
  Phase phase() const {
    return writer ? static_cast<Phase>(writer->phase.load(std::memory_order_relaxed)) : Phase::Setup;
  }

  void warn(const std::string& w, bool print = true) {
    // Once the writer runs, its warnings are the ones the run status keeps (stats() shows both).
    if (writer)
      writer->addWarning(w);
    else
      warnings.push_back(w);
    if (print && !policy.quiet) std::fprintf(stderr, "crashcap: warning: %s\n", w.c_str());
  }

  /// A host copy the writer can own. CPU tensors are copied now; device tensors are copied
  /// asynchronously into pinned memory and the writer waits for the copy (never the
  /// training thread).
  /// Copies a keyframe defers to do all at once, with every core (detail::copyInParallel); the
  /// tensors keep their sources alive until then.
  struct DeferredCopies {
    std::vector<detail::CopyTask> tasks;
    std::vector<at::Tensor> sources;
  };

  /// A host copy of `tensor` for the writer. With `defer`, a contiguous CPU tensor's bytes are
  /// copied later, by copyInParallel over `defer`, before the job reaches the writer.
  std::optional<detail::TensorJob> hostCopy(const std::string& name, const at::Tensor& tensor,
                                            DeferredCopies* defer = nullptr) {
    if (!tensor.defined()) return std::nullopt;
    auto dtype = formats::torch::toDType(tensor.scalar_type());
    if (!dtype) {
      warn(fmt::format("tensor '{}' has dtype {}, which bundles do not hold; not recorded", name,
                       c10::toString(tensor.scalar_type())));
      return std::nullopt;
    }
    detail::TensorJob job;
    job.name = name;
    job.dtype = *dtype;
    job.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
    const uint64_t bytes = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
    if (tensor.device().is_cpu() && pool && bytes > 0) {
      if (auto buffer = pool->acquire(bytes)) {
        // A row-major CPU tensor is its bytes: memcpy them. copy_ would build a TensorIterator
        // (and detach a new tensor) for every batch tensor and generator state of every step.
        if (tensor.layout() == at::kStrided && tensor.is_contiguous() && !tensor.is_conj() && !tensor.is_neg()) {
          if (defer) {
            defer->tasks.push_back({buffer.get(), tensor.data_ptr(), bytes});
            defer->sources.push_back(tensor);
          } else {
            std::memcpy(buffer.get(), tensor.data_ptr(), bytes);
          }
        } else {
          at::Tensor src = tensor.detach().resolve_conj().resolve_neg();
          at::from_blob(buffer.get(), src.sizes(), src.options().device(at::kCPU)).copy_(src);
        }
        job.data = buffer.get();
        job.size = bytes;
        job.owner = std::move(buffer);
        return job;
      }
    }
    at::Tensor src = tensor.detach().resolve_conj().resolve_neg();
    at::Tensor host;
    if (src.device().is_cpu()) {
      host = src.clone(at::MemoryFormat::Contiguous);
    } else {
      host = at::empty(src.sizes(), src.options().device(at::kCPU).pinned_memory(true));
      host.copy_(src, /*non_blocking=*/true);
      auto event = std::make_shared<c10::Event>(src.device().type());
      c10::impl::VirtualGuardImpl impl(src.device().type());
      event->record(impl.getStream(src.device()));
      // Bounded: a device stuck behind a hung kernel or collective must not hang the writer
      // (and with it the crash path and close()).
      job.wait = [event] {
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        try {
          while (!event->query()) {
            if (std::chrono::steady_clock::now() > deadline) return false;
            std::this_thread::sleep_for(std::chrono::microseconds(100));
          }
          return true;
        } catch (const std::exception&) {
          return false;  // the device failed before the copy finished
        }
      };
    }
    auto owner = std::make_shared<at::Tensor>(host);
    job.data = owner->data_ptr();
    job.size = static_cast<uint64_t>(owner->numel()) * owner->element_size();
    job.owner = owner;
    return job;
  }

  /// A uint8 [n] tensor of bytes the job owns (an archive, a source file, a JSON document).
  static detail::TensorJob bytesTensor(std::string name, std::shared_ptr<std::string> bytes) {
    detail::TensorJob t;
    t.name = std::move(name);
    t.dtype = formats::DType::UInt8;
    t.shape = {static_cast<int64_t>(bytes->size())};
    t.data = bytes->data();
    t.size = bytes->size();
    t.owner = std::move(bytes);
    return t;
  }

  static Job tensorJob(detail::TensorJob t) {
    Job j;
    j.kind = Job::Kind::Tensor;
    j.tensor = std::move(t);
    return j;
  }

  template <typename T>
  static Job recordJob(const T& value, Job::Kind kind = Job::Kind::Record) {
    Job j;
    j.kind = kind;
    j.type = static_cast<uint16_t>(formats::recordTypeOf(value));
    j.meta = formats::encodeMeta(value);
    return j;
  }

  void writeEnvironment() {
    if (environmentWritten || !writer) return;
    environmentWritten = true;
    EnvironmentOptions eo;
    eo.allVariables = policy.allEnvironmentVariables;
    auto env = captureEnvironment(eo);
    auto fact = [&](const char* k, std::string v) { env.facts.emplace_back(k, std::move(v)); };
    auto yes = [](bool b) { return std::string(b ? "true" : "false"); };
    fact("torch.version", TORCH_VERSION);
    fact("torch.interop_threads", std::to_string(at::get_num_interop_threads()));
    fact("torch.openmp", yes(at::Context::hasOpenMP()));
    fact("torch.mkl", yes(at::Context::hasMKL()));
    fact("torch.mkldnn", yes(at::Context::hasMKLDNN()));
    bool cuda = at::Context::hasCUDA();
    fact("cuda.available", yes(cuda));
    if (!cuda)
      fact("cuda.unavailable_reason", "this LibTorch build has no CUDA support or no CUDA device is visible");
    // What replay applies again and config bisection flips (as at the first step).
    for (const auto& name : formats::torch::settingNames()) fact(name.c_str(), formats::torch::currentSetting(name));
    // Replay must run the step program the same way: the optimised graph's backward can
    // differ in the last bit from the unoptimised one.
    fact("torch.jit.graph_executor_optimize", yes(torch::jit::getGraphExecutorOptimize()));
    fact("recorder.keyframe_every", policy.keyframeEvery == Policy::kKeyframeEveryAuto
                                        ? std::string("auto")
                                        : std::to_string(policy.keyframeEvery));
    fact("recorder.op_trace_depth", std::to_string(policy.opTraceDepth));
    fact("recorder.nonfinite", policy.nonFinite == NonFinitePolicy::Raise ? "raise" : "record");
    if (foreign)
      for (const auto& [key, value] : foreign->facts) {
        auto same = std::find_if(env.facts.begin(), env.facts.end(), [&](const auto& f) { return f.first == key; });
        if (same != env.facts.end())
          same->second = value;  // the front end knows better (process.cwd: where the program started)
        else
          env.facts.emplace_back(key, value);
      }
    writer->push({recordJob(env, Job::Kind::RunRecord)});
  }

  std::vector<double> learningRates() {
    std::vector<double> out;
    if (foreign && foreign->learningRates)
      return foreignCall("learning rates", [&] { return foreign->learningRates(); });
    if (optimizer)
      for (const auto& g : optimizer->param_groups()) out.push_back(g.options().get_lr());
    return out;
  }

  /// Bytes a keyframe would copy, to skip copies the writer's queue cannot take.
  uint64_t keyframeBytes() const {
    uint64_t bytes = 0;
    auto add = [&](const at::Tensor& t) {
      if (t.defined()) bytes += static_cast<uint64_t>(t.numel()) * t.element_size();
    };
    for (const auto& [n, t] : parameters) add(t);
    for (const auto& [n, t] : buffers) add(t);
    if (optimizer || foreign) {
      // Adam-like optimizers keep about two tensors per parameter.
      uint64_t params = bytes;
      bytes += 2 * params;
    }
    return bytes;
  }

  /// Steps between keyframes from now on (docs/RECORDING.md, "Keyframe cadence"). A keyframe
  /// costs its copy on the training thread and the writer's time on one of the machine's cores;
  /// the interval spreads that over enough steps to stay under policy.keyframeBudget of the step
  /// time, lets the writer finish one keyframe well before the next is due, and keeps two
  /// segments (a keyframe and its steps each) within retainBytes.
  int64_t interval() const {
    return policy.keyframeEvery != Policy::kKeyframeEveryAuto ? policy.keyframeEvery : autoInterval;
  }

  /// What the automatic cadence chooses from the measurements so far (also with a fixed cadence:
  /// stats() shows it). Warns once when retainBytes bounds it.
  int64_t chooseAutoInterval() {
    int64_t k = Policy::kAutoKeyframeEveryMin;
    if (stepSeconds <= 0 || keyframeCopySeconds <= 0 || !writer) return k;
    static const double cores = std::max(1u, std::thread::hardware_concurrency());
    const double write = writer->lastKeyframeWriteSeconds();
    // The writer's processor time: its wall time on every thread that compressed (the busy
    // threads' share of the machine is what the training loses).
    const double writeCpu = write * std::max(1u, Policy::compressionThreadsFor(policy.compressionThreads, lastKeyframeBytes));
    auto steps = [&](double seconds) { return static_cast<int64_t>(std::ceil(seconds / stepSeconds)); };
    const int64_t byWriter = steps(1.25 * write);
    k = std::max({k, steps((keyframeCopySeconds + writeCpu / cores) / std::max(policy.keyframeBudget, 1e-4)), byWriter});
    // The disk bound, once the writer's pace is known: an interval shorter than that would only
    // have keyframes skipped.
    if (policy.retainBytes && stepRecordBytes && lastKeyframeBytes && write > 0) {
      const uint64_t keyframe = lastKeyframeBytes, half = policy.retainBytes / 2;
      const bool warnNow = !cadenceWarned && policy.keyframeEvery == Policy::kKeyframeEveryAuto;
      const int64_t byDisk = keyframe < half ? static_cast<int64_t>((half - keyframe) / stepRecordBytes) : 0;
      std::string why;
      if (byDisk < std::max<int64_t>(byWriter, 1)) {
        // No interval helps: retention keeps two segments, over retainBytes, whatever the cadence.
        why = fmt::format("a keyframe holds {:.0f} MiB: two of them and the steps the writer needs between them do "
                          "not fit in retainBytes ({:.0f} MiB), which the retained window needs; the recording keeps "
                          "its two newest segments above the bound. Raise retainBytes to at least {:.0f} MiB",
                          keyframe / 1048576.0, policy.retainBytes / 1048576.0, 2.5 * keyframe / 1048576.0);
      } else if (byDisk < k) {
        why = fmt::format("a keyframe of {:.0f} MiB every {} steps would not fit twice in retainBytes ({:.0f} MiB) "
                          "with the steps between them: keyframes come every {} steps instead, above the {:.1f}% "
                          "budget; raise retainBytes to keep both",
                          keyframe / 1048576.0, k, policy.retainBytes / 1048576.0, byDisk, 100 * policy.keyframeBudget);
        k = byDisk;
      }
      if (!why.empty() && warnNow) {
        cadenceWarned = true;
        warn(why);
      }
    }
    return k;
  }

  /// At every beginStep: the step time's moving average (the first interval, the training's
  /// warm-up, counts as it comes and is soon outweighed).
  void measureStep() {
    const auto now = std::chrono::steady_clock::now();
    if (previousBegin) {
      const double seconds = std::max(0.0, std::chrono::duration<double>(now - *previousBegin).count() - copyThisStep);
      stepSeconds = stepSeconds > 0 ? 0.9 * stepSeconds + 0.1 * seconds : seconds;
    }
    previousBegin = now;
    copyThisStep = 0;
  }

  /// Lets the pool keep the keyframe's buffers (up to the policy's bound) when the writer is done
  /// with them, so that the next keyframe copies into memory already mapped.
  void keepKeyframeBuffers() {
    if (!pool) return;
    uint64_t bound = policy.keyframePoolBytes;
    if (bound == 0) {
      const long pages = ::sysconf(_SC_PHYS_PAGES), pageSize = ::sysconf(_SC_PAGESIZE);
      bound = pages > 0 && pageSize > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(pageSize) / 4 : 0;
    }
    if (keyframeCopyBytes > bound && !poolWarned) {
      poolWarned = true;
      warn(fmt::format("a keyframe copies {:.0f} MiB of state, more than the {:.0f} MiB the recorder keeps for "
                       "keyframes (Policy::keyframePoolBytes): each keyframe copies into fresh memory, several times "
                       "slower than a memcpy",
                       keyframeCopyBytes / 1048576.0, bound / 1048576.0));
    }
    pool->setIdleLimit(policy.queueBytes + std::min(keyframeCopyBytes, bound));
  }

  std::vector<Job> keyframeJobs(int64_t step) {
    keyframeCopyBytes = 0;
    std::vector<Job> jobs;
    Job start;
    start.kind = Job::Kind::StartSegment;
    start.step = step;
    start.compressionThreads = Policy::compressionThreadsFor(policy.compressionThreads, lastKeyframeBytes);
    jobs.push_back(std::move(start));
    formats::KeyframeData kf;
    kf.step = step;
    DeferredCopies copies;
    auto add = [&](const std::string& part, const std::string& name, const at::Tensor& t,
                   std::vector<std::string>& names) {
      auto full = formats::keyframeTensorName(step, part, name);
      if (auto job = hostCopy(full, t, &copies)) {
        if (job->owner) keyframeCopyBytes += detail::HostPool::sizeClass(job->size);
        jobs.push_back(tensorJob(std::move(*job)));
        names.push_back(full);
      }
    };
    for (const auto& [name, t] : parameters) add("parameters", name, t, kf.parameters);
    for (const auto& [name, t] : buffers) add("buffers", name, t, kf.buffers);
    if (optimizer) {
      for (const auto& [name, p] : parameters) {
        auto state = formats::torch::parameterState(*optimizer, p);
        for (const auto& [key, t] : state.tensors) add("optimizer", name + "/" + key, t, kf.optimizerState);
        if (state.step) kf.optimizerScalars.emplace_back(name + "/step", static_cast<double>(*state.step));
      }
    }
    if (foreign && foreign->keyframe) {
      auto extra = foreignCall("optimizer and scheduler state", [&] { return foreign->keyframe(step); });
      for (const auto& [name, t] : extra.optimizerState) add("optimizer", name, t, kf.optimizerState);
      for (auto& [name, json] : extra.documents) {
        auto full = formats::keyframeTensorName(step, "documents", name);
        jobs.push_back(tensorJob(bytesTensor(full, std::make_shared<std::string>(std::move(json)))));
        kf.documents.push_back(full);
      }
    }
    // The state's bytes, with every core: the training waits for this copy and nothing else.
    copyThreads = detail::copyInParallel(copies.tasks);
    jobs.push_back(recordJob(kf));
    jobs.back().endsKeyframe = true;
    return jobs;
  }

  std::vector<Job> stepJobs(int64_t step, int64_t previousStep, const Batch& batch, std::string structure, int64_t rows) {
    std::vector<Job> jobs;
    formats::StepBeginData begin;
    begin.step = step;
    begin.structure = std::move(structure);
    begin.previousStep = previousStep;
    begin.timeNs = formats::unixTimeNs();
    begin.keyframe = lastKeyframe;
    begin.accumulating = keyframesHeld;
    begin.learningRates = learningRates();
    beginLearningRates = begin.learningRates;
    std::vector<std::vector<int64_t>> shapes;
    std::vector<const std::string*> names;
    std::vector<int8_t> before;
    for (const auto& [name, t] : batch) {
      auto full = formats::batchTensorName(step, name);
      if (auto job = hostCopy(full, t)) {
        jobs.push_back(tensorJob(std::move(*job)));
        begin.batch.push_back(full);
        shapes.emplace_back(t.sizes().begin(), t.sizes().end());
        names.push_back(&name);
        auto b = rowDimBefore.find(name);
        before.push_back(b == rowDimBefore.end() ? -1 : b->second);
      }
    }
    begin.rowDims = formats::rowDimensions(shapes, rows, before);
    // Only a count makes a row dimension known; without one, dimension 0 is a guess.
    for (size_t i = 0; rows >= 0 && i < shapes.size(); ++i)
      if (begin.rowDims[i] >= 0 && !formats::rowDimensionInDoubt(shapes[i], rows)) rowDimBefore[*names[i]] = begin.rowDims[i];
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      at::Tensor state;
      {
        std::lock_guard<std::mutex> lock(gen.mutex());
        state = gen.get_state();
      }
      auto full = formats::rngTensorName(step, "cpu");
      if (auto job = hostCopy(full, state)) {
        jobs.push_back(tensorJob(std::move(*job)));
        begin.rng.push_back(full);
      }
    }
    if (at::Context::hasCUDA()) {
      for (int64_t d = 0; d < static_cast<int64_t>(at::getNumGPUs()); ++d) {
        auto gen = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(d)));
        at::Tensor state;
        {
          std::lock_guard<std::mutex> lock(gen.mutex());
          state = gen.get_state();
        }
        auto full = formats::rngTensorName(step, fmt::format("cuda{}", d));
        if (auto job = hostCopy(full, state)) {
          jobs.push_back(tensorJob(std::move(*job)));
          begin.rng.push_back(full);
        }
      }
    }
    if (foreign && foreign->generators)
      for (const auto& [device, state] : foreignCall("generator states", [&] { return foreign->generators(); })) {
        auto full = formats::rngTensorName(step, device);
        if (auto job = hostCopy(full, state)) {
          jobs.push_back(tensorJob(std::move(*job)));
          begin.rng.push_back(full);
        }
      }
    Job commit = recordJob(begin);
    commit.step = step;
    commit.commitsStep = true;
    jobs.push_back(std::move(commit));
    return jobs;
  }

  formats::CrashData crashHere(const char* kind, int64_t step) const {
    formats::CrashData c;
    c.kind = kind;
    c.step = step;
    c.phase = phaseName(phase());
    c.timeNs = formats::unixTimeNs();
    c.pid = static_cast<uint32_t>(::getpid());
    c.thread = static_cast<uint64_t>(::syscall(SYS_gettid));
    return c;
  }

  /// Queues the other loader's batch of `failure` (Failure::otherBatch) for the writer, which
  /// drains its queue before it seals, and names what was queued in `crash`. Nothing of it is
  /// worth losing the crash for: a tensor that cannot be copied is left out, a batch the queue has
  /// no room for is not copied, and one of which only the dataset indices are left is not kept.
  void keepOtherBatch(const Failure& failure, formats::CrashData& crash) {
    at::NoGradGuard noGrad;
    at::DisableRecordFunctionGuard notAnOp;
    uint64_t bytes = 0;
    bool samples = false;  // a tensor of the batch's own, not only its dataset indices
    for (const auto& [name, t] : failure.otherBatch)
      if (t.defined() && t.device().is_cpu()) {
        bytes += static_cast<uint64_t>(t.numel()) * t.element_size();
        samples = samples || name != formats::kDatasetIndexName;
      }
    if (!samples || !writer->wouldAccept(bytes, detail::Lane::Step)) return;
    std::vector<Job> jobs;
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> shapes;
    for (const auto& [name, t] : failure.otherBatch) {
      if (!t.defined() || !t.device().is_cpu()) continue;
      try {
        auto full = formats::batchTensorName(formats::kCrashBatchStep, name);
        if (auto job = hostCopy(full, t)) {
          jobs.push_back(tensorJob(std::move(*job)));
          names.push_back(std::move(full));
          shapes.emplace_back(t.sizes().begin(), t.sizes().end());
        }
      } catch (const std::exception& e) {
        warn(fmt::format("could not keep tensor '{}' of DataLoader #{}'s batch: {}", name, failure.otherLoader, e.what()));
      }
    }
    if (jobs.empty() || !writer->push(std::move(jobs))) return;
    crash.otherLoader = failure.otherLoader;
    crash.otherBatch = std::move(names);
    crash.otherStructure = failure.otherStructure;
    crash.otherRowDims = formats::rowDimensions(shapes, failure.otherRows, {});
  }

  std::string sealCrash(formats::CrashData crash) {
    if (!writer) return "";
    try {
      writeEnvironment();  // a crash before the first step still says where it ran
    } catch (const std::exception& e) {
      warn(fmt::format("could not capture the environment: {}", e.what()));
    }
    crashRecordedStep = crash.step;
    pendingCrash.reset();
    lastCrashBundle = writer->crash(std::move(crash));
    keyframeDue = true;  // a program that goes on records into a fresh recording
    return lastCrashBundle;
  }
};

Recorder::Recorder(std::string outputDir, Policy policy) : impl_(std::make_unique<Impl>()) {
  if (outputDir.empty())
    if (const char* fromRun = std::getenv(kOutputDirVariable)) outputDir = fromRun;  // set by `crashcap run`
  impl_->outputDir = std::move(outputDir);
  impl_->policy = policy;
  if (impl_->policy.keyframeEvery < 0)
    throw crashcap::Error(crashcap::ErrorCode::InvalidArgument,
                         fmt::format("keyframeEvery is {}; it must be >= 1, or Policy::kKeyframeEveryAuto",
                                     impl_->policy.keyframeEvery));
  if (!(impl_->policy.keyframeBudget > 0 && impl_->policy.keyframeBudget <= 1))
    throw crashcap::Error(crashcap::ErrorCode::InvalidArgument,
                         fmt::format("keyframeBudget is {}; it must be a share of the step time in (0, 1]",
                                     impl_->policy.keyframeBudget));
  try {
    impl_->replayRequest = replayer::replayRequestOfThisProcess();
  } catch (const crashcap::Error& e) {
    // Started by crashcap replay, but its request is unreadable: there is nowhere to answer.
    std::fprintf(stderr, "crashcap: error: %s\n", e.what());
    std::fflush(nullptr);
    std::_Exit(2);
  }
  // The request is this process's alone: a program it starts records as usual.
  if (impl_->replayRequest) ::unsetenv(replayer::kReplayRequestVariable);
  if (impl_->replayRequest) return;  // serving a replay: no recording, no crash guard, no observers
  detail::LiveWriterOptions wo;
  wo.outputDir = impl_->outputDir;
  wo.zstdLevel = policy.zstdLevel;
  wo.compressionThreads = Policy::compressionThreadsFor(policy.compressionThreads, 0);
  wo.queueBytes = policy.queueBytes;
  wo.retainSegments = policy.retainSegments;
  wo.retainBytes = policy.retainBytes;
  wo.syncEveryBytes = policy.syncEveryBytes;
  wo.crashDrainSeconds = policy.crashDrainSeconds;
  wo.rawWhenBehind = policy.rawWhenBehind;
  wo.quiet = policy.quiet;
  // A rank of a job its launcher placed (torchrun, crashcap run --nproc): its identity is in
  // run.ccap, synced, before the first step, not queued behind it, so that a rank killed before
  // the writer's first write is still placed in its job. A setDistributed (the backend) is
  // written after it and holds over it (a bundle's last distributed record counts).
  if (auto rank = distributedFromEnvironment()) wo.runRecords.push_back(Impl::recordJob(*rank, Job::Kind::RunRecord));
  impl_->pool = detail::HostPool::create(policy.queueBytes);
  try {
    impl_->writer = std::make_unique<detail::LiveWriter>(wo);
  } catch (const std::exception& e) {
    impl_->notRecordingReason = e.what();
    impl_->warn(fmt::format("not recording: {}; training continues without a flight recorder", e.what()));
    return;
  }
  if (detail::activeWriter())
    impl_->warn("another crashcap Recorder is active in this process; crashes are recorded by the first one");
  else
    detail::setActiveWriter(impl_->writer.get());
  impl_->writer->setOpsSnapshot([] { return detail::snapshotOps(); });
  if (policy.kernelTrace) {
    const char* injected = std::getenv("CUDA_INJECTION64_PATH");
    const char* runDir = std::getenv(kOutputDirVariable);
    if (injected && runDir && std::string(injected).find("crashcap_inject") != std::string::npos) {
      // Under `crashcap run`: when CUDA starts, it loads libcrashcap_inject.so, which holds
      // CUPTI's one subscriber slot and writes a trace file that crashcap run puts into the
      // bundle. Only when that file is missing does the bundle need the reason from here.
      // The op observer's kernel -> op links go to CUPTI directly, where the library's
      // collector finds them; on a machine without a device that would only cost.
      // Asked once, here: the crash path must not call into a driver whose context may be poisoned.
      std::string reason = cupti::gpuUnavailableReason();
      if (reason.empty()) cupti::linkOpsToInjectedTracer();
      std::string traceFile = cupti::traceFilePath(runDir, static_cast<uint32_t>(::getpid()));
      impl_->writer->setKernelTraceSnapshot([traceFile, reason]() -> std::optional<formats::KernelTraceData> {
        if (::access(traceFile.c_str(), F_OK) == 0) return std::nullopt;
        formats::KernelTraceData d;
        d.status = "unavailable: " + (reason.empty() ? "libcrashcap_inject.so (CUDA_INJECTION64_PATH) wrote no trace" : reason);
        d.pid = static_cast<uint32_t>(::getpid());
        return d;
      });
    } else {
      auto tracer = cupti::startTracer();
      impl_->writer->setKernelTraceSnapshot([tracer]() -> std::optional<formats::KernelTraceData> {
        tracer->flushWithin(300, /*forced=*/true);  // bounded: the context may be poisoned
        return tracer->snapshot();
      });
    }
  }
  if (policy.opTraceDepth > 0)
    impl_->observerStarted =
        detail::startOpObserver(policy.opTraceDepth, &impl_->writer->currentStep, &impl_->writer->phase,
                                impl_->writer->progressPage());
  if (policy.crashGuard) detail::installCrashGuard(&describeTorchException);
}

Recorder::~Recorder() {
  try {
    close();
  } catch (...) {
    // A destructor must not throw; close() reports its own failures on stderr.
  }
}

void Recorder::setProgram(const torch::jit::Module& module, std::vector<std::string> inputs) {
  auto& m = *impl_;
  m.module = module;
  m.moduleProgram.reset();
  m.inputs = inputs;
  m.parameters.clear();
  m.buffers.clear();
  for (const auto& p : module.named_parameters(/*recurse=*/true)) m.parameters.emplace_back(p.name, p.value);
  for (const auto& b : module.named_buffers(/*recurse=*/true)) m.buffers.emplace_back(b.name, b.value);
  if (!m.writer) return;
  formats::StepProgramData program;
  program.inputs = std::move(inputs);
  for (const auto& [n, t] : m.parameters) program.parameters.push_back(n);
  for (const auto& [n, t] : m.buffers) program.buffers.push_back(n);
  program.device = m.parameters.empty() ? "cpu" : m.parameters.front().second.device().str();
  std::ostringstream archive;
  module.save(archive);
  // The archive holds every weight: it goes in as a chunked uint8 tensor, any size.
  Job a;
  a.kind = Job::Kind::RunTensor;
  a.tensor = Impl::bytesTensor(program.archive, std::make_shared<std::string>(archive.str()));
  // The archive is as large as the weights: its own lane, so it neither crowds out a step nor
  // makes the first keyframe wait.
  m.writer->push({std::move(a), Impl::recordJob(program, Job::Kind::RunRecord)}, detail::Lane::Program);
}

void Recorder::setModel(std::vector<std::pair<std::string, at::Tensor>> parameters,
                        std::vector<std::pair<std::string, at::Tensor>> buffers) {
  auto& m = *impl_;
  m.parameters = std::move(parameters);
  m.buffers = std::move(buffers);
  // No program to store: the record names the state (and its order, which the gradient norm
  // used) so that a replay with the user's step function can restore it. It is written at the
  // first step, when it can say whether the program serves replays (setStep).
  formats::StepProgramData program;
  program.format = "module";
  program.archive.clear();
  for (const auto& [n, t] : m.parameters) program.parameters.push_back(n);
  for (const auto& [n, t] : m.buffers) program.buffers.push_back(n);
  program.device = m.parameters.empty() ? "cpu" : m.parameters.front().second.device().str();
  m.moduleProgram = std::move(program);
  m.moduleProgramWritten = false;
  if (m.lastStep >= 0) m.writeModuleProgram({});
  m.serveWhenReady();
}

void Recorder::setStep(StepFunction step) {
  auto& m = *impl_;
  if (!step) throw crashcap::Error(crashcap::ErrorCode::InvalidArgument, "setStep was given an empty function");
  if (m.module)
    throw crashcap::Error(crashcap::ErrorCode::InvalidArgument,
                         "setStep is for a model given to setModel; a TorchScript step program (setProgram) is its own step",
                         "drop the setStep call, or record with setModel instead of setProgram");
  if (m.lastStep >= 0)
    throw crashcap::Error(crashcap::ErrorCode::InvalidArgument,
                         fmt::format("setStep after step {} began: a replay of this program would reach its training "
                                     "loop before it",
                                     m.lastStep),
                         "call setStep after setModel and before the first beginStep");
  m.step = std::move(step);
  m.serveWhenReady();
}

void Recorder::setModel(const torch::OrderedDict<std::string, at::Tensor>& parameters,
                        const torch::OrderedDict<std::string, at::Tensor>& buffers) {
  auto pairs = [](const torch::OrderedDict<std::string, at::Tensor>& items) {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& item : items) out.emplace_back(item.key(), item.value());
    return out;
  };
  setModel(pairs(parameters), pairs(buffers));
}

void Recorder::setModel(const torch::nn::Module& module) {
  setModel(module.named_parameters(true), module.named_buffers(true));
}

void Recorder::setOptimizer(torch::optim::Optimizer& optimizer, Recipe recipe) {
  auto& m = *impl_;
  std::unordered_map<const void*, std::string> names;
  for (const auto& [n, t] : m.parameters) names[t.unsafeGetTensorImpl()] = n;
  // Every tensor the optimizer updates must be one the keyframes hold, or replay would restore
  // weights without their optimizer state (or miss weights): a setup error, said now.
  size_t group = 0;
  for (const auto& g : optimizer.param_groups()) {
    size_t index = 0;
    for (const auto& p : g.params()) {
      if (!names.count(p.unsafeGetTensorImpl()))
        throw crashcap::Error(
            crashcap::ErrorCode::InvalidArgument,
            fmt::format("the optimizer's parameter {} of group {} (shape [{}]) is not among the {} parameters given to {}",
                        index, group, fmt::join(p.sizes(), ","), m.parameters.size(),
                        m.parameters.empty() ? "setProgram or setModel (neither was called)" : "setProgram or setModel"),
            "give setModel the tensors the optimizer was built from (module.named_parameters(), not copies made by "
            ".clone() or .to()), and call setProgram or setModel before setOptimizer");
      ++index;
    }
    ++group;
  }
  m.optimizer = &optimizer;
  m.recipe = recipe;
  if (!m.writer) return;
  size_t unnamed = 0;
  auto spec = formats::torch::describeOptimizer(
      optimizer,
      [&](const at::Tensor& p) {
        auto it = names.find(p.unsafeGetTensorImpl());
        return it == names.end() ? std::string() : it->second;
      },
      unnamed);
  spec.gradClipNorm = recipe.gradClipNorm;
  spec.gradClipNormType = recipe.gradClipNormType;
  m.writer->push({Impl::recordJob(spec, Job::Kind::RunRecord)});
}

void Recorder::setForeign(ForeignTraining training) {
  auto& m = *impl_;
  if (!m.moduleProgram)
    throw crashcap::Error(crashcap::ErrorCode::InvalidArgument, "setForeign before setModel",
                         "give the model's named parameters and buffers to setModel first");
  if (m.optimizer)
    throw crashcap::Error(crashcap::ErrorCode::InvalidArgument, "setForeign after setOptimizer: a training has one optimizer");
  std::unordered_map<std::string, bool> known;
  for (const auto& [n, t] : m.parameters) known[n] = true;
  for (size_t g = 0; g < training.optimizer.groups.size(); ++g)
    for (const auto& name : training.optimizer.groups[g].parameters)
      if (!known.count(name))
        throw crashcap::Error(crashcap::ErrorCode::InvalidArgument,
                             fmt::format("the optimizer's parameter '{}' of group {} is not among the {} parameters given "
                                         "to setModel",
                                         name, g, m.parameters.size()));
  formats::OptimizerSpecData spec = training.optimizer;
  m.foreign = std::move(training);
  if (m.writer) m.writer->push({Impl::recordJob(spec, Job::Kind::RunRecord)});
}

void Recorder::setDistributed(formats::DistributedData identity) {
  checkDistributed(identity);
  // What the launcher's variables add (the local rank, the rendezvous), when they name this rank.
  if (auto launched = distributedFromEnvironment();
      launched && launched->rank == identity.rank && launched->worldSize == identity.worldSize) {
    if (identity.localRank < 0) identity.localRank = launched->localRank;
    if (identity.rendezvous.empty()) identity.rendezvous = launched->rendezvous;
  }
  if (identity.jobId.empty()) std::tie(identity.jobId, identity.jobIdSource) = jobIdFromEnvironment(identity.rendezvous);
  if (identity.source.empty()) identity.source = "program";
  auto& m = *impl_;
  if (m.writer && !m.forkedAway()) m.writer->push({Impl::recordJob(identity, Job::Kind::RunRecord)});
}

StepGuard Recorder::beginStep(int64_t step, const Batch& batch) { return beginStep(step, batch, std::string(), -1); }

void Recorder::holdKeyframes(bool held) { impl_->keyframesHeld = held; }

StepGuard Recorder::beginStep(int64_t step, const Batch& batch, std::string structure, int64_t rows) {
  auto& m = *impl_;
  if (m.forkedAway()) {
    m.abandonInChild();
    return StepGuard(nullptr, step);
  }
  if (step <= m.lastStep)
    throw crashcap::Error(crashcap::ErrorCode::InvalidArgument,
                         fmt::format("beginStep({}) after step {}: steps must increase", step, m.lastStep));
  if (m.pendingCrash) m.sealCrash(std::move(*m.pendingCrash));
  if (m.replayRequest) {
    // Serving a replay, the program reached its training loop: it never gave its step function.
    replayer::ReplayOutcome outcome;
    outcome.error = crashcap::Error(
        crashcap::ErrorCode::Unsupported,
        fmt::format("the program began step {} without calling Recorder::setStep, so crashcap cannot run its step", step),
        m.moduleProgram ? "call rec.setStep(...) with the step's forward and loss after setModel, before the training loop"
                        : "record with setModel and setStep (or setProgram), before the training loop");
    bool written = replayer::writeReplayOutcome(*m.replayRequest, outcome);
    std::fflush(nullptr);
    std::_Exit(written ? 3 : 1);
  }
  const int64_t previousStep = m.lastStep;  // -1 before the first step
  m.lastStep = step;
  m.stepStartNs = formats::unixTimeNs();
  if (!m.writer) return StepGuard(this, step);
  at::NoGradGuard noGrad;
  at::DisableRecordFunctionGuard notAnOp;  // the recorder's own copies are not the training's ops
  m.writeEnvironment();
  m.writeModuleProgram(batch);
  m.writer->settleProgress();
  m.writer->currentStep.store(step, std::memory_order_relaxed);
  m.writer->stepsBegun.fetch_add(1, std::memory_order_relaxed);
  m.writer->progressPage()->lastOp[0] = '\0';  // the newest op is this step's, or none
  // A keyframe goes in the keyframe lane and the step in the step lane: a keyframe that does not
  // fit is skipped (and tried again at the next step), and the step is kept either way.
  m.measureStep();
  const bool keyframeDue = m.keyframeDue || step - m.lastKeyframe >= m.interval();
  if (keyframeDue && m.keyframesHeld) {
    m.keyframeDue = true;  // the first step after the next optimizer update takes it
  } else if (keyframeDue) {
    const uint64_t bytes = m.lastKeyframeBytes = m.keyframeBytes();
    if (!m.writer->wouldAccept(bytes, detail::Lane::Keyframe)) {
      // The writer is still writing the last keyframe: do not copy the model just to drop it.
      m.writer->skipKeyframe(step, bytes);
      m.keyframeDue = true;
    } else {
      const auto copyStart = std::chrono::steady_clock::now();
      auto jobs = m.keyframeJobs(step);
      if (m.writer->push(std::move(jobs), detail::Lane::Keyframe)) {
        m.lastKeyframe = step;
        m.keyframeDue = false;
        ++m.keyframes;
        m.keepKeyframeBuffers();
      }
      m.copyThisStep = m.keyframeCopySeconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - copyStart).count();
    }
  }
  m.autoInterval = m.chooseAutoInterval();
  m.writer->keyframeInterval.store(m.interval(), std::memory_order_relaxed);
  if (m.pool) m.writer->bufferPoolPeakBytes.store(m.pool->peakBytes(), std::memory_order_relaxed);
  {
    auto jobs = m.stepJobs(step, previousStep, batch, std::move(structure), rows);
    m.stepRecordBytes = 0;
    for (const auto& j : jobs) m.stepRecordBytes += j.bytes();
    m.writer->push(std::move(jobs));
  }
  m.setPhase(Phase::Forward);
  if (m.observerStarted) detail::observeOpsOnThisThread(true);
  return StepGuard(this, step);
}

std::string Recorder::fail(const std::exception& error) {
  if (impl_->forkedAway()) {
    impl_->abandonInChild();
    return "";
  }
  formats::CrashData c;
  c.errorType = detail::exceptionTypeName(error);
  c.error = error.what();
  describeTorchException(error, c);
  auto& m = *impl_;
  // The recorder's own NonFiniteError was recorded when it was thrown.
  if (auto* nf = dynamic_cast<const NonFiniteError*>(&error); nf && nf->step() == m.crashRecordedStep && !m.pendingCrash)
    return m.lastCrashBundle;
  formats::CrashData crash = m.pendingCrash ? *m.pendingCrash : m.crashHere("exception", m.lastStep);
  if (dynamic_cast<const NonFiniteError*>(&error)) crash.kind = "nonfinite";
  crash.error = c.error;
  crash.errorType = c.errorType;
  if (!c.stack.empty()) crash.stack = c.stack;
  return m.sealCrash(std::move(crash));
}

std::string Recorder::fail(const Failure& failure) {
  auto& m = *impl_;
  if (m.forkedAway()) {
    m.abandonInChild();
    return "";
  }
  if (failure.kind == "nonfinite" && m.crashRecordedStep == m.lastStep && !m.pendingCrash) return m.lastCrashBundle;
  formats::CrashData crash = m.pendingCrash ? *m.pendingCrash : m.crashHere("exception", m.lastStep);
  crash.kind = failure.kind;
  crash.error = failure.error;
  crash.errorType = failure.errorType;
  if (!failure.phase.empty()) crash.phase = failure.phase;
  if (!failure.stack.empty()) crash.stack = failure.stack;
  crash.loadingIndices = failure.loadingIndices;
  crash.loadingDatasetIndices = failure.loadingDatasetIndices;
  if (failure.otherLoader >= 0 && m.writer) try {
      m.keepOtherBatch(failure, crash);
    } catch (...) {  // the crash is sealed without it
      crash.otherLoader = -1;
      crash.otherBatch.clear();
    }
  return m.sealCrash(std::move(crash));
}

std::string Recorder::fail(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return fail(e);
  } catch (...) {
    return fail(std::runtime_error("unknown exception (not derived from std::exception)"));
  }
}

void Recorder::close(bool durable) {
  auto& m = *impl_;
  if (m.forkedAway()) m.abandonInChild();
  if (m.closed) return;
  m.closed = true;
  if (m.pendingCrash) m.sealCrash(std::move(*m.pendingCrash));
  if (m.observerStarted) detail::stopOpObserver();
  if (m.writer) {
    formats::RunStatusData status;
    status.state = "finished";
    status.stepsBegun = m.writer->stepsBegun.load();
    status.lastStep = m.lastStep;
    m.writer->close(status, durable);
    if (detail::activeWriter() == m.writer.get()) {
      detail::setActiveWriter(nullptr);
      if (m.policy.crashGuard) detail::uninstallCrashGuard();
    }
  }
  // Nothing is recorded from here on: the training's tensors and callbacks go (a Python front
  // end's callbacks hold its Recorder, a cycle its garbage collector cannot see through us).
  m.parameters.clear();
  m.buffers.clear();
  m.module.reset();
  m.optimizer = nullptr;
  m.foreign.reset();
  m.step = nullptr;
}

void Recorder::warn(const std::string& warning, bool print) {
  if (!impl_->forkedAway()) impl_->warn(warning, print);
}

RecorderStats Recorder::stats() const {
  RecorderStats s;
  const auto& m = *impl_;
  s.keyframes = m.keyframes;
  s.warnings = m.warnings;
  if (!m.writer || m.forkedAway()) return s;
  s.recording = true;
  s.stepsBegun = m.writer->stepsBegun.load();
  s.writtenThrough = m.writer->writtenThrough();
  if (m.pool) {
    s.bufferPoolBytes = m.pool->idleBytes() + m.pool->liveBytes();
    s.bufferPoolPeakBytes = m.pool->peakBytes();
  }
  s.keyframeInterval = m.interval();
  s.autoKeyframeInterval = m.autoInterval;
  s.keyframeCopySeconds = m.keyframeCopySeconds;
  s.keyframeBytes = m.lastKeyframeBytes;
  s.keyframeCopyThreads = m.copyThreads;
  s.keyframeWriteSeconds = m.writer->lastKeyframeWriteSeconds();
  s.stepSeconds = m.stepSeconds;
  auto w = m.writer->stats();
  s.droppedRecords = w.droppedRecords;
  s.droppedBytes = w.droppedBytes;
  s.segmentsDeleted = w.segmentsDeleted;
  s.recordingPeakBytes = w.recordingPeakBytes;
  s.lostSteps = w.lostSteps;
  s.lostStepCount = w.lostStepCount;
  s.keyframesSkipped = w.keyframesSkipped;
  s.keyframesWrittenRaw = w.keyframesWrittenRaw;
  s.degraded = w.degraded;
  s.warnings.insert(s.warnings.end(), w.warnings.begin(), w.warnings.end());
  return s;
}

std::string Recorder::recordingDir() const { return impl_->writer ? impl_->writer->recordingDir() : ""; }
std::string Recorder::crashBundle() const { return impl_->lastCrashBundle; }

StepGuard::StepGuard(Recorder* recorder, int64_t step)
    : recorder_(recorder), step_(step), uncaught_(std::uncaught_exceptions()) {}

StepGuard::StepGuard(StepGuard&& other) noexcept
    : recorder_(other.recorder_), step_(other.step_), uncaught_(other.uncaught_), ended_(other.ended_) {
  other.recorder_ = nullptr;
}

void StepGuard::end(const at::Tensor& loss) {
  if (!recorder_ || ended_) return;
  ended_ = true;
  auto& m = *recorder_->impl_;
  if (m.forkedAway()) {
    m.abandonInChild();
    return;
  }
  formats::StepEndData fp;
  bool normOverflowed = false;  // gradients all finite, too large for a float32 norm
  fp.step = step_;
  fp.durationNs = formats::unixTimeNs() - m.stepStartNs;
  // A program that sets the learning rate after taking the batch (a warm-up computed from its own
  // step counter) updates with these, not the begin's: a replay sets them back here.
  if (auto now = m.learningRates(); !sameNumbers(now, m.beginLearningRates)) fp.updateLearningRates = std::move(now);
  {
    at::NoGradGuard noGrad;
    at::DisableRecordFunctionGuard notAnOp;
    at::Tensor l = loss.detach();
    std::vector<at::Tensor> grads;
    grads.reserve(m.parameters.size());
    // The gradients as they are (no detach: that makes a new tensor each, and NoGradGuard already
    // keeps the norm out of autograd).
    for (const auto& [name, p] : m.parameters)
      if (p.grad().defined()) grads.push_back(p.grad());
    bool onCpu = l.device().is_cpu();
    for (const auto& g : grads) onCpu = onCpu && g.device().is_cpu();
    if (onCpu) {
      fp.loss = formats::torch::lossValue(l);
      if (!grads.empty()) {
        const auto norm = formats::torch::gradientNorm(grads);
        fp.gradNorm = norm.value;
        fp.gradNormMethod = norm.method;
        fp.hasGradNorm = true;
        normOverflowed = norm.overflowed;
      }
    } else {
      // Reading device values now would synchronise the step: the fingerprint is left
      // unknown (NaN) and the non-finite check is not applied on the device path.
      fp.loss = std::nan("");
    }
    fp.nonFinite = onCpu && (!std::isfinite(fp.loss) || (m.policy.checkGradients && fp.hasGradNorm &&
                                                         !std::isfinite(fp.gradNorm)));
  }
  // The optimizer's update and what runs until the next step are not observed (op_ring.hpp).
  if (m.observerStarted) detail::observeOpsOnThisThread(false);
  if (m.writer) {
    // Not woken for: the next step's batch wakes the writer, which writes this first.
    m.writer->push({Recorder::Impl::recordJob(fp)}, detail::Lane::Step, /*wake=*/false);
    m.setPhase(Phase::Optimizer);
  }
  if (fp.nonFinite && m.policy.nonFinite == NonFinitePolicy::Raise) {
    bool lossBad = !std::isfinite(fp.loss);
    std::string what =
        lossBad ? fmt::format("non-finite loss at step {}: {}", step_, formats::withoutNanSign(fp.loss))
                : fmt::format("non-finite gradient norm at step {}: {}{} (loss {})", step_, formats::withoutNanSign(fp.gradNorm),
                              normOverflowed ? ", of gradients that are all finite but too large for a float32 norm" : "",
                              fp.loss);
    what += fmt::format(" (crashcap stopped the step before optimizer.step(); {} lets the training go on)",
                        m.policy.nonFiniteGoOn);
    if (m.writer) {
      auto crash = m.crashHere("nonfinite", step_);
      crash.phase = lossBad ? "forward" : "backward";
      crash.error = what;
      crash.errorType = "crashcap::recorder::NonFiniteError";
      crash.stack = detail::currentStack(1);
      if (m.foreign && m.foreign->stack) {
        crash.errorType = "NonFiniteError";
        auto frames = m.foreignCall("stack", [&] { return m.foreign->stack(); });
        if (!frames.empty()) crash.stack = std::move(frames);
      }
      m.sealCrash(std::move(crash));
    }
    throw NonFiniteError(step_, what);
  }
}

StepGuard::~StepGuard() {
  if (!recorder_) return;
  auto& m = *recorder_->impl_;
  if (m.forkedAway()) {
    m.abandonInChild();
    return;
  }
  if (std::uncaught_exceptions() > uncaught_) {
    // The step is failing with an exception we cannot see from here: remember where, and
    // let fail() (or close(), or the next beginStep) seal it with whatever text it has.
    if (m.crashRecordedStep != step_ && !m.pendingCrash) {
      auto crash = m.crashHere("exception", step_);
      crash.error = "an exception escaped the step; its text was not passed to Recorder::fail()";
      crash.stack = detail::currentStack(1);
      m.pendingCrash = std::move(crash);
    }
    return;
  }
  m.setPhase(Phase::BetweenSteps);
}

}  // namespace crashcap::recorder
