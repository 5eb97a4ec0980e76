#include "crashcap/replayer/replay.hpp"
#include "crashcap/replayer/replay_module.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim.h>

#include <algorithm>
#include <climits>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/torch/errors.hpp"
#include "crashcap/formats/torch/op_values.hpp"
#include "crashcap/formats/torch/optimizer.hpp"
#include "crashcap/formats/torch/settings.hpp"
#include "crashcap/formats/torch/tensor_bridge.hpp"
#include "crashcap/testing/fault_injection.hpp"

namespace crashcap::replayer {

const char* verdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::ReproducedBitwise: return "reproduced-bitwise";
    case Verdict::Reproduced: return "reproduced";
    case Verdict::Diverged: return "diverged";
    case Verdict::NotReproduced: return "not-reproduced";
    case Verdict::RecordingIncomplete: return "recording-incomplete";
  }
  return "not-reproduced";
}

std::optional<Verdict> parseVerdict(const std::string& text) {
  for (auto v : {Verdict::ReproducedBitwise, Verdict::Reproduced, Verdict::Diverged, Verdict::NotReproduced,
                 Verdict::RecordingIncomplete})
    if (text == verdictName(v)) return v;
  return std::nullopt;
}

namespace {

using Clock = std::chrono::steady_clock;
double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

bool sameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// ---- The instrumented step: every op's outputs checked for NaN/Inf --------------------------

/// The probe of the target step. It checks every op's outputs for NaN/Inf and, for ops
/// bisection, keeps (capture) or compares (reference) the outputs of the step's outermost ops:
/// those the program or an autograd node calls directly, whose sequence is the same whatever
/// the dtype (the kernels they dispatch to below are not).
struct OuterOutput {
  std::string name;
  at::Tensor value;  ///< float64 copy of the first floating output; undefined when none
};
struct Probe {
  uint64_t ops = 0;
  std::optional<NonFiniteOp> found;
  uint64_t outer = 0;
  std::vector<OuterOutput>* capture = nullptr;
  const std::vector<OuterOutput>* reference = nullptr;
  double tolerance = 0;
  uint64_t compared = 0;
  std::optional<DepartingOp> departing;
  std::string stopped;
};
Probe* gProbe = nullptr;
thread_local bool tInside = false;
thread_local int tBackwardDepth = 0;
thread_local int tDepth = 0;  ///< op nesting, counted from the step or from the autograd node
thread_local std::vector<int> tSavedDepth;

ValueStats statsOf(const at::Tensor& t) {
  ValueStats s;
  s.dtype = c10::toString(t.scalar_type());
  s.shape.assign(t.sizes().begin(), t.sizes().end());
  if (t.numel() == 0) return s;
  at::Tensor v = t.detach();
  if (v.is_floating_point() || v.is_complex()) {
    if (v.is_complex()) v = at::abs(v);
    s.nanCount = at::isnan(v).sum().item<int64_t>();
    s.infCount = at::isinf(v).sum().item<int64_t>();
    auto finite = v.masked_select(at::isfinite(v));
    if (finite.numel()) {
      s.min = finite.min().item<double>();
      s.max = finite.max().item<double>();
    }
  } else if (v.scalar_type() != at::kBool) {
    s.min = v.min().item<double>();
    s.max = v.max().item<double>();
  }
  return s;
}

/// Ops whose outputs are uninitialised memory by definition (an allocation, or a restride of
/// one): garbage NaNs there are not a finding.
bool allocates(const char* name) {
  if (!name) return false;
  for (const char* prefix : {"aten::empty", "aten::new_empty", "aten::_empty", "aten::as_strided", "aten::resize",
                             "aten::set_", "aten::empty_like", "aten::empty_strided"})
    if (std::strncmp(name, prefix, std::strlen(prefix)) == 0) return true;
  return false;
}

/// Ops that move or re-view values without computing: a NaN they pass on was made elsewhere,
/// so the first *computing* op is named instead (the one the user can act on).
bool movesOnly(const char* name) {
  static const std::vector<std::string> names = {
      "aten::resolve_conj", "aten::resolve_neg", "aten::view",     "aten::reshape",   "aten::_reshape_alias",
      "aten::t",            "aten::transpose",   "aten::permute",  "aten::contiguous", "aten::clone",
      "aten::to",           "aten::_to_copy",    "aten::copy_",    "aten::detach",     "aten::alias",
      "aten::expand",       "aten::expand_as",   "aten::slice",    "aten::select",     "aten::narrow",
      "aten::squeeze",      "aten::unsqueeze",   "aten::flatten",  "aten::lift_fresh", "aten::numpy_T",
      "aten::index_select", "aten::stack",       "aten::cat",      "aten::split",      "aten::chunk",
      "aten::unbind",       "aten::as_strided"};
  return name && std::find(names.begin(), names.end(), name) != names.end();
}

bool nonFinite(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0 || !(t.is_floating_point() || t.is_complex())) return false;
  return !at::isfinite(t.detach()).all().item<bool>();
}

