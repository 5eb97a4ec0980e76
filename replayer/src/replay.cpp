#include "crashcap/replayer/replay.hpp"
#include "crashcap/replayer/replay_module.hpp"
#include "crashcap/replayer/driven_replay.hpp"
#include "crashcap/replayer/batch_cut.hpp"
#include "crashcap/replayer/no_steps.hpp"
#include "crashcap/formats/observed_run.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/record_function.h>
#include <c10/core/DefaultDtype.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim.h>
#include <torch/version.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <chrono>
#include <cmath>
#include <limits>
#include <exception>
#include <regex>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/nan_sign.hpp"
#include "crashcap/formats/python_frames.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/torch/errors.hpp"
#include "crashcap/formats/torch/fingerprint.hpp"
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

const char* comparisonSideName(ComparisonSide side) {
  switch (side) {
    case ComparisonSide::Both: return "both";
    case ComparisonSide::Reference: return "reference";
    case ComparisonSide::Replay: return "replay";
  }
  return "both";
}

std::optional<ReplayProgress> readReplayProgress(const std::string& path) {
  if (path.empty()) return std::nullopt;
  std::ifstream in(path);
  if (!in) return std::nullopt;
  ReplayProgress p;
  std::string word;
  int64_t value = -1;
  while (in >> word >> value) {
    if (word == "keyframe") p.keyframe = value;
    if (word == "step") p.step = value;
  }
  return p;
}

ComparisonSide parseComparisonSide(const std::string& text) {
  for (auto s : {ComparisonSide::Both, ComparisonSide::Reference, ComparisonSide::Replay})
    if (text == comparisonSideName(s)) return s;
  throw Error(ErrorCode::Corrupt, fmt::format("'{}' is not a side of an ops bisection (both, reference, replay)", text));
}

namespace {

using Clock = std::chrono::steady_clock;
double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

bool sameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

/// How a loading crash's batch was loaded again, for the replay's notes.
std::string loadedAgainText(const BatchLoad& load) {
  return fmt::format("loaded again here from its {} recorded dataset indices as the program's loader loads it (its "
                     "dataset and collate function, in a worker process when it had workers)",
                     load.indices.size());
}

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
  std::optional<ProbedOp> found;
  std::optional<ProbedOp> raising;
  bool deliberateInfinity = false;  ///< an op of the step filled with an infinity it was given
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
thread_local int tEngineDepth = 0;  ///< open autograd::engine:: scopes
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

/// Ops that draw random numbers: in float64 the same generator state gives other numbers than in
/// float32 (another sampling path), so a departure there is the draw's, not precision's, and every
/// op after it computes on other values.
bool drawsRandom(const char* name) {
  if (!name) return false;
  for (const char* prefix : {"aten::rand", "aten::normal", "aten::bernoulli", "aten::uniform", "aten::multinomial",
                             "aten::exponential", "aten::cauchy", "aten::log_normal", "aten::geometric",
                             "aten::poisson", "aten::random_", "aten::dropout", "aten::feature_dropout",
                             "aten::alpha_dropout", "aten::native_dropout", "aten::rrelu"})
    if (std::strncmp(name, prefix, std::strlen(prefix)) == 0) return true;
  return false;
}

/// Ops that move or re-view values without computing: a NaN they pass on was made elsewhere,
/// so the first *computing* op is named instead (the one the user can act on). A cast that makes
/// infinities of finite values computes (castsPastRange).
bool movesOnly(const char* name) {
  static const std::vector<std::string> names = {
      "aten::resolve_conj", "aten::resolve_neg", "aten::view",     "aten::reshape",   "aten::_reshape_alias",
      "aten::t",            "aten::transpose",   "aten::permute",  "aten::contiguous", "aten::clone",
      "aten::to",           "aten::_to_copy",    "aten::copy_",    "aten::detach",     "aten::alias",
      "aten::expand",       "aten::expand_as",   "aten::slice",    "aten::select",     "aten::narrow",
      "aten::squeeze",      "aten::unsqueeze",   "aten::flatten",  "aten::lift_fresh", "aten::numpy_T",
      "aten::index_select", "aten::stack",       "aten::cat",      "aten::split",      "aten::chunk",
      "aten::unbind",       "aten::as_strided",  "aten::broadcast_tensors", "aten::broadcast_to", "aten::repeat",
      "aten::tile",         "aten::movedim",     "aten::view_as",  "aten::reshape_as", "aten::unflatten"};
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
  std::vector<UnalignableTarget> unalignable;  ///< a CTC loss's, told from its arguments as it began
  bool meantInfinity = false;                  ///< a CTC loss with zero_infinity
  std::optional<EmptyMean> emptyMean;          ///< an nll_loss's none of whose targets counts, told as it began
  bool outer = false;
  uint64_t began = 0;  ///< the probe's op count as it began (ProbedOp::began)
  int unwinding = 0;  ///< std::uncaught_exceptions() as it began: more at its end, it raised
};

/// An outermost cast (`aten::to`: a `.float()` the step calls, or one autograd calls for a cast's
/// gradient) that makes non-finite values of finite ones: a narrowing of values past the narrower
/// dtype's range (a `.float()` of 1e39). Unlike the other moves it computes, and its infinities
/// are made there. The casts inside another op (a scalar argument converted to the op's dtype,
/// autocast's) are that op's own; a copy_ into a narrower tensor stays a move.
bool castsPastRange(const char* name, const OpCall* call, const at::RecordFunction& fn) {
  if (!call || !call->outer || !name || (std::strcmp(name, "aten::to") != 0 && std::strcmp(name, "aten::_to_copy") != 0))
    return false;
  if (call->tensors.empty() || nonFinite(call->tensors.front())) return false;  // the tensor cast (not `other`)
  bool made = false;
  eachTensor(formats::torch::opResults(fn), [&](const at::Tensor& t) { made = made || nonFinite(t); });
  return made;
}

/// The op was given an infinite scalar (masked_fill(mask, -inf), fill_(inf), full(..., -inf)): the
/// infinities it writes are what the program asked for.
bool givenInfinity(const at::RecordFunction& fn) {
  for (const c10::IValue& v : formats::torch::opArguments(fn))
    if (v.isDouble() && std::isinf(v.toDouble())) return true;
  return false;
}

bool holdsNaN(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0 || !(t.is_floating_point() || t.is_complex())) return false;
  return at::isnan(t.detach()).any().item<bool>();
}

/// A CTC loss's forward (aten::ctc_loss, its _ctc_loss kernel, cuDNN's), whose first four
/// arguments are log_probs, targets, input_lengths and target_lengths.
bool ctcLoss(const char* name) {
  if (!name || std::strstr(name, "backward")) return false;
  for (const char* prefix : {"aten::ctc_loss", "aten::_ctc_loss", "aten::_cudnn_ctc_loss", "aten::miopen_ctc_loss"})
    if (std::strncmp(name, prefix, std::strlen(prefix)) == 0) return true;
  return false;
}