template <typename Values, typename Fn>
void eachTensor(const Values& values, Fn&& fn) {
  for (const c10::IValue& v : values) {
    if (v.isTensor()) {
      fn(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) fn(t);
    }
  }
}

/// Per op call: the input tensors as they were when it started (for boxed calls, the
/// TorchScript interpreter's, the end callback's inputs() already show the outputs in their
/// place), and whether it is an outermost op.
struct OpCall : at::ObserverContext {
  std::vector<at::Tensor> tensors;
  bool outer = false;
};

std::unique_ptr<at::ObserverContext> onOpStart(const at::RecordFunction& fn) {
  if (tInside || !gProbe) return nullptr;
  auto ctx = std::make_unique<OpCall>();
  ctx->outer = tDepth++ == 0;
  if (!gProbe->found) {
    try {
      eachTensor(formats::torch::opArguments(fn), [&](const at::Tensor& t) {
        if (t.defined() && ctx->tensors.size() < 8) ctx->tensors.push_back(t);
      });
    } catch (...) {
    }
  }
  return ctx;
}

/// Compares an outermost op's output with the float64 reference's output at the same place.
void compareOuter(Probe& p, const char* name, const at::Tensor& out, const std::string& phase) {
  uint64_t index = p.outer;
  if (index >= p.reference->size()) {
    p.stopped = fmt::format("the reference ran {} outermost ops, this replay more", p.reference->size());
    return;
  }
  const OuterOutput& ref = (*p.reference)[index];
  if (ref.name != name) {
    p.stopped = fmt::format("op sequences differ at outermost op {}: {} here, {} in the reference", index, name, ref.name);
    return;
  }
  if (!out.defined() || !ref.value.defined() || allocates(name)) return;
  if (out.sizes() != ref.value.sizes()) {
    p.stopped = fmt::format("{} (outermost op {}) has shape {} here and {} in the reference", name, index,
                            c10::str(out.sizes()), c10::str(ref.value.sizes()));
    return;
  }
  ++p.compared;
  at::Tensor got = out.detach().to(at::kCPU, at::kDouble);
  const at::Tensor& want = ref.value;
  at::Tensor gotFinite = at::isfinite(got), wantFinite = at::isfinite(want);
  at::Tensor oneOnly = (gotFinite != wantFinite) | (at::isnan(got) != at::isnan(want));
  at::Tensor both = gotFinite & wantFinite;
  at::Tensor diff = (got - want).abs().masked_fill(~both, 0);
  double scale = want.numel() ? want.abs().masked_fill(~wantFinite, 0).max().item<double>() : 0;
  if (scale == 0) scale = 1;
  double error = diff.numel() ? diff.max().item<double>() / scale : 0;
  int64_t beyond = (diff > p.tolerance * scale).sum().item<int64_t>() + oneOnly.sum().item<int64_t>();
  if (beyond == 0) return;
  DepartingOp d;
  d.name = name;
  d.phase = phase;
  d.index = index;
  d.error = oneOnly.any().item<bool>() ? INFINITY : error;
  d.elements = beyond;
  d.replayed = statsOf(out);
  d.reference = statsOf(want);
  p.departing = std::move(d);
}

void onOpEnd(const at::RecordFunction& fn, at::ObserverContext* context) {
  if (tInside || !gProbe) return;
  auto* call = dynamic_cast<OpCall*>(context);
  if (call && tDepth > 0) --tDepth;
  tInside = true;
  {
    at::DisableRecordFunctionGuard quiet;  // the probe's own ops are not the step's
    try {
      uint64_t index = gProbe->ops++;
      const char* name = fn.name() ? fn.name() : "?";
      bool engine = std::strncmp(name, "autograd::engine::", 18) == 0;
      std::string phase = tBackwardDepth > 0 || engine ? "backward" : "forward";
      if (!gProbe->found && !allocates(fn.name()) && !movesOnly(fn.name())) {
        bool bad = false;
        eachTensor(formats::torch::opResults(fn), [&](const at::Tensor& t) { bad = bad || nonFinite(t); });
        if (bad) {
          NonFiniteOp op;
          op.name = name;
          op.phase = phase;
          op.seq = fn.seqNr();
          op.index = index;
          if (call)
            for (const auto& t : call->tensors) op.inputs.push_back(statsOf(t));
          eachTensor(formats::torch::opResults(fn), [&](const at::Tensor& t) {
            if (t.defined() && op.outputs.size() < 8) op.outputs.push_back(statsOf(t));
          });
          gProbe->found = std::move(op);
        }
      }
      if (call && call->outer && (gProbe->capture || gProbe->reference)) {
        at::Tensor first;
        eachTensor(formats::torch::opResults(fn), [&](const at::Tensor& t) {
          if (!first.defined() && t.defined() && t.is_floating_point()) first = t;
        });
        if (gProbe->capture) {
          gProbe->capture->push_back({name, first.defined() ? first.detach().to(at::kCPU, at::kDouble).clone() : at::Tensor()});
        } else if (gProbe->stopped.empty() && !gProbe->departing) {
          compareOuter(*gProbe, name, first, phase);
        }
        ++gProbe->outer;
      }
    } catch (...) {
      // An observer must never throw into the op it observes.
    }
  }
  tInside = false;
}