/// Lengths given as an int list or as a tensor.
std::optional<std::vector<int64_t>> lengthsOf(const c10::IValue& v) {
  if (v.isIntList()) return v.toIntVector();
  if (!v.isTensor() || v.toTensor().dim() != 1 || v.toTensor().is_floating_point()) return std::nullopt;
  at::Tensor t = v.toTensor().detach().to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

/// A CTC loss called with zero_infinity (each overload's last bool argument): the infinite loss
/// of a target it cannot align is set to 0 after the kernel (ctc_loss's own where), so the
/// kernel's infinity is meant.
bool zeroesInfinity(const at::RecordFunction& fn) {
  const auto args = formats::torch::opArguments(fn);
  for (size_t i = args.size(); i-- > 4;)
    if (args[i].isBool()) return args[i].toBool();
  return false;
}

/// The elements of a CTC loss's batch whose targets cannot be aligned with their inputs. Targets
/// are padded ([batch, longest]) or concatenated (1-D, in the order of target_lengths).
std::vector<UnalignableTarget> unalignableTargets(const at::RecordFunction& fn) {
  std::vector<UnalignableTarget> out;
  const auto args = formats::torch::opArguments(fn);
  if (args.size() < 4 || !args[1].isTensor()) return out;
  auto inputs = lengthsOf(args[2]), targets = lengthsOf(args[3]);
  at::Tensor labels = args[1].toTensor().detach();
  if (!inputs || !targets || inputs->size() != targets->size() || labels.dim() < 1 || labels.dim() > 2) return out;
  labels = labels.to(at::kCPU, at::kLong).contiguous();
  const int64_t* l = labels.data_ptr<int64_t>();
  const int64_t stride = labels.dim() == 2 ? labels.size(1) : 0;
  int64_t offset = 0;
  for (size_t b = 0; b < targets->size(); ++b) {
    const int64_t length = (*targets)[b];
    const int64_t start = labels.dim() == 2 ? static_cast<int64_t>(b) * stride : offset;
    offset += length;
    if (length < 0 || start + length > labels.numel() || (stride && length > stride)) return {};  // the op's own error
    int64_t needed = length;
    for (int64_t i = 1; i < length; ++i) needed += l[start + i] == l[start + i - 1];
    if (needed > (*inputs)[b]) out.push_back({static_cast<int64_t>(b), length, needed, (*inputs)[b]});
  }
  return out;
}

/// A negative log-likelihood's forward kernel (cross_entropy's, nll_loss's), whose arguments are
/// input, target, weight, reduction and ignore_index.
bool nllLoss(const char* name) {
  return name && (std::strcmp(name, "aten::nll_loss_forward") == 0 || std::strcmp(name, "aten::nll_loss2d_forward") == 0);
}

/// An nll_loss with reduction='mean' none of whose targets counts, each being ignore_index or of a
/// class whose weight is 0: it divides a sum of nothing by a total weight of 0.
std::optional<EmptyMean> uncountedTargets(const at::RecordFunction& fn) {
  constexpr int64_t kMean = 1;  // at::Reduction::Mean
  const auto args = formats::torch::opArguments(fn);
  if (args.size() < 5 || !args[1].isTensor() || !args[3].isInt() || !args[4].isInt() || args[3].toInt() != kMean)
    return std::nullopt;
  const at::Tensor target = args[1].toTensor().detach().reshape({-1});
  const at::Tensor counted = target != args[4].toInt();
  const at::Tensor classes = target.masked_select(counted);
  if (classes.numel() > 0) {
    if (!args[2].isTensor() || !args[2].toTensor().defined()) return std::nullopt;
    const at::Tensor weight = args[2].toTensor().detach();
    if (classes.min().item<int64_t>() < 0 || classes.max().item<int64_t>() >= weight.numel())
      return std::nullopt;  // the op's own error
    if (weight.index_select(0, classes.to(weight.device())).ne(0).any().item<bool>()) return std::nullopt;
  }
  EmptyMean m;
  m.empty = target.numel() == 0;
  m.targets = target.numel();
  m.ignored = target.numel() - classes.numel();
  m.ignoreIndex = args[4].toInt();
  return m;
}

/// An op that averages what it is given: a mean, a variance, a loss (whose default reduction is
/// the mean). Not its backward.
bool averages(const char* name) {
  if (!name || std::strncmp(name, "aten::", 6) != 0 || std::strstr(name, "backward")) return false;
  const std::string_view n(name + 6);
  auto endsWith = [&](std::string_view tail) { return n.size() >= tail.size() && n.substr(n.size() - tail.size()) == tail; };
  return n.find("mean") != n.npos || n.rfind("var", 0) == 0 || n.rfind("std", 0) == 0 || endsWith("_loss") ||
         n.find("cross_entropy") != n.npos || n == "kl_div";
}

/// An op that averages (averages()) given only empty tensors as it began: a NaN it, or an op
/// inside it, makes is a mean over nothing (mse_loss(out[mask], y[mask]) with a mask that selected
/// nothing; torch's CPU kernel makes it in the division inside).
bool averagesNothing(const char* name, const OpCall& call) {
  return averages(name) && !call.tensors.empty() &&
         std::all_of(call.tensors.begin(), call.tensors.end(), [](const at::Tensor& t) { return t.defined() && t.numel() == 0; });
}

/// The outermost op under way, when it averages nothing (averagesNothing; its name); "" otherwise.
/// Set as an outermost op begins, cleared as it ends; saved across an autograd node's ops.
thread_local std::string tOuterAveragesNothing;
thread_local std::vector<std::string> tSavedOuterAveragesNothing;
/// The autograd nodes under way ("SqrtBackward0"), innermost last.
thread_local std::vector<std::string> tNodes;

std::unique_ptr<at::ObserverContext> onOpStart(const at::RecordFunction& fn) {
  if (tInside || !gProbe) return nullptr;
  if (fn.name() && std::strncmp(fn.name(), "autograd::engine::", 18) == 0) ++tEngineDepth;
  auto ctx = std::make_unique<OpCall>();
  ctx->outer = tDepth++ == 0;
  ctx->began = gProbe->ops;
  ctx->unwinding = std::uncaught_exceptions();
  if (ctx->outer) tOuterAveragesNothing.clear();
  if (!gProbe->found || (ctx->outer && !gProbe->raising)) {
    try {
      // An in-place op (add_, masked_fill_, log_) overwrites its first argument: a copy keeps the
      // values it started from, or its inputs would show its outputs.
      const size_t length = fn.name() ? std::strlen(fn.name()) : 0;
      const bool inPlace = length > 0 && fn.name()[length - 1] == '_';
      eachTensor(formats::torch::opArguments(fn), [&](const at::Tensor& t) {
        if (!t.defined() || ctx->tensors.size() >= 8) return;
        if (inPlace && ctx->tensors.empty()) {
          at::DisableRecordFunctionGuard quiet;  // the copy is the probe's, not the step's
          ctx->tensors.push_back(t.detach().clone());
        } else {
          ctx->tensors.push_back(t);
        }
      });
      if (ctcLoss(fn.name())) {
        at::DisableRecordFunctionGuard quiet;  // its reads are the probe's, not the step's
        ctx->meantInfinity = zeroesInfinity(fn);
        if (!ctx->meantInfinity) ctx->unalignable = unalignableTargets(fn);
      } else if (nllLoss(fn.name())) {
        at::DisableRecordFunctionGuard quiet;  // its reads are the probe's, not the step's
        ctx->emptyMean = uncountedTargets(fn);
      }
      if (ctx->outer && averagesNothing(fn.name(), *ctx)) tOuterAveragesNothing = fn.name();
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
  // A value that is 0 in exact arithmetic (the gradient of a bias a batch norm follows) is
  // rounding noise on both sides: float64's in the reference, the replayed dtype's here. Against
  // the reference's own tiny largest value any difference looks huge. Both are noise of one
  // scale when the reference is smaller than the replay by about the ratio of the two dtypes'
  // epsilons (2^29 for float32; within a factor of 1000, for sums of many terms): the values
  // agree on 0, and an op that makes more of it departs in turn.
  constexpr double kEps64 = std::numeric_limits<double>::epsilon();
  const double eps = out.scalar_type() == at::kHalf       ? 9.765625e-4  // 2^-10
                     : out.scalar_type() == at::kBFloat16 ? 7.8125e-3    // 2^-7
                     : out.scalar_type() == at::kDouble   ? kEps64
                                                          : std::numeric_limits<float>::epsilon();
  const double gotScale = got.numel() ? got.abs().masked_fill(~gotFinite, 0).max().item<double>() : 0;
  const bool zeroBothWays = eps > 1e-15 && scale > 0 && scale <= 1e3 * (kEps64 / eps) * gotScale &&
                            !oneOnly.any().item<bool>();
  if (zeroBothWays) return;
  if (scale == 0) scale = 1;
  double error = diff.numel() ? diff.max().item<double>() / scale : 0;
  int64_t beyond = (diff > p.tolerance * scale).sum().item<int64_t>() + oneOnly.sum().item<int64_t>();
  if (beyond == 0) return;
  if (drawsRandom(name)) {
    p.stopped = fmt::format("{} (outermost op {}, {}) draws random numbers, which the float64 reference draws "
                            "differently: the ops after it compute on other values and are not compared",
                            name, index, phase);
    return;
  }
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
      // The engine's "autograd::engine::evaluate_function: X" scope is wider than the node's own:
      // the gradient accumulation and checks inside it are backward ops too.
      bool engine = std::strncmp(name, "autograd::engine::", 18) == 0;
      if (engine && tEngineDepth > 0) --tEngineDepth;
      std::string phase = tBackwardDepth > 0 || tEngineDepth > 0 || engine ? "backward" : "forward";
      // Ended by an exception on its way out: the outermost such op is the one the step called.
      if (call && call->outer && !gProbe->raising && std::uncaught_exceptions() > call->unwinding) {
        ProbedOp op;
        op.name = name;
        op.phase = phase;
        if (phase == "backward" && !tNodes.empty()) op.node = tNodes.back();
        op.seq = fn.seqNr();
        op.index = index;
        op.began = call->began;
        for (const auto& t : call->tensors) op.inputs.push_back(statsOf(t));
        gProbe->raising = std::move(op);
      }
      if (!gProbe->found && !allocates(fn.name()) && (!movesOnly(fn.name()) || castsPastRange(fn.name(), call, fn))) {
        bool bad = false;
        // A CTC loss's other outputs (its log_alpha) hold -inf in every call: only its loss counts.
        size_t judged = 0;
        const size_t judge = ctcLoss(name) ? 1 : std::numeric_limits<size_t>::max();
        eachTensor(formats::torch::opResults(fn), [&](const at::Tensor& t) { bad = bad || (judged++ < judge && nonFinite(t)); });
        if (call && call->meantInfinity) bad = false;  // zeroed by the caller, as the program asked
        if (bad) {
          // Infinities the program means (an attention's -inf mask) are not a finding: neither
          // the op that writes the infinity it was given, nor, after one, an op that only passes
          // infinities on. A NaN, or an infinity made from finite inputs, still is.
          bool nan = false;
          eachTensor(formats::torch::opResults(fn), [&](const at::Tensor& t) { nan = nan || holdsNaN(t); });
          if (!nan && givenInfinity(fn)) {
            gProbe->deliberateInfinity = true;
            bad = false;
          } else if (!nan && gProbe->deliberateInfinity && call) {
            bad = std::none_of(call->tensors.begin(), call->tensors.end(), [](const at::Tensor& t) { return nonFinite(t); });
          }
        }
        if (bad) {
          ProbedOp op;
          op.name = name;
          op.phase = phase;
          if (phase == "backward" && !tNodes.empty()) op.node = tNodes.back();
          op.seq = fn.seqNr();
          op.index = index;
          op.began = call ? call->began : index;
          if (call)
            for (const auto& t : call->tensors) op.inputs.push_back(statsOf(t));
          eachTensor(formats::torch::opResults(fn), [&](const at::Tensor& t) {
            if (t.defined() && op.outputs.size() < 8) op.outputs.push_back(statsOf(t));
          });
          op.afterGivenInfinity = gProbe->deliberateInfinity;
          if (call) op.unalignable = call->unalignable;
          if (call && !op.outputs.empty() && op.outputs.front().nanCount > 0) {
            if (call->emptyMean) {
              op.emptyMean = call->emptyMean;
            } else if (const bool inside = !call->outer && !tOuterAveragesNothing.empty();
                       inside || averagesNothing(fn.name(), *call)) {
              op.emptyMean.emplace().empty = true;
              if (inside) op.emptyMean->of = tOuterAveragesNothing;
            }
          }
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
  if (call && call->outer) tOuterAveragesNothing.clear();
  tInside = false;
}

std::unique_ptr<at::ObserverContext> onBackwardStart(const at::RecordFunction& fn) {
  ++tBackwardDepth;
  tNodes.emplace_back(fn.name() ? fn.name() : "");
  tSavedDepth.push_back(tDepth);
  tSavedOuterAveragesNothing.push_back(std::move(tOuterAveragesNothing));
  tOuterAveragesNothing.clear();
  tDepth = 0;  // the ops an autograd node calls are outermost
  return nullptr;
}
void onBackwardEnd(const at::RecordFunction&, at::ObserverContext*) {
  if (tBackwardDepth > 0) --tBackwardDepth;
  if (!tNodes.empty()) tNodes.pop_back();
  if (!tSavedDepth.empty()) {
    tDepth = tSavedDepth.back();
    tSavedDepth.pop_back();
  }
  if (!tSavedOuterAveragesNothing.empty()) {
    tOuterAveragesNothing = std::move(tSavedOuterAveragesNothing.back());
    tSavedOuterAveragesNothing.pop_back();
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
    tEngineDepth = 0;
    tSavedDepth.clear();
    tOuterAveragesNothing.clear();
    tSavedOuterAveragesNothing.clear();
    tNodes.clear();
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
    if (!std::isfinite(s.loss) || s.laterBackward) return FirstFailure{s.step, "loss"};
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

bool settingActsOn(const std::string& setting, const std::string& device) {
  if (device != "cpu" || !formats::torch::changesOnlyCudaKernels(setting)) return true;
  testing::installFaultInjection();
  const auto hooked = testing::faultSettings();
  return std::find(hooked.begin(), hooked.end(), setting) != hooked.end();
}

namespace {

/// Where a crash's traceback says the error came from: the program's own innermost line when the
/// stack holds one.
std::string tracebackText(const std::vector<std::string>& stack) {
  if (auto frame = formats::programFrame(stack))
    return fmt::format("Its traceback says where: {} (crashcap inspect shows it all)", *frame);
  return "Its traceback (crashcap inspect) says where";
}

}  // namespace

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

/// One replay's plan and its running state, whoever drives the steps: the engine's own loop
/// (replayWith) or the recorded program's loop (DrivenReplay, a Python training). It opens the
/// bundle, chooses the target and the keyframe, applies the device, dtype and settings, hands out
/// each step's inputs, keeps each step's fingerprints, and concludes the verdict.
///
/// `wideAtTarget`: the steps before the target run as recorded, then the state is widened to
/// float64 for the target step alone (the reference of ops bisection: same starting point,
/// only the target step's arithmetic differs).
struct Run {
  std::string bundle;
  ReplayOptions options;
  bool wideAtTarget = false;
  ReplayResult result;
  Clock::time_point t0 = Clock::now(), t1;
  std::unique_ptr<formats::BundleReader> reader;
  formats::BundleRecords view;
  std::map<int64_t, const formats::StepBeginData*> begins;
  std::map<int64_t, const formats::StepEndData*> ends;
  const formats::KeyframeData* keyframe = nullptr;
  int64_t target = -1;
  int64_t stopBefore = 0;
  /// The process vanished inside the target step (formats::killedInStep, not between steps).
  bool killedAtTarget = false;
  Placement placement;
  bool wide = false;
  std::optional<caffe2::TypeMeta> narrowDefault;  ///< the default dtype before widenForTarget

  Run(std::string bundlePath, ReplayOptions opts, bool wideTarget)
      : bundle(std::move(bundlePath)), options(std::move(opts)), wideAtTarget(wideTarget) {
    result.rows = options.rows;
    testing::installFaultInjection();
    reader = formats::BundleReader::open(bundle);
    view = formats::readRecords(*reader);
    if (!view.program) throw noStepProgram(bundle, *reader, view);
    if (!view.optimizer) throw Error(ErrorCode::Unsupported, fmt::format("{} has no optimizer spec", bundle));
    if (view.stepBegins.empty()) throw Error(ErrorCode::NotFound, fmt::format("{} holds no recorded steps", bundle));
    if (!options.dtype.empty() && options.dtype != "float64")
      throw Error(ErrorCode::InvalidArgument, fmt::format("dtype '{}' is not one replay knows", options.dtype),
                  "replay as recorded (no --dtype) or in --dtype float64");

    target = options.step;
    if (target < 0) target = view.crash && view.crash->step >= 0 ? view.crash->step : view.stepBegins.back().step;
    for (const auto& b : view.stepBegins) begins[b.step] = &b;
    for (const auto& e : view.stepEnds) ends[e.step] = &e;
    // Killed (SIGKILL, the OOM killer) in a step whose records never reached the bundle: the
    // default target is the last step it holds, which the recording saw pass. Say so.
    if (const auto killed = formats::killedInStep(view); options.step < 0 && killed && *killed > target)
      result.notes.push_back(fmt::format(
          "the process was killed in step {} ({}), whose records never reached the bundle: the replay ends at step {}, "
          "the last it holds, which the recording saw pass",
          *killed,
          view.supervision && !view.supervision->evidence.empty() ? view.supervision->evidence : "its recording was never closed",
          target));
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
    if (options.keyframe >= 0) {
      for (const auto& k : view.keyframes)
        if (k.step == options.keyframe) keyframe = &k;
      if (!keyframe || options.keyframe > target)
        throw Error(ErrorCode::NotFound,
                    fmt::format("no keyframe at step {} {}in {}", options.keyframe,
                                keyframe ? fmt::format("at or before step {} ", target) : "", bundle));
    }
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
    stopBefore = result.lostSteps.empty() ? target + 1 : result.lostSteps.front();
    if (view.crash && view.crash->step == target) result.recordedError = view.crash->error;
    killedAtTarget = !view.crash && formats::failedInStep(view) == target;
    if (killedAtTarget)  // what crashcap run saw of it, when it ran the process
      result.recordedError = view.supervision && !view.supervision->evidence.empty() ? view.supervision->evidence
                                                                                       : "its recording was never closed";

    // Where and how: the recorded device, dtype and settings unless the options say otherwise.
    result.recordedDevice = view.program->device;
    placement = place(options.device, result.recordedDevice);
    result.device = placement.name;
    wide = options.dtype == "float64";
    result.dtype = wide ? "float64" : wideAtTarget ? "float64 (target step)" : "as-recorded";
    auto env = reader->environment();
    for (const auto& name : formats::torch::settingNames())
      if (env && !env->fact(name).empty()) result.recordedSettings[name] = env->fact(name);
    result.settings = result.recordedSettings;
    for (const auto& [name, value] : options.settings) result.settings[name] = value;
    // At the target alone: the steps before it run as recorded, beginStep changes the settings.
    result.settingsAtTarget = options.settingsAtTarget && result.settings != result.recordedSettings;
    for (const auto& [name, value] : result.settingsAtTarget ? result.recordedSettings : result.settings)
      formats::torch::applySetting(name, value);
    result.threads = at::get_num_threads();
    torch::jit::setGraphExecutorOptimize(env && env->fact("torch.jit.graph_executor_optimize") == "true");
    result.sameSetup = !wide && !wideAtTarget && result.settings == result.recordedSettings &&
                       result.device == (result.recordedDevice.empty() ? "cpu" : result.recordedDevice);
    for (const auto& [name, value] : result.settings) {
      std::string note = formats::torch::settingNotHeld(name, value);
      if (note.empty()) continue;
      result.notes.push_back(std::move(note));
      result.sameSetup = false;
    }
    // Another LibTorch computes with other kernels: its bits are not the recording's to match.
    const std::string recordedTorch = env ? env->fact("torch.version") : "";
    if (!recordedTorch.empty() && recordedTorch != TORCH_VERSION) {
      result.notes.push_back(fmt::format("torch {} here, {} in the recording", TORCH_VERSION, recordedTorch));
      result.sameSetup = false;
    }
    testing::setFaultDevice(result.device);
  }

  ~Run() {
    if (narrowDefault) c10::set_default_dtype(*narrowDefault);
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  at::Tensor onDevice(const at::Tensor& t) const {
    if (wide && t.is_floating_point()) return t.to(placement.device, at::kDouble);
    return t.to(placement.device);
  }

  /// The steps replayed, keyframe to target (or to the first lost step).
  std::vector<int64_t> steps() const {
    std::vector<int64_t> out;
    for (auto it = begins.lower_bound(keyframe->step); it != begins.end() && it->first < stopBefore; ++it)
      out.push_back(it->first);
    return out;
  }

  /// Moves the model's named state where it runs (the handles stay) and restores the keyframe's
  /// weights and buffers into it. Returns the parameters in the recorder's order, which its
  /// gradient norm used.
  std::vector<at::Tensor> restoreModel(std::map<std::string, at::Tensor>& params, std::map<std::string, at::Tensor>& buffers) {
    at::NoGradGuard noGrad;
    for (auto* state : {&params, &buffers})
      for (auto& [name, t] : *state) t.set_data(onDevice(t));
    std::vector<at::Tensor> ordered;
    for (const auto& name : view.program->parameters) {
      if (!params.count(name))
        throw Error(ErrorCode::Corrupt, fmt::format("the recording names parameter '{}', which the model lacks", name));
      ordered.push_back(params[name]);
    }
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
    return ordered;
  }

  void startSteps() {
    result.loadMs = msSince(t0);
    t1 = Clock::now();
    markProgress(-1);
  }

  /// ReplayOptions::progressPath: how far the replay got, for a program that dies before it can
  /// answer. Written whole each time (a few bytes); a file that cannot be written is said once.
  void markProgress(int64_t step) {
    if (options.progressPath.empty()) return;
    std::string text = fmt::format("keyframe {}\n", keyframe ? keyframe->step : -1);
    if (step >= 0) text += fmt::format("step {}\n", step);
    // Written aside and renamed: a process that dies meanwhile leaves the previous progress, not
    // an empty file (which would say it never began).
    const std::string partial = options.progressPath + ".partial";
    std::FILE* f = std::fopen(partial.c_str(), "w");
    bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (f) ok = std::fclose(f) == 0 && ok;
    ok = ok && std::rename(partial.c_str(), options.progressPath.c_str()) == 0;
    if (!ok && !progressUnwritable) {
      progressUnwritable = true;
      std::fprintf(stderr, "crashcap: cannot write the replay's progress to %s: %s\n", options.progressPath.c_str(),
                   std::strerror(errno));
    }
  }
  bool progressUnwritable = false;
  /// The target's batch structure cut to the rows asked for (BatchCut::structure), once it began.
  std::optional<std::string> targetStructure;

  /// Step `s` begins: its generator states are restored and its batch read (only the chosen rows
  /// at the target), on the replay's device. `r` gets what the recording says of the step.
  Batch beginStep(int64_t s, const std::vector<std::string>& inputs, StepReplay& r) {
    const auto& begin = *begins.at(s);
    markProgress(s);
    r = StepReplay();
    r.step = s;
    // A NaN the recorder did not flag as non-finite is a loss it did not read (a device loss is
    // not synchronised for): unknown, not a fingerprint to match.
    if (auto e = ends.find(s); e != ends.end() && !(std::isnan(e->second->loss) && !e->second->nonFinite)) {
      r.recorded = true;
      r.recordedLoss = e->second->loss;
      r.recordedGradNorm = e->second->gradNorm;
      r.recordedGradNormMethod = static_cast<uint8_t>(e->second->gradNormMethod);
    }
    if (s == target && result.settingsAtTarget) {
      for (const auto& [name, value] : result.settings) {
        formats::torch::applySetting(name, value);
        // A LibTorch whose thread pool is already running may keep its size (only a warning).
        if (value != formats::torch::kSetThroughPrecisionApi && formats::torch::currentSetting(name) != value)
          result.notes.push_back(fmt::format("{}={} did not take at step {}: this process kept {}", name, value, s,
                                             formats::torch::currentSetting(name)));
      }
      result.threads = at::get_num_threads();
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
    {
      auto e = ends.find(s);
      const auto& lrs = formats::updateLearningRates(begin, e == ends.end() ? nullptr : e->second);
      if (!lrs.empty()) r.learningRate = lrs[0];
    }
    // The target's batch tensors cut to the rows asked for (replayer::cutBatch: each tensor's rows
    // along its row dimension, a sequence-first tensor's in dimension 1; a ragged batch's spans).
    BatchCut cut;
    std::vector<std::string> cutInputs;  // the cut batch's names, when a list of rows' own tensors was cut
    if (s == target) {
      const auto rows = formats::batchRows(begin, *reader);
      result.batchSize = rows.count;
      for (int64_t row : options.rows)
        if (row < 0 || row >= result.batchSize)
          throw Error(ErrorCode::InvalidArgument,
                      result.batchSize == 0
                          ? fmt::format("row {} was asked for, but no tensor of step {}'s batch has rows", row, s)
                          : fmt::format("row {} is outside the batch of step {} (rows 0..{})", row, s, result.batchSize - 1));
      // Every row in order is the batch as recorded, not a cut of it (a sample bisection's first
      // replay asks for that).
      bool everyRow = static_cast<int64_t>(options.rows.size()) == result.batchSize;
      for (size_t i = 0; everyRow && i < options.rows.size(); ++i) everyRow = options.rows[i] == static_cast<int64_t>(i);
      if (!options.rows.empty() && !everyRow)
        cut = cutBatch(*reader, view, begin, options.rows,
                       "a replay that keeps some rows would keep all of its values and test another batch",
                       "look at the batch's tensors with `crashcap show BUNDLE " + formats::batchTensorName(s, "NAME") +
                           "`, or record a batch whose tensors each hold one row per sample (padded), or its rows' "
                           "lengths");
      if (!options.rows.empty() && !everyRow) {
        targetStructure = cut.structure;
        if (cut.batch != begin.batch) {
          const std::string prefix = formats::batchTensorName(s, "");
          for (const auto& full : cut.batch) cutInputs.push_back(full.substr(prefix.size()));
        }
      }
    }
    Batch batch;
    for (const auto& input : cutInputs.empty() ? inputs : cutInputs) {
      const auto full = formats::batchTensorName(s, input);
      at::Tensor t;
      if (auto c = cut.tensors.find(full); c != cut.tensors.end())
        t = c->second;
      else
        t = formats::torch::readTensor(*reader, full);
      batch.emplace_back(input, onDevice(t));
    }
    return batch;
  }

  /// At the target of a reference replay: the state and the batch widened to float64, and so is
  /// the default dtype, so that the tensors the step makes itself (a mask, a constant) are too.
  void widenForTarget(std::map<std::string, at::Tensor>& params, std::map<std::string, at::Tensor>& buffers, Batch& batch) {
    if (!wideAtTarget || wide) return;
    wide = true;
    narrowDefault = c10::get_default_dtype();
    c10::set_default_dtype(caffe2::TypeMeta::Make<double>());
    at::NoGradGuard noGrad;
    for (auto* state : {&params, &buffers})
      for (auto& [name, t] : *state) {
        t.mutable_grad() = at::Tensor();
        t.set_data(onDevice(t));
      }
    for (auto& [name, t] : batch) t = onDevice(t);
  }

  /// The step's loss and gradient norm after backward, compared with the recording's.
  static void fingerprint(StepReplay& r, const at::Tensor& loss, const std::vector<at::Tensor>& ordered) {
    at::NoGradGuard noGrad;
    at::DisableRecordFunctionGuard notAnOp;  // the replay's own norms are not the step's ops (the probe's list)
    r.loss = formats::torch::lossValue(loss);
    r.hasLoss = true;
    std::vector<at::Tensor> grads;
    for (const auto& p : ordered)
      if (p.grad().defined()) grads.push_back(p.grad().detach());
    if (!grads.empty()) {
      // The recording's method: the same bits for the same gradients.
      r.gradNorm = formats::torch::gradientNorm(grads, static_cast<formats::GradNormMethod>(r.recordedGradNormMethod));
      r.hasGradNorm = true;
    }
    r.bitwise = r.recorded && sameBits(r.loss, r.recordedLoss) && (!r.hasGradNorm || sameBits(r.gradNorm, r.recordedGradNorm));
  }

  /// The weights after a step's optimizer update.
  static void afterUpdate(StepReplay& r, const std::vector<at::Tensor>& ordered) {
    at::NoGradGuard noGrad;
    at::DisableRecordFunctionGuard notAnOp;  // the replay's own norms are not the step's ops
    std::vector<at::Tensor> weights, wideWeights;
    for (const auto& p : ordered) {
      weights.push_back(p.detach());
      wideWeights.push_back(p.detach().to(at::kDouble));  // float32 squares overflow long before the weights do
    }
    r.weightNorm = at::stack(at::_foreach_norm(wideWeights, 2)).norm().item<double>();
    r.weightsFinite = std::all_of(weights.begin(), weights.end(), [](const at::Tensor& w) { return at::isfinite(w).all().item<bool>(); });
  }

  /// The step is over (ended, failed, or updated).
  void endStep(const StepReplay& r, const Probe& probe) {
    // A training under autocast leaves its autocast region every step, which drops the cache of
    // weights cast to the lower precision; replay does the same, or every later step would run
    // on the first step's casts of weights that have since been updated.
    at::autocast::clear_cache();
    if (narrowDefault) c10::set_default_dtype(*narrowDefault);
    narrowDefault.reset();
    if (r.step == target && probe.found) result.firstNonFiniteOp = probe.found;
    if (r.step == target && probe.raising && !r.error.empty()) result.raisingOp = probe.raising;
    result.steps.push_back(r);
    // Only the same setup can be held to the recording's bits; any setup to its errors.
    bool departs = !r.error.empty() || (result.sameSetup && r.recorded && !r.bitwise);
    if (r.step < target && !result.divergedAt && departs) result.divergedAt = r.step;
  }

  /// ReplayOptions::keyframeOut, as the target step begins: the state it starts from, as a bundle
  /// holding one keyframe, when every step before it replayed bit for bit as recorded (so the
  /// state is the recording's, to the bit). `optimizer` and `documents` are named as the
  /// recorder names them under keyframes/<step>/optimizer/ and keyframes/<step>/documents/.
  void writeKeyframe(const std::map<std::string, at::Tensor>& params, const std::map<std::string, at::Tensor>& buffers,
                     const std::vector<std::pair<std::string, at::Tensor>>& optimizer,
                     const std::vector<formats::NumberEntry>& scalars,
                     const std::vector<std::pair<std::string, std::string>>& documents) {
    if (options.keyframeOut.empty() || result.keyframeWritten || !result.keyframeNotWritten.empty()) return;
    auto refuse = [&](std::string why) { result.keyframeNotWritten = std::move(why); };
    if (keyframe->step == target) return refuse(fmt::format("the bundle already has a keyframe at step {}", target));
    if (auto b = begins.find(target); b != begins.end() && b->second->accumulating)
      return refuse(fmt::format("step {} begins with the gradients the steps before it accumulated (no optimizer update "
                                "since their backward), and a keyframe holds no gradients",
                                target));
    if (!result.sameSetup || wide)
      return refuse("the replay does not run as recorded (device, dtype, settings or torch differ), so its state is "
                    "not the recording's to the bit");
    if (stopBefore <= target) return refuse("the recording lost a step before the target");
    for (const auto& r : result.steps) {
      if (!r.error.empty()) return refuse(fmt::format("step {} failed in the replay: {}", r.step, lastLine(r.error)));
      if (!r.recorded && !r.untrained)
        return refuse(fmt::format("step {} has no recorded fingerprint to check the replay against", r.step));
      if (!r.bitwise) return refuse(fmt::format("step {} did not replay bit for bit", r.step));
    }
    if (result.steps.empty() || result.steps.back().step + 1 != target ||
        static_cast<int64_t>(result.steps.size()) != target - keyframe->step)
      return refuse("the replay did not run every step from the keyframe to the target");
    try {
      formats::PartialOutput output(options.keyframeOut);
      formats::WriterOptions wo;
      wo.overwrite = true;
      wo.producer = "crashcap replay";
      wo.durability.syncOnSeal = false;  // a working file of the caller's
      auto writer = formats::BundleWriter::create(output.path(), wo);
      formats::KeyframeData kf;
      kf.step = target;
      auto add = [&](const std::string& part, const std::string& name, const at::Tensor& t, std::vector<std::string>& names) {
        if (!t.defined()) return;
        auto full = formats::keyframeTensorName(target, part, name);
        formats::torch::writeTensor(*writer, full, t.detach());
        names.push_back(full);
      };
      for (const auto& [name, t] : params) add("parameters", name, t, kf.parameters);
      for (const auto& [name, t] : buffers) add("buffers", name, t, kf.buffers);
      for (const auto& [name, t] : optimizer) add("optimizer", name, t, kf.optimizerState);
      kf.optimizerScalars = scalars;
      for (const auto& [name, text] : documents) {
        auto full = formats::keyframeTensorName(target, "documents", name);
        writer->writeTensor(full, formats::DType::UInt8, {static_cast<int64_t>(text.size())}, text.data(), text.size());
        kf.documents.push_back(full);
      }
      formats::writeMetaRecord(*writer, kf);
      writer->seal();
      writer.reset();
      output.commit();
      result.keyframeWritten = target;
    } catch (const std::exception& e) {
      refuse(fmt::format("writing {} failed: {}", options.keyframeOut, e.what()));
    }
  }

  /// The verdict, against what the recording says happened at the target.
  ReplayResult finish() {
    result.replayMs = msSince(t1);
    if (!result.lostSteps.empty()) {
      result.verdict = Verdict::RecordingIncomplete;
      return result;
    }
    // A driven replay stops at the first step that throws: before the target, that is a
    // departure from the recording (the engine's own loop goes on, and concludes the same).
    if (!result.steps.empty() && result.steps.back().step < target && !result.steps.back().error.empty()) {
      result.divergedAt = result.steps.back().step;
      result.error = result.steps.back().error;
      result.verdict = Verdict::Diverged;
      return result;
    }
    if (result.steps.empty() || result.steps.back().step != target)
      throw Error(ErrorCode::Unsupported,
                  fmt::format("the replay ended before step {}: the program's loop stopped after {}", target,
                              result.steps.empty() ? std::string("no step") : fmt::format("step {}", result.steps.back().step)));
    const StepReplay& last = result.steps.back();
    bool replayNonFinite = last.error.empty() && (!std::isfinite(last.loss) || (last.hasGradNorm && !std::isfinite(last.gradNorm)) ||
                                                  last.laterBackward);
    result.error = !last.error.empty() ? last.error
                   : last.laterBackward ? fmt::format("non-finite loss at step {}: {} (its backward() #{}; the first one's loss "
                                                      "{} was finite)",
                                                      target, formats::withoutNanSign(last.laterLoss), last.laterBackward, last.loss)
                   : replayNonFinite   ? (std::isfinite(last.loss) ? fmt::format("non-finite gradient norm at step {}: {} (loss {})",
                                                                                 target, formats::withoutNanSign(last.gradNorm), last.loss)
                                                                     : fmt::format("non-finite loss at step {}: {}", target,
                                                                                   formats::withoutNanSign(last.loss)))
                                       : "";
    bool recordedFailure = view.crash && view.crash->step == target;
    bool allBitwise = true;
    for (const auto& r : result.steps) allBitwise = allBitwise && (r.bitwise || (!r.recorded && r.step == target));
    if (result.divergedAt) {
      result.verdict = Verdict::Diverged;
    } else if (recordedFailure) {
      const auto& kind = view.crash->kind;
      const bool raised = (kind == "exception" || kind == "terminate") && !last.error.empty();
      // In the recorded setup an error must be the recorded one: a batch cut to a few rows can fail
      // otherwise (a batch norm of one row, the program's own assertion on the batch size), and
      // that is not the failure under investigation. Another setup is compared by the failure alone
      // (a device-side assert on the GPU is an IndexError on the CPU).
      const bool otherError = raised && !sameFailure(last.error, view.crash->error);
      bool sameClass = (kind == "nonfinite" && replayNonFinite) || (raised && (!result.sameSetup || !otherError));
      if (otherError)
        result.notes.push_back(fmt::format("step {} raised another error than the recorded one ({}){}", target,
                                           lastLine(view.crash->error),
                                           result.sameSetup ? ": not the recorded failure"
                                                            : "; in another setup only that the step fails is compared"));
      if (!sameClass) {
        result.verdict = Verdict::NotReproduced;
        if (view.crash->phase == "loading" && result.batchLoad && result.batchLoad->error.empty())
          result.notes.push_back(fmt::format(
              "the recorded error came from the DataLoader while it loaded the batch after step {}; that batch, {}, "
              "raised nothing: what failed depends on more than the samples (a worker's random state, a file or "
              "service that has changed since)",
              target, loadedAgainText(*result.batchLoad)));
        else if (view.crash->phase == "loading" && result.batchLoad)
          result.notes.push_back(fmt::format(
              "the recorded error came from the DataLoader while it loaded the batch after step {}; that batch, {}, "
              "raised another error ({}), not the recorded one",
              target, loadedAgainText(*result.batchLoad), lastLine(result.batchLoad->error)));
        else if (view.crash->phase == "loading")
          result.notes.push_back(fmt::format(
              "the recorded error came from the DataLoader while it loaded the batch after step {}, which never "
              "arrived, and {}. The crash record's text names what is known of the batch (crashcap inspect)",
              target,
              view.crash->loadingIndices.empty()
                  ? "the crash record holds no indices of its samples to load it again by (an IterableDataset, a "
                    "sampler of other keys, or a recording made before crashcap kept them)"
                  : "this replay did not load it again (it ran some rows of the step, or a program that loads no "
                    "batches of its own)"));
        else if (view.crash->phase == "optimizer" && last.error.empty())
          result.notes.push_back(fmt::format(
              "the recorded error came in step {} after its backward(): in the optimizer's update, or in what the "
              "loop runs between backward() and the update (gradient clipping, logging, a file it writes), which a "
              "replay, ending the failing step at its backward(), does not run. {}",
              target, tracebackText(view.crash->stack)));
        else if (view.crash->phase == "between-steps")
          result.notes.push_back(fmt::format(
              "the recorded error came after step {}'s update, between steps: in what the loop runs after "
              "optimizer.step() (a scheduler, a validation pass, a checkpoint, logging), which a replay of the "
              "recorded steps does not run. {}",
              target, tracebackText(view.crash->stack)));
      } else {
        // A non-finite target without a recorded fingerprint (a batch cut to some rows) is held
        // to the bits only through the steps before it: with none, nothing was compared.
        bool sameText = kind == "nonfinite" ? (last.recorded ? last.bitwise : result.steps.size() > 1)
                                            : lastLine(last.error) == lastLine(view.crash->error);
        result.verdict = allBitwise && sameText && result.sameSetup ? Verdict::ReproducedBitwise : Verdict::Reproduced;
        if (result.batchLoad)
          result.notes.push_back(fmt::format(
              "the recorded error came from the DataLoader while it loaded the batch after step {}: that batch, {}, "
              "raised it again{}",
              target, loadedAgainText(*result.batchLoad),
              result.batchLoad->culprits.empty()
                  ? "; no sample fails alone, and none stands apart from the rest"
                  : fmt::format(": {} of its samples fail{} ({})", result.batchLoad->culprits.size(),
                                result.batchLoad->culprits.size() == 1 ? "s" : "", result.batchLoad->culpritsBy)));
      }
    } else {
      // No failure recorded here: replay reproduces the recording, or departs from it.
      if (last.recorded && !last.bitwise && result.sameSetup) result.divergedAt = target;
      if (killedAtTarget && !result.divergedAt && result.error.empty()) {
        // The process vanished in this step (SIGKILL: the OOM killer, a scheduler, the program's
        // own loop), and the replay, which answered, ran the step to its end without a failure:
        // whatever ended the process did not come back.
        result.verdict = Verdict::NotReproduced;
        result.notes.push_back(
            fmt::format("the recorded process ended in step {} ({}) without its recorder seeing why, and the replay "
                        "ran that step to its end without a failure: what ended it came from outside the step's "
                        "computation, or needs what the replay does not repeat (memory pressure, the program's loop)",
                        target, result.recordedError));
        return result;
      }
      result.verdict = result.divergedAt || !last.error.empty() ? Verdict::Diverged
                       : result.sameSetup && allBitwise           ? Verdict::ReproducedBitwise
                                                                  : Verdict::Reproduced;
      if (!last.error.empty() && !result.divergedAt) result.divergedAt = target;
    }
    return result;
  }
};

/// The reference side's outermost-op outputs, handed to the replay side in a file (pickled: a
/// tuple of names, values and which values are defined).
void saveOuterOutputs(const std::string& path, const std::vector<OuterOutput>& outputs) {
  c10::List<std::string> names;
  c10::List<at::Tensor> values;
  c10::List<bool> defined;
  for (const auto& o : outputs) {
    names.push_back(o.name);
    values.push_back(o.value.defined() ? o.value : at::empty({0}, at::kDouble));
    defined.push_back(o.value.defined());
  }
  std::vector<char> data = torch::jit::pickle_save(c10::ivalue::Tuple::create({names, values, defined}));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out)
    throw Error(ErrorCode::Io, fmt::format("cannot write the reference's op outputs to {}: {}", path, std::strerror(errno)),
                "free disk space in TMPDIR");
}

std::vector<OuterOutput> loadOuterOutputs(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(ErrorCode::NotFound, fmt::format("cannot read the reference's op outputs {}: {}", path, std::strerror(errno)));
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<OuterOutput> outputs;
  try {
    auto tuple = torch::jit::pickle_load(data).toTuple();
    auto names = tuple->elements().at(0).toList();
    auto values = tuple->elements().at(1).toList();
    auto defined = tuple->elements().at(2).toList();
    if (names.size() != values.size() || names.size() != defined.size()) throw std::runtime_error("lists of unequal length");
    for (size_t i = 0; i < names.size(); ++i)
      outputs.push_back({names.get(i).toStringRef(), defined.get(i).toBool() ? values.get(i).toTensor() : at::Tensor()});
  } catch (const std::exception& e) {
    throw Error(ErrorCode::Corrupt, fmt::format("the reference's op outputs {} cannot be read: {}", path, e.what()));
  }
  return outputs;
}

ReplayResult replayWith(const std::string& bundle, const ReplayOptions& options, Probe& probe, const ProgramFactory& makeProgram,
                        bool wideAtTarget = false) {
  Run run(bundle, options, wideAtTarget);
  const auto& view = run.view;
  auto& reader = run.reader;
  const auto* keyframe = run.keyframe;
  Program program = makeProgram(*reader, view);
  auto& params = program.params;
  auto& buffers = program.buffers;

  // TorchScript's optimising graph executor runs a program's first calls as profiling runs and
  // the later ones through the graph it optimised from them, whose arithmetic (fused, reordered)
  // can differ from the profiling runs' in the last bit. Replay makes the calls the recorded
  // process made before the keyframe's step (one per step; as many as the executor profiles
  // before it optimises): forward and backward on the keyframe step's batch, before the keyframe
  // is restored (which overwrites weights, buffers and gradients), with autocast's cache dropped
  // after them. The process's first step is the one whose previous step is -1; when the window no
  // longer holds it, the process made more calls than the executor profiles.
  if (program.torchScript && torch::jit::getGraphExecutorOptimize()) {
    {
      at::NoGradGuard noGrad;  // the warm-up runs where the replay will
      for (auto* state : {&params, &buffers})
        for (auto& [name, t] : *state) t.set_data(run.onDevice(t));
    }
    const int64_t profiling = static_cast<int64_t>(torch::jit::getNumProfiledRuns()) + 1;
    int64_t calls = profiling;
    for (auto b = run.begins.begin(); b != run.begins.end() && b->first <= keyframe->step; ++b)
      if (b->second->previousStep == -1)
        calls = std::min<int64_t>(profiling, std::distance(b, run.begins.lower_bound(keyframe->step)));
    auto first = run.begins.lower_bound(keyframe->step);
    if (calls > 0 && first != run.begins.end() && first->first < run.stopBefore) {
      Batch batch;
      for (const auto& input : program.inputs(*first->second))
        batch.emplace_back(input, run.onDevice(formats::torch::readTensor(*reader, formats::batchTensorName(first->first, input))));
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
  std::vector<at::Tensor> ordered = run.restoreModel(params, buffers);
  auto optimizer = formats::torch::makeOptimizer(*view.optimizer, params);
  {
    at::NoGradGuard noGrad;
    std::map<std::string, int64_t> counters;
    for (const auto& [key, v] : keyframe->optimizerScalars)
      if (key.size() > 5 && key.substr(key.size() - 5) == "/step") counters[key.substr(0, key.size() - 5)] = int64_t(v);
    for (const auto& [name, p] : params) {
      // A Python optimizer keeps its step counter as a tensor beside the others.
      if (auto full = formats::keyframeTensorName(keyframe->step, "optimizer", name + "/step");
          !counters.count(name) && reader->find(full))
        counters[name] = static_cast<int64_t>(formats::torch::readTensor(*reader, full).item<double>());
      auto get = [&](const char* key) -> at::Tensor {
        auto full = formats::keyframeTensorName(keyframe->step, "optimizer", name + "/" + key);
        return reader->find(full) ? formats::torch::readTensor(*reader, full).to(p.device(), p.scalar_type()) : at::Tensor();
      };
      formats::torch::restoreParameterState(*optimizer, view.optimizer->kind, p, get, counters[name]);
    }
  }
  run.startSteps();

  // Replay keyframe..target.
  const int64_t target = run.target;
  for (int64_t s : run.steps()) {
    const auto& begin = *run.begins.at(s);
    if (s == target && !options.keyframeOut.empty()) {
      std::vector<std::pair<std::string, at::Tensor>> state;
      std::vector<formats::NumberEntry> scalars;
      for (const auto& [name, p] : params) {
        auto ps = formats::torch::parameterState(*optimizer, p);
        for (const auto& [key, t] : ps.tensors) state.emplace_back(name + "/" + key, t);
        if (ps.step) scalars.push_back({name + "/step", static_cast<double>(*ps.step)});
      }
      run.writeKeyframe(params, buffers, state, scalars, {});
    }
    StepReplay r;
    Batch inputs = run.beginStep(s, program.inputs(begin), r);
    for (size_t g = 0; g < optimizer->param_groups().size() && g < begin.learningRates.size(); ++g)
      optimizer->param_groups()[g].options().set_lr(begin.learningRates[g]);
    if (s == target) run.widenForTarget(params, buffers, inputs);
    try {
      optimizer->zero_grad();  // the recipe's, not the step program's ops: outside the probe
      if (s == target && (probe.capture || probe.reference))
        for (auto& [name, p] : params) p.mutable_grad() = at::Tensor();  // both sides assign, not accumulate
      std::optional<ProbeScope> scope;
      if (s == target && (options.instrument || probe.capture || probe.reference)) scope.emplace(probe);
      at::Tensor loss = program.loss(inputs);
      loss.backward();
      scope.reset();
      Run::fingerprint(r, loss, ordered);
      if (s < target) {
        if (view.optimizer->gradClipNorm > 0)
          torch::nn::utils::clip_grad_norm_(ordered, view.optimizer->gradClipNorm, view.optimizer->gradClipNormType);
        if (auto e = run.ends.find(s); e != run.ends.end())
          for (size_t g = 0; g < optimizer->param_groups().size() && g < e->second->updateLearningRates.size(); ++g)
            optimizer->param_groups()[g].options().set_lr(e->second->updateLearningRates[g]);
        optimizer->step();
        Run::afterUpdate(r, ordered);
      }
    } catch (const std::exception& e) {
      r.error = formats::torch::errorMessage(e);  // as the recorder kept it: no C++ backtrace
    }
    run.endStep(r, probe);
  }
  return run.finish();
}

}  // namespace

namespace {

/// How the DataLoader worker whose death `text` ends with ended: "signal: Segmentation fault",
/// "exit code 1", or "" when the words raised do not say (the loader found the worker gone while
/// it waited for a batch); nullopt when the last line reports no worker's death. The DataLoader
/// raises one death in other words depending on where the program was (its SIGCHLD handler's report
/// wherever the main thread runs; "exited unexpectedly" when that report came while the loader
/// waited, which it then raises from), so how the worker ended is read from the whole text: the
/// recording's and the replay's notes give the loader's own report beside the error raised.
std::optional<std::string> workerDeath(const std::string& text) {
  static const std::regex death(R"(DataLoader worker \(pid(\(s\))? [0-9, ]+\) (is killed by signal|exited unexpectedly))");
  static const std::regex killed(R"(DataLoader worker \(pid [0-9]+\) is killed by signal: ([^.\n]*))");
  static const std::regex exited(R"(DataLoader worker \(pid [0-9]+\) exited unexpectedly with exit code (-?[0-9]+))");
  const std::string last = lastLine(text);
  std::smatch m;
  if (!std::regex_search(last, death)) return std::nullopt;
  if (std::regex_search(text, m, killed)) return "signal: " + m[1].str();
  if (std::regex_search(text, m, exited)) return "exit code " + m[1].str();
  return std::string();
}

}  // namespace

bool sameFailure(const std::string& replayed, const std::string& recorded) {
  static const std::regex numbers("0x[0-9a-fA-F]+|[0-9]+");
  if (std::regex_replace(lastLine(replayed), numbers, "#") == std::regex_replace(lastLine(recorded), numbers, "#"))
    return true;
  const auto a = workerDeath(replayed), b = workerDeath(recorded);
  return a && b && (*a == *b || a->empty() || b->empty());
}

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

/// The options of an ops bisection's reference: on the CPU, from the recorded dtype (the target
/// step alone is widened).
ReplayOptions referenceOptions(ReplayOptions options) {
  options.device = "cpu";
  options.dtype.clear();
  return options;
}

/// Ops bisection over any program: the float64 reference first, then the replay compared with it.
ReferenceComparison compareWith(const std::string& bundle, ReplayOptions options, double tolerance,
                                const ProgramFactory& makeProgram) {
  ReferenceComparison c;
  c.tolerance = tolerance;
  std::vector<OuterOutput> outputs;
  {
    ReplayOptions ro = referenceOptions(options);
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

// ---- A replay driven by the program's own loop ---------------------------------------------

namespace crashcap::replayer {

struct DrivenReplay::Impl {
  Comparison comparison;
  Run run;
  Probe probe;
  std::vector<OuterOutput> outputs;   ///< the reference's (captured, or read for the replay side)
  std::optional<ProbeScope> scope;
  std::map<std::string, at::Tensor> params, buffers;
  std::vector<at::Tensor> ordered;
  std::optional<StepReplay> current;  ///< begun, not yet closed
  bool ended = false;                 ///< the current step reached endStep
  /// The target step's backward() calls so far, once endStep left it open for its later ones
  /// (laterBackward); 0 otherwise.
  int32_t backwards = 0;

  Impl(const std::string& bundle, const ReplayOptions& options, Comparison c)
      : comparison(std::move(c)),
        run(bundle, comparison.side == ComparisonSide::Reference ? referenceOptions(options) : options,
            comparison.side == ComparisonSide::Reference) {
    switch (comparison.side) {
      case ComparisonSide::Both:
        break;
      case ComparisonSide::Reference:
        probe.capture = &outputs;
        break;
      case ComparisonSide::Replay:
        outputs = loadOuterOutputs(comparison.outputs);
        probe.reference = &outputs;
        probe.tolerance = comparison.tolerance;
        break;
    }
  }

  /// Closes the current step: a step before the target that ended had its optimizer update by now.
  void close() {
    if (!current) return;
    scope.reset();
    if (ended && current->error.empty() && current->step < run.target) Run::afterUpdate(*current, ordered);
    if (!ended && current->error.empty() && !current->recorded && current->step < run.target)
      current->untrained = current->bitwise = true;
    run.endStep(*current, probe);
    current.reset();
    ended = false;
    backwards = 0;
  }
};

DrivenReplay::DrivenReplay(const std::string& bundle, const ReplayOptions& options, const NamedTensors& parameters,
                           const NamedTensors& buffers)
    : DrivenReplay(bundle, options, parameters, buffers, Comparison()) {}

DrivenReplay::DrivenReplay(const std::string& bundle, const ReplayOptions& options, const NamedTensors& parameters,
                           const NamedTensors& buffers, Comparison comparison)
    : impl_(std::make_unique<Impl>(bundle, options, std::move(comparison))) {
  auto& m = *impl_;
  const auto& program = *m.run.view.program;
  if (program.format == "torchscript")
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{} was recorded with a TorchScript step program: replay it with replay(bundle)", bundle));
  for (const auto& [name, t] : parameters) m.params[name] = t;
  for (const auto& [name, t] : buffers) m.buffers[name] = t;
  for (const auto& name : program.buffers)
    if (!m.buffers.count(name))
      throw Error(ErrorCode::InvalidArgument, fmt::format("the recording names buffer '{}', which the model lacks", name),
                  "replay with the program and model that made the recording");
}

DrivenReplay::~DrivenReplay() = default;

int64_t DrivenReplay::target() const { return impl_->run.target; }
int64_t DrivenReplay::keyframe() const { return impl_->run.keyframe->step; }
std::vector<int64_t> DrivenReplay::steps() const { return impl_->run.steps(); }
const formats::KeyframeData& DrivenReplay::keyframeRecord() const { return *impl_->run.keyframe; }
const formats::StepProgramData& DrivenReplay::program() const { return *impl_->run.view.program; }

void DrivenReplay::note(const std::string& text) {
  impl_->run.result.notes.push_back(text);
  impl_->run.result.sameSetup = false;
}

std::string DrivenReplay::environmentFact(const std::string& key) const {
  auto env = impl_->run.reader->environment();
  return env ? env->fact(key) : "";
}

at::Tensor DrivenReplay::readTensor(const std::string& name) const {
  if (!impl_->run.reader->find(name)) throw Error(ErrorCode::NotFound, fmt::format("{} holds no tensor {}", impl_->run.bundle, name));
  return formats::torch::readTensor(*impl_->run.reader, name);
}

void DrivenReplay::restoreModel() {
  auto& m = *impl_;
  m.ordered = m.run.restoreModel(m.params, m.buffers);
  m.run.startSteps();
}

DrivenReplay::Step DrivenReplay::beginStep(int64_t step) {
  auto& m = *impl_;
  m.close();
  auto it = m.run.begins.find(step);
  if (it == m.run.begins.end() || step >= m.run.stopBefore)
    throw Error(ErrorCode::InvalidArgument, fmt::format("step {} is not one this replay runs", step));
  const auto& begin = *it->second;
  std::vector<std::string> inputs;
  const std::string prefix = formats::batchTensorName(step, "");
  for (const auto& full : begin.batch) inputs.push_back(full.substr(prefix.size()));
  StepReplay r;
  Step out;
  out.batch = m.run.beginStep(step, inputs, r);
  out.structure = begin.structure;
  if (step == m.run.target && m.run.targetStructure)  // its per-row lists as its tensors were cut
    out.structure = *m.run.targetStructure;
  out.learningRates = begin.learningRates;
  if (auto e = m.run.ends.find(step); e != m.run.ends.end()) out.updateLearningRates = e->second->updateLearningRates;
  const std::string rngPrefix = formats::rngTensorName(step, "");
  for (const auto& full : begin.rng) {
    std::string device = full.substr(rngPrefix.size());
    if (device != "cpu" && device.rfind("cuda", 0) != 0) out.generators.emplace_back(device, full);
  }
  if (step == m.run.target) {
    const bool comparing = m.probe.capture || m.probe.reference;
    if (comparing) {
      m.run.widenForTarget(m.params, m.buffers, out.batch);
      for (auto& [name, p] : m.params) p.mutable_grad() = at::Tensor();  // both sides assign, not accumulate
    }
  }
  m.current = r;
  m.ended = false;
  return out;
}

void DrivenReplay::writeKeyframe(const NamedTensors& optimizerState, const std::vector<std::pair<std::string, std::string>>& documents) {
  auto& m = *impl_;
  m.close();  // the previous step's update is done by now
  if (m.comparison.side != ComparisonSide::Both) return;
  std::vector<formats::NumberEntry> scalars;
  m.run.writeKeyframe(m.params, m.buffers, optimizerState, scalars, documents);
}

bool DrivenReplay::wantsKeyframe() const { return !impl_->run.options.keyframeOut.empty(); }

void DrivenReplay::startProbe() {
  auto& m = *impl_;
  if (!m.current || m.ended || m.current->step != m.run.target || m.scope) return;
  if (m.run.options.instrument || m.probe.capture || m.probe.reference) m.scope.emplace(m.probe);
}

bool DrivenReplay::endStep(const at::Tensor& loss, bool laterBackwards) {
  auto& m = *impl_;
  if (!m.current || m.ended) return true;
  Run::fingerprint(*m.current, loss, m.ordered);
  m.ended = true;
  const auto& crash = m.run.view.crash;
  auto& r = *m.current;
  if (laterBackwards && r.step == m.run.target && crash && crash->step == r.step && crash->kind == "nonfinite" &&
      std::isfinite(r.loss) && (!r.hasGradNorm || std::isfinite(r.gradNorm))) {
    // The recorded non-finite loss may have come from a later backward() of the step: it stays
    // open, and the probe on, through the computation of the later losses. (Where the recorded
    // first loss was the non-finite one and the replay departs from it, no later one fails
    // either, and the step ends at its update with the verdict it would have had here.)
    m.backwards = 1;
    return false;
  }
  m.scope.reset();
  if (r.step == m.run.target) m.close();
  return true;
}

bool DrivenReplay::laterBackward(const at::Tensor& loss) {
  auto& m = *impl_;
  if (!m.current || !m.ended || m.backwards == 0) return true;
  ++m.backwards;
  const double value = formats::torch::lossValue(loss);
  if (std::isfinite(value)) return false;
  m.current->laterBackward = m.backwards;
  m.current->laterLoss = value;
  m.close();
  return true;
}

void DrivenReplay::stepFailed(const std::string& error) {
  auto& m = *impl_;
  if (!m.current) return;
  m.scope.reset();
  m.current->error = error;
  m.ended = false;
  m.close();
}

namespace {

/// A replay of the recorded setup, from the newest keyframe, writing nothing more: what loads a
/// step's samples again to learn about them (not an experiment under other settings, device or
/// dtype, nor a step bisection's or a pack's replay).
bool plainReplay(const ReplayOptions& o) {
  return o.settings.empty() && o.device.empty() && o.dtype.empty() && !o.fromEarliestKeyframe && o.keyframeOut.empty();
}

}  // namespace

std::optional<BatchLoad> DrivenReplay::batchToLoad() const {
  auto& m = *impl_;
  const auto& crash = m.run.view.crash;
  if (!crash || crash->phase != "loading" || crash->step != m.run.target || crash->loadingIndices.empty() ||
      m.comparison.side != ComparisonSide::Both || !m.run.options.rows.empty())
    return std::nullopt;
  BatchLoad load;
  load.indices = crash->loadingIndices;
  load.datasetIndices = crash->loadingDatasetIndices;
  load.searched = plainReplay(m.run.options);
  return load;
}

void DrivenReplay::batchLoaded(BatchLoad load) {
  auto& m = *impl_;
  m.close();
  auto& steps = m.run.result.steps;
  if (steps.empty() || steps.back().step != m.run.target)
    throw Error(ErrorCode::Internal, fmt::format("the batch after step {} was loaded before that step ended", m.run.target));
  if (!load.error.empty() && steps.back().error.empty()) steps.back().error = load.error;
  m.run.result.batchLoad = std::move(load);
}

std::vector<int64_t> DrivenReplay::rowsToMatch() const {
  auto& m = *impl_;
  const auto name = formats::batchTensorName(m.run.target, formats::kDatasetIndexName);
  if (m.comparison.side != ComparisonSide::Both || !m.run.options.rows.empty() || !plainReplay(m.run.options) ||
      !m.run.reader->find(name))
    return {};
  at::Tensor t = formats::torch::readTensor(*m.run.reader, name);
  if (t.dim() != 1 || t.scalar_type() != at::kLong) return {};
  t = t.contiguous();
  return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
}

void DrivenReplay::rowsMatched(RowOrder order) {
  auto& m = *impl_;
  m.close();
  const auto asked = rowsToMatch();
  if (asked.empty()) throw Error(ErrorCode::Internal, "rows_matched() without rows to match");
  if (order.matched() && order.datasetIndices.size() != asked.size())
    throw Error(ErrorCode::Internal, fmt::format("rows_matched(): {} dataset indices for a batch of {}",
                                                 order.datasetIndices.size(), asked.size()));
  m.run.result.rowOrder = std::move(order);
}

ReplayResult DrivenReplay::finish() {
  impl_->close();
  return impl_->run.finish();
}

ReferenceComparison DrivenReplay::finishComparison() {
  auto& m = *impl_;
  if (m.comparison.side == ComparisonSide::Both)
    throw Error(ErrorCode::Internal, "finishComparison() of a replay that is not a side of an ops bisection");
  ReferenceComparison c;
  c.tolerance = m.comparison.tolerance;
  ReplayResult r = finish();
  if (m.comparison.side == ComparisonSide::Reference) {
    saveOuterOutputs(m.comparison.outputs, m.outputs);
    c.reference = std::move(r);
  } else {
    c.replay = std::move(r);
    c.opsCompared = m.probe.compared;
    c.firstDeparting = m.probe.departing;
    c.stoppedBecause = m.probe.stopped;
  }
  return c;
}

Error noStepProgram(const std::string& bundle, const std::string& pythonCapture, const std::string& observedLoader) {
  if (pythonCapture == "observed" && observedLoader == "none")
    return Error(ErrorCode::Unsupported,
                 fmt::format("{} holds no steps: its Python training was recorded by `crashcap run --record`, and it "
                             "made its batches itself (no DataLoader), so only its crash, last ops and environment "
                             "were kept",
                             bundle),
                 "to replay it, record its steps with crashcap.Recorder's `with rec.step(i, ...)` (docs/PYTHON.md)");
  if (!pythonCapture.empty())
    return Error(ErrorCode::Unsupported,
                 fmt::format("{} has no step program record: its Python training crashed before its first step", bundle),
                 "`crashcap inspect` shows the crash; a replay needs at least one recorded step");
  return Error(ErrorCode::Unsupported, fmt::format("{} has no step program record", bundle),
               "record with Recorder::setProgram (TorchScript), or Recorder::setModel with Recorder::setStep");
}

Error noStepProgram(const std::string& bundle, const formats::BundleReader& reader, const formats::BundleRecords& view) {
  const auto env = reader.environment();
  const std::string capture = env ? env->fact("python.capture") : "";
  if (capture.empty() && view.supervision) {
    // Sealed by crashcap run, with no recorder's record in it: none ran in the process.
    const auto& s = *view.supervision;
    const bool observed = formats::askedToRecord(s.environment);
    const std::string ended = s.evidence.empty() ? s.classification : s.evidence;
    if (observed)
      return Error(ErrorCode::Unsupported,
                   fmt::format("{} holds no steps: the process ended before its training's first batch ({}), and "
                               "crashcap run --record begins recording there",
                               bundle, ended),
                   "`crashcap inspect` shows the crash and the end of the program's output");
    return Error(ErrorCode::Unsupported,
                 fmt::format("{} holds no steps: crashcap run sealed it without --record, so nothing in the process "
                             "recorded ({})",
                             bundle, ended),
                 "rerun with `crashcap run --record` to record a Python training's steps; a C++ training records "
                 "itself with crashcap::recorder::Recorder (docs/RECORDING.md)");
  }
  return noStepProgram(bundle, capture, env ? env->fact("python.observed.loader") : "");
}

}  // namespace crashcap::replayer