std::unique_ptr<at::ObserverContext> onBackwardStart(const at::RecordFunction&) {
  ++tBackwardDepth;
  tSavedDepth.push_back(tDepth);
  tDepth = 0;  // the ops an autograd node calls are outermost
  return nullptr;
}
void onBackwardEnd(const at::RecordFunction&, at::ObserverContext*) {
  if (tBackwardDepth > 0) --tBackwardDepth;
  if (!tSavedDepth.empty()) {
    tDepth = tSavedDepth.back();
    tSavedDepth.pop_back();
  }
}

/// Installs the probe for one scope (the target step).
class ProbeScope {
 public:
  explicit ProbeScope(Probe& p) {
    gProbe = &p;
    ops_ = at::addGlobalCallback(at::RecordFunctionCallback(&onOpStart, &onOpEnd)
                                     .needsInputs(true)
                                     .needsOutputs(true)
                                     .scopes({at::RecordScope::FUNCTION}));
    backward_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&onBackwardStart, &onBackwardEnd).scopes({at::RecordScope::BACKWARD_FUNCTION}));
  }
  ~ProbeScope() {
    at::removeCallback(ops_);
    at::removeCallback(backward_);
    gProbe = nullptr;
    tDepth = 0;
    tBackwardDepth = 0;
    tSavedDepth.clear();
  }

 private:
  at::CallbackHandle ops_ = 0, backward_ = 0;
};

at::Tensor lossOf(const c10::IValue& out) {
  if (out.isTensor()) return out.toTensor();
  if (out.isTuple()) return out.toTupleRef().elements().at(0).toTensor();
  if (out.isGenericDict()) return out.toGenericDict().at("loss").toTensor();
  throw Error(ErrorCode::Unsupported, "the step program returned neither a tensor, a tuple nor a dict with \"loss\"");
}

}  // namespace

std::optional<FirstFailure> firstFailure(const std::vector<StepReplay>& steps) {
  for (const auto& s : steps) {
    if (!s.error.empty()) return FirstFailure{s.step, "error"};
    if (!std::isfinite(s.loss)) return FirstFailure{s.step, "loss"};
    if (s.hasGradNorm && !std::isfinite(s.gradNorm)) return FirstFailure{s.step, "grad_norm"};
    if (!s.weightsFinite) return FirstFailure{s.step, "weights"};
  }
  return std::nullopt;
}

std::vector<std::string> availableDevices() {
  std::vector<std::string> devices = {"cpu"};
  if (at::hasCUDA())
    for (int k = 0; k < at::detail::getCUDAHooks().getNumGPUs(); ++k) devices.push_back(fmt::format("cuda:{}", k));
  testing::installFaultInjection();
  for (const auto& d : testing::fakeDevices())
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  return devices;
}

namespace {

/// The device a replay runs on: its name, and where its tensors live (a fake device of the
/// fault-injection hook lives on the CPU).
struct Placement {
  std::string name;
  c10::Device device = c10::Device(c10::kCPU);
};

Placement place(const std::string& requested, const std::string& recorded) {
  auto devices = availableDevices();
  auto have = [&](const std::string& d) { return std::find(devices.begin(), devices.end(), d) != devices.end(); };
  std::string name = requested;
  if (name.empty()) name = !recorded.empty() && have(recorded) ? recorded : "cpu";
  if (name == "cuda") name = "cuda:0";
  if (!have(name)) {
    std::string why = name.rfind("cuda", 0) == 0
                          ? (at::hasCUDA() ? fmt::format("this machine has {} CUDA device(s)", at::detail::getCUDAHooks().getNumGPUs())
                                           : "this LibTorch has no CUDA support or no CUDA device is visible")
                          : "it is not a device crashcap knows";
    throw Error(ErrorCode::Unsupported, fmt::format("cannot replay on {}: {}", name, why),
                fmt::format("devices here: {}", fmt::join(devices, ", ")));
  }
  Placement p;
  p.name = name;
  if (!testing::isFakeDevice(name)) p.device = c10::Device(name);
  return p;
}

using Batch = std::vector<std::pair<std::string, at::Tensor>>;

/// What replay runs: the model's named state, the batch tensors a step feeds it, and its loss
/// for one batch (forward and loss; backward and the optimizer are the engine's).
struct Program {
  std::map<std::string, at::Tensor> params, buffers;
  std::function<std::vector<std::string>(const formats::StepBeginData&)> inputs;
  std::function<at::Tensor(const Batch&)> loss;
  bool torchScript = false;  ///< run by TorchScript's graph executor (see warmUp)
};
using ProgramFactory = std::function<Program(const formats::BundleReader&, const formats::BundleRecords&)>;

/// The TorchScript step program stored in the bundle.
Program loadTorchScript(const formats::BundleReader& reader, const formats::BundleRecords& view) {
  if (view.program->format != "torchscript")
    throw Error(ErrorCode::Unsupported, fmt::format("the recording has no TorchScript step program (format '{}')", view.program->format),
                "it was recorded with Recorder::setModel: replay it with the model and its step function, "
                "replayer::replay(bundle, model, step) (crashcap/replayer/replay_module.hpp), or with `crashcap replay` "
                "when the program gave its step to Recorder::setStep");
  auto archive = reader.readTensor(reader.get(view.program->archive));
  std::istringstream in(std::string(archive.begin(), archive.end()));
  torch::jit::Module module = torch::jit::load(in);
  module.train();
  Program p;
  p.torchScript = true;
  for (const auto& t : module.named_parameters(true)) p.params[t.name] = t.value;
  for (const auto& t : module.named_buffers(true)) p.buffers[t.name] = t.value;
  std::vector<std::string> names = view.program->inputs;
  p.inputs = [names](const formats::StepBeginData&) { return names; };
  p.loss = [module](const Batch& batch) mutable {
    std::vector<c10::IValue> args;
    for (const auto& [name, t] : batch) args.emplace_back(t);
    return lossOf(module.forward(args));
  };
  return p;
}

/// `wideAtTarget`: the steps before the target run as recorded, then the state is widened to
/// float64 for the target step alone (the reference of ops bisection: same starting point,
/// only the target step's arithmetic differs).
ReplayResult replayWith(const std::string& bundle, const ReplayOptions& options, Probe& probe, const ProgramFactory& makeProgram,
                        bool wideAtTarget = false) {
  ReplayResult result;
  result.rows = options.rows;
  auto t0 = Clock::now();
  testing::installFaultInjection();
  auto reader = formats::BundleReader::open(bundle);
  auto view = formats::readRecords(*reader);
  if (!view.program)
    throw Error(ErrorCode::Unsupported, fmt::format("{} has no step program record", bundle),
                "record with Recorder::setProgram (TorchScript), or Recorder::setModel with Recorder::setStep");
  if (!view.optimizer) throw Error(ErrorCode::Unsupported, fmt::format("{} has no optimizer spec", bundle));
  if (view.stepBegins.empty()) throw Error(ErrorCode::NotFound, fmt::format("{} holds no recorded steps", bundle));
  if (!options.dtype.empty() && options.dtype != "float64")
    throw Error(ErrorCode::InvalidArgument, fmt::format("dtype '{}' is not one replay knows", options.dtype),
                "replay as recorded (no --dtype) or in --dtype float64");

  int64_t target = options.step;
  if (target < 0) target = view.crash && view.crash->step >= 0 ? view.crash->step : view.stepBegins.back().step;
  std::map<int64_t, const formats::StepBeginData*> begins;
  std::map<int64_t, const formats::StepEndData*> ends;
  for (const auto& b : view.stepBegins) begins[b.step] = &b;
  for (const auto& e : view.stepEnds) ends[e.step] = &e;
  const std::vector<int64_t> lost = formats::lostSteps(view);
  const bool targetLost = std::binary_search(lost.begin(), lost.end(), target);
  if (!begins.count(target) && !targetLost)
    throw Error(ErrorCode::NotFound,
                fmt::format("step {} is not in {} (it holds steps {}..{})", target, bundle, view.stepBegins.front().step,
                            view.stepBegins.back().step));
  // From the earliest keyframe (bisect steps follows the weights as far back as they go), but
  // not across a step the recording lost when a later keyframe avoids it.
  int64_t notBefore = INT64_MIN;
  if (options.fromEarliestKeyframe)
    for (int64_t s : lost)
      if (s < target) notBefore = std::max(notBefore, s + 1);
  const formats::KeyframeData* keyframe = nullptr;
  for (int pass = 0; pass < 2 && !keyframe; ++pass, notBefore = INT64_MIN)
    for (const auto& k : view.keyframes)
      if (k.step <= target && k.step >= notBefore &&
          (!keyframe || (options.fromEarliestKeyframe ? k.step < keyframe->step : k.step > keyframe->step)))
        keyframe = &k;
  if (!keyframe)
    throw Error(ErrorCode::NotFound, fmt::format("no keyframe at or before step {} in {}", target, bundle),
                "retention may have deleted it; record with a larger retainSegments");
  result.step = target;
  result.keyframe = keyframe->step;
  // A step the recording lost cannot be replayed, and every step after it would start from the
  // wrong state: replay stops before the first lost step of the window and says so.
  for (int64_t s : lost)
    if (s >= keyframe->step && s <= target) result.lostSteps.push_back(s);
  const int64_t stopBefore = result.lostSteps.empty() ? target + 1 : result.lostSteps.front();
  if (view.crash && view.crash->step == target) result.recordedError = view.crash->error;

  // Where and how: the recorded device, dtype and settings unless the options say otherwise.
  result.recordedDevice = view.program->device;
  Placement placement = place(options.device, result.recordedDevice);
  result.device = placement.name;
  bool wide = options.dtype == "float64";
  result.dtype = wide ? "float64" : wideAtTarget ? "float64 (target step)" : "as-recorded";
  auto env = reader->environment();
  for (const auto& name : formats::torch::settingNames())
    if (env && !env->fact(name).empty()) result.recordedSettings[name] = env->fact(name);
  result.settings = result.recordedSettings;
  for (const auto& [name, value] : options.settings) result.settings[name] = value;
  for (const auto& [name, value] : result.settings) formats::torch::applySetting(name, value);
  result.threads = at::get_num_threads();
  torch::jit::setGraphExecutorOptimize(env && env->fact("torch.jit.graph_executor_optimize") == "true");
  result.sameSetup = !wide && !wideAtTarget && result.settings == result.recordedSettings &&
                     result.device == (result.recordedDevice.empty() ? "cpu" : result.recordedDevice);
  testing::setFaultDevice(result.device);
  auto onDevice = [&](at::Tensor t) {
    if (wide && t.is_floating_point()) return t.to(placement.device, at::kDouble);
    return t.to(placement.device);
  };

  Program program = makeProgram(*reader, view);
  auto& params = program.params;
  auto& buffers = program.buffers;
  {
    at::NoGradGuard noGrad;  // move the module's state where it runs; the handles stay
    for (auto* state : {&params, &buffers})
      for (auto& [name, t] : *state) t.set_data(onDevice(t));
  }
  std::vector<at::Tensor> ordered;  // the recorder's order, which its gradient norm used
  for (const auto& name : view.program->parameters) {
    if (!params.count(name))
      throw Error(ErrorCode::Corrupt, fmt::format("the recording names parameter '{}', which the model lacks", name));
    ordered.push_back(params[name]);
  }

  // TorchScript's optimising graph executor runs a program's first calls as profiling runs and
  // the later ones through the graph it optimised from them, whose arithmetic (fused, reordered)
  // can differ from the profiling runs' in the last bit. Replay makes the calls the recorded
  // process made before the keyframe's step (one per step; as many as the executor profiles
  // before it optimises): forward and backward on the keyframe step's batch, before the keyframe
  // is restored (which overwrites weights, buffers and gradients), with autocast's cache dropped
  // after them. The process's first step is the one whose previous step is -1; when the window no
  // longer holds it, the process made more calls than the executor profiles.
  if (program.torchScript && torch::jit::getGraphExecutorOptimize()) {
    const int64_t profiling = static_cast<int64_t>(torch::jit::getNumProfiledRuns()) + 1;
    int64_t calls = profiling;
    for (auto b = begins.begin(); b != begins.end() && b->first <= keyframe->step; ++b)
      if (b->second->previousStep == -1)
        calls = std::min<int64_t>(profiling, std::distance(b, begins.lower_bound(keyframe->step)));
    auto first = begins.lower_bound(keyframe->step);
    if (calls > 0 && first != begins.end() && first->first < stopBefore) {
      Batch batch;
      for (const auto& input : program.inputs(*first->second))
        batch.emplace_back(input, onDevice(formats::torch::readTensor(*reader, formats::batchTensorName(first->first, input))));
      testing::setFaultStep(-1);
      for (int64_t c = 0; c < calls; ++c) {
        try {
          program.loss(batch).backward();
        } catch (const std::exception&) {
          break;  // the step fails (it is the target): the replay proper reports it
        }
      }
      for (auto& [name, p] : params) p.mutable_grad() = at::Tensor();
      at::autocast::clear_cache();  // the casts of the weights before the keyframe restore
    }
  }

  // Restore the keyframe: weights, buffers, optimizer state.
  auto optimizer = formats::torch::makeOptimizer(*view.optimizer, params);
  {
    at::NoGradGuard noGrad;
    auto restore = [&](const std::string& prefix, std::map<std::string, at::Tensor>& into) {
      for (auto& [name, t] : into) {
        auto full = formats::keyframeTensorName(keyframe->step, prefix, name);
        if (!reader->find(full))
          throw Error(ErrorCode::NotFound, fmt::format("keyframe {} lacks tensor {}", keyframe->step, full));
        t.copy_(formats::torch::readTensor(*reader, full));
      }
    };
    restore("parameters", params);
    restore("buffers", buffers);
    std::map<std::string, int64_t> counters;
    for (const auto& [key, v] : keyframe->optimizerScalars)
      if (key.size() > 5 && key.substr(key.size() - 5) == "/step") counters[key.substr(0, key.size() - 5)] = int64_t(v);
    for (const auto& [name, p] : params) {
      auto get = [&](const char* key) -> at::Tensor {
        auto full = formats::keyframeTensorName(keyframe->step, "optimizer", name + "/" + key);
        return reader->find(full) ? formats::torch::readTensor(*reader, full).to(p.device(), p.scalar_type()) : at::Tensor();
      };
      formats::torch::restoreParameterState(*optimizer, view.optimizer->kind, p, get, counters[name]);
    }
  }
  result.loadMs = msSince(t0);

  // Replay keyframe..target.
  auto t1 = Clock::now();
  for (auto it = begins.lower_bound(keyframe->step); it != begins.end() && it->first < stopBefore; ++it) {
    const int64_t s = it->first;
    const auto& begin = *it->second;
    StepReplay r;
    r.step = s;
    if (auto e = ends.find(s); e != ends.end()) {
      r.recorded = true;
      r.recordedLoss = e->second->loss;
      r.recordedGradNorm = e->second->gradNorm;
    }
    testing::setFaultStep(s);
    for (const auto& name : begin.rng) {
      std::optional<at::Generator> gen;
      if (name == formats::rngTensorName(s, "cpu")) gen = at::detail::getDefaultCPUGenerator();
      if (placement.device.is_cuda() && name == formats::rngTensorName(s, fmt::format("cuda{}", placement.device.index())))
        gen = at::globalContext().defaultGenerator(placement.device);
      if (!gen) continue;
      std::lock_guard<std::mutex> lock(gen->mutex());
      gen->set_state(formats::torch::readTensor(*reader, name));
    }
    for (size_t g = 0; g < optimizer->param_groups().size() && g < begin.learningRates.size(); ++g)
      optimizer->param_groups()[g].options().set_lr(begin.learningRates[g]);
    if (!begin.learningRates.empty()) r.learningRate = begin.learningRates[0];
    Batch inputs;
    for (const auto& input : program.inputs(begin)) {
      at::Tensor t = formats::torch::readTensor(*reader, formats::batchTensorName(s, input));
      if (s == target) {
        if (inputs.empty()) result.batchSize = t.dim() > 0 ? t.size(0) : 0;
        if (!options.rows.empty() && t.dim() > 0 && t.size(0) == result.batchSize) {
          for (int64_t row : options.rows)
            if (row < 0 || row >= result.batchSize)
              throw Error(ErrorCode::InvalidArgument,
                          fmt::format("row {} is outside the batch of step {} (rows 0..{})", row, s, result.batchSize - 1));
          t = t.index_select(0, at::tensor(options.rows, at::kLong));
        }
      }
      inputs.emplace_back(input, onDevice(t));
    }
    if (s == target && wideAtTarget && !wide) {
      wide = true;
      at::NoGradGuard noGrad;
      for (auto* state : {&params, &buffers})
        for (auto& [name, t] : *state) {
          t.mutable_grad() = at::Tensor();
          t.set_data(onDevice(t));
        }
      for (auto& [name, t] : inputs) t = onDevice(t);
    }
    try {
      optimizer->zero_grad();  // the recipe's, not the step program's ops: outside the probe
      if (s == target && (probe.capture || probe.reference))
        for (auto& [name, p] : params) p.mutable_grad() = at::Tensor();  // both sides assign, not accumulate
      std::optional<ProbeScope> scope;
      if (s == target && (options.instrument || probe.capture || probe.reference)) scope.emplace(probe);
      at::Tensor loss = program.loss(inputs);
      loss.backward();
      scope.reset();
      {
        at::NoGradGuard noGrad;
        at::Tensor l = loss.detach();
        r.loss = l.numel() == 1 ? l.item<double>() : l.sum().item<double>();
        std::vector<at::Tensor> grads;
        for (const auto& p : ordered)
          if (p.grad().defined()) grads.push_back(p.grad().detach());
        if (!grads.empty()) {
          r.gradNorm = at::stack(at::_foreach_norm(grads, 2)).norm().item<double>();
          r.hasGradNorm = true;
        }
      }
      r.bitwise = r.recorded && sameBits(r.loss, r.recordedLoss) && (!r.hasGradNorm || sameBits(r.gradNorm, r.recordedGradNorm));
      if (s < target) {
        if (view.optimizer->gradClipNorm > 0)
          torch::nn::utils::clip_grad_norm_(ordered, view.optimizer->gradClipNorm, view.optimizer->gradClipNormType);
        optimizer->step();
        at::NoGradGuard noGrad;
        std::vector<at::Tensor> weights, wide;
        for (const auto& p : ordered) {
          weights.push_back(p.detach());
          wide.push_back(p.detach().to(at::kDouble));  // float32 squares overflow long before the weights do
        }
        r.weightNorm = at::stack(at::_foreach_norm(wide, 2)).norm().item<double>();
        r.weightsFinite = std::all_of(weights.begin(), weights.end(),
                                      [](const at::Tensor& w) { return at::isfinite(w).all().item<bool>(); });
      }
    } catch (const std::exception& e) {
      r.error = formats::torch::errorMessage(e);  // as the recorder kept it: no C++ backtrace
    }
    // A training under autocast leaves its autocast region every step, which drops the cache of
    // weights cast to the lower precision; replay does the same, or every later step would run
    // on the first step's casts of weights that have since been updated.
    at::autocast::clear_cache();
    if (s == target && probe.found) result.firstNonFiniteOp = probe.found;
    result.steps.push_back(r);
    // Only the same setup can be held to the recording's bits; any setup to its errors.
    bool departs = !r.error.empty() || (result.sameSetup && r.recorded && !r.bitwise);
    if (s < target && !result.divergedAt && departs) result.divergedAt = s;
  }
  result.replayMs = msSince(t1);
  if (!result.lostSteps.empty()) {
    result.verdict = Verdict::RecordingIncomplete;
    return result;
  }

  // The verdict, against what the recording says happened at the target.
  const StepReplay& last = result.steps.back();
  bool replayNonFinite = last.error.empty() && (!std::isfinite(last.loss) || (last.hasGradNorm && !std::isfinite(last.gradNorm)));
  result.error = !last.error.empty() ? last.error
                 : replayNonFinite   ? fmt::format("non-finite loss at step {}: {}", target, last.loss)
                                     : "";
  bool recordedFailure = view.crash && view.crash->step == target;
  bool allBitwise = true;
  for (const auto& r : result.steps) allBitwise = allBitwise && (r.bitwise || (!r.recorded && r.step == target));
  if (result.divergedAt) {
    result.verdict = Verdict::Diverged;
  } else if (recordedFailure) {
    const auto& kind = view.crash->kind;
    bool sameClass = (kind == "nonfinite" && replayNonFinite) ||
                     ((kind == "exception" || kind == "terminate") && !last.error.empty());
    if (!sameClass) {
      result.verdict = Verdict::NotReproduced;
    } else {
      bool sameText = kind == "nonfinite" ? (last.recorded ? last.bitwise : true)
                                          : lastLine(last.error) == lastLine(view.crash->error);
      result.verdict = allBitwise && sameText && result.sameSetup ? Verdict::ReproducedBitwise : Verdict::Reproduced;
    }
  } else {
    // No failure recorded here: replay reproduces the recording, or departs from it.
    if (last.recorded && !last.bitwise && result.sameSetup) result.divergedAt = target;
    result.verdict = result.divergedAt || !last.error.empty() ? Verdict::Diverged
                     : result.sameSetup && allBitwise           ? Verdict::ReproducedBitwise
                                                                : Verdict::Reproduced;
    if (!last.error.empty() && !result.divergedAt) result.divergedAt = target;
  }
  return result;
}

}  // namespace

ReplayResult replay(const std::string& bundle, const ReplayOptions& options) {
  Probe probe;
  return replayWith(bundle, options, probe, loadTorchScript);
}

namespace {

/// The program of a setModel recording: the caller's named tensors and step function. Each call
/// first puts the tensors back into the dtype and onto the device they had when the factory was
/// made, so that a second replay (the ops bisection's) does not start from the first one's
/// float64 widening.
/// Where a named tensor started: its dtype and device.
struct Origin {
  at::Tensor tensor;
  c10::ScalarType dtype;
  c10::Device device;
};
std::vector<Origin> originsOf(const NamedTensors& parameters, const NamedTensors& buffers) {
  std::vector<Origin> origins;
  for (const auto* list : {&parameters, &buffers})
    for (const auto& [name, t] : *list) origins.push_back({t, t.scalar_type(), t.device()});
  return origins;
}
void putBack(const std::vector<Origin>& origins) {
  at::NoGradGuard noGrad;
  for (const auto& o : origins)
    if (o.tensor.scalar_type() != o.dtype || o.tensor.device() != o.device) {
      o.tensor.mutable_grad() = at::Tensor();
      o.tensor.set_data(o.tensor.to(o.device, o.dtype));
    }
}

ProgramFactory namedProgram(const std::string& bundle, const NamedTensors& parameters, const NamedTensors& buffers,
                            const StepFunction& step) {
  auto origins = originsOf(parameters, buffers);
  return [=](const formats::BundleReader&, const formats::BundleRecords& view) {
    if (view.program->format != "module")
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("{} was recorded with a step program ({}): replay it with replay(bundle)", bundle,
                              view.program->format));
    putBack(origins);
    Program p;
    for (const auto& [name, t] : parameters) p.params[name] = t;
    for (const auto& [name, t] : buffers) p.buffers[name] = t;
    p.inputs = [](const formats::StepBeginData& begin) {
      std::vector<std::string> names;
      const std::string prefix = formats::batchTensorName(begin.step, "");
      for (const auto& full : begin.batch) names.push_back(full.substr(prefix.size()));
      return names;
    };
    p.loss = [step](const Batch& batch) {
      std::map<std::string, at::Tensor> named(batch.begin(), batch.end());
      return step(named);
    };
    return p;
  };
}

NamedTensors namedState(const torch::OrderedDict<std::string, at::Tensor>& items) {
  NamedTensors out;
  for (const auto& item : items) out.emplace_back(item.key(), item.value());
  return out;
}

/// Ops bisection over any program: the float64 reference first, then the replay compared with it.
ReferenceComparison compareWith(const std::string& bundle, ReplayOptions options, double tolerance,
                                const ProgramFactory& makeProgram) {
  ReferenceComparison c;
  c.tolerance = tolerance;
  std::vector<OuterOutput> outputs;
  {
    ReplayOptions ro = options;
    ro.device = "cpu";
    ro.dtype.clear();
    Probe probe;
    probe.capture = &outputs;
    c.reference = replayWith(bundle, ro, probe, makeProgram, /*wideAtTarget=*/true);
  }
  Probe probe;
  probe.reference = &outputs;
  probe.tolerance = tolerance;
  c.replay = replayWith(bundle, options, probe, makeProgram);
  c.opsCompared = probe.compared;
  c.firstDeparting = probe.departing;
  c.stoppedBecause = probe.stopped;
  return c;
}

}  // namespace

ReplayResult replay(const std::string& bundle, const NamedTensors& parameters, const NamedTensors& buffers,
                    const StepFunction& step, const ReplayOptions& options) {
  Probe probe;
  return replayWith(bundle, options, probe, namedProgram(bundle, parameters, buffers, step));
}

ReplayResult replay(const std::string& bundle, torch::nn::Module& model, const StepFunction& step,
                    const ReplayOptions& options) {
  model.train();
  return replay(bundle, namedState(model.named_parameters(true)), namedState(model.named_buffers(true)), step, options);
}

ReferenceComparison compareWithReference(const std::string& bundle, const NamedTensors& parameters,
                                         const NamedTensors& buffers, const StepFunction& step, ReplayOptions options,
                                         double tolerance) {
  // The model ends as it began, however the comparison ends.
  struct PutBack {
    std::vector<Origin> origins;
    ~PutBack() {
      try {
        putBack(origins);
      } catch (...) {
      }
    }
  } restore{originsOf(parameters, buffers)};
  return compareWith(bundle, std::move(options), tolerance, namedProgram(bundle, parameters, buffers, step));
}

ReferenceComparison compareWithReference(const std::string& bundle, ReplayOptions options, double tolerance) {
  return compareWith(bundle, std::move(options), tolerance, loadTorchScript);
}

}  // namespace crashcap::replayer
