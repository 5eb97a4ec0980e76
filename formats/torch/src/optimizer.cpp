#include "crashcap/formats/torch/optimizer.hpp"

#include <fmt/format.h>
#include <torch/optim.h>

#include <sstream>
#include <type_traits>

#include "crashcap/formats/error.hpp"

namespace crashcap::formats::torch {
namespace {

using namespace ::torch::optim;
using Get = std::function<at::Tensor(const char*)>;

/// The state map is keyed by the parameter's TensorImpl pointer: as a string in LibTorch 1.x, as
/// the pointer itself in later versions.
template <typename Map>
auto stateKey(const at::Tensor& p) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream key;
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

void addDefined(ParameterState& out, const char* key, const at::Tensor& t) {
  if (t.defined()) out.tensors.emplace_back(key, t);
}

bool flag(double v) { return v != 0; }
double number(bool v) { return v ? 1.0 : 0.0; }

// One struct per kind: `record` and `recordState` are what the recorder writes, `replay` and
// `replayState` read the same names back. Defaults in `replay` are LibTorch's, for recordings
// that lack an option.

struct SgdKind {
  static constexpr const char* kName = "sgd";
  using Type = SGD;
  using Options = SGDOptions;
  using State = SGDParamState;
  static std::vector<NumberEntry> record(const Options& o) {
    return {{"lr", o.lr()}, {"momentum", o.momentum()}, {"dampening", o.dampening()},
            {"weight_decay", o.weight_decay()}, {"nesterov", number(o.nesterov())}};
  }
  static Options replay(const ParamGroupData& g) {
    return Options(g.option("lr", 1e-3))
        .momentum(g.option("momentum", 0))
        .dampening(g.option("dampening", 0))
        .weight_decay(g.option("weight_decay", 0))
        .nesterov(flag(g.option("nesterov", 0)));
  }
  static void recordState(const State& s, ParameterState& out) { addDefined(out, "momentum_buffer", s.momentum_buffer()); }
  static std::unique_ptr<State> replayState(const Get& get, int64_t) {
    auto m = get("momentum_buffer");
    if (!m.defined()) return nullptr;
    auto s = std::make_unique<State>();
    s->momentum_buffer(m);
    return s;
  }
};

/// Adam and AdamW have the same options and state under different types; AdamW's weight decay
/// defaults differently.
template <typename OptimizerT, typename OptionsT, typename StateT, const char* Name, int DefaultDecayPer100>
struct AdamLikeKind {
  static constexpr const char* kName = Name;
  using Type = OptimizerT;
  using Options = OptionsT;
  using State = StateT;
  static std::vector<NumberEntry> record(const Options& o) {
    return {{"lr", o.lr()},   {"beta1", std::get<0>(o.betas())},  {"beta2", std::get<1>(o.betas())},
            {"eps", o.eps()}, {"weight_decay", o.weight_decay()}, {"amsgrad", number(o.amsgrad())}};
  }
  static Options replay(const ParamGroupData& g) {
    return Options(g.option("lr", 1e-3))
        .betas({g.option("beta1", 0.9), g.option("beta2", 0.999)})
        .eps(g.option("eps", 1e-8))
        .weight_decay(g.option("weight_decay", DefaultDecayPer100 / 100.0))
        .amsgrad(flag(g.option("amsgrad", 0)));
  }
  static void recordState(const State& s, ParameterState& out) {
    out.step = s.step();
    addDefined(out, "exp_avg", s.exp_avg());
    addDefined(out, "exp_avg_sq", s.exp_avg_sq());
    addDefined(out, "max_exp_avg_sq", s.max_exp_avg_sq());
  }
  static std::unique_ptr<State> replayState(const Get& get, int64_t step) {
    auto a = get("exp_avg");
    if (!a.defined()) return nullptr;
    auto s = std::make_unique<State>();
    s->step(step);
    s->exp_avg(a);
    s->exp_avg_sq(get("exp_avg_sq"));
    if (auto m = get("max_exp_avg_sq"); m.defined()) s->max_exp_avg_sq(m);
    return s;
  }
};
constexpr char kAdam[] = "adam";
constexpr char kAdamW[] = "adamw";
using AdamKind = AdamLikeKind<Adam, AdamOptions, AdamParamState, kAdam, 0>;
using AdamWKind = AdamLikeKind<AdamW, AdamWOptions, AdamWParamState, kAdamW, 1>;

struct RmspropKind {
  static constexpr const char* kName = "rmsprop";
  using Type = RMSprop;
  using Options = RMSpropOptions;
  using State = RMSpropParamState;
  static std::vector<NumberEntry> record(const Options& o) {
    return {{"lr", o.lr()},
            {"alpha", o.alpha()},
            {"eps", o.eps()},
            {"weight_decay", o.weight_decay()},
            {"momentum", o.momentum()},
            {"centered", number(o.centered())}};
  }
  static Options replay(const ParamGroupData& g) {
    return Options(g.option("lr", 1e-2))
        .alpha(g.option("alpha", 0.99))
        .eps(g.option("eps", 1e-8))
        .weight_decay(g.option("weight_decay", 0))
        .momentum(g.option("momentum", 0))
        .centered(flag(g.option("centered", 0)));
  }
  static void recordState(const State& s, ParameterState& out) {
    out.step = s.step();
    addDefined(out, "square_avg", s.square_avg());
    addDefined(out, "momentum_buffer", s.momentum_buffer());
    addDefined(out, "grad_avg", s.grad_avg());
  }
  static std::unique_ptr<State> replayState(const Get& get, int64_t step) {
    auto sq = get("square_avg");
    if (!sq.defined()) return nullptr;
    auto s = std::make_unique<State>();
    s->step(step);
    s->square_avg(sq);
    if (auto m = get("momentum_buffer"); m.defined()) s->momentum_buffer(m);
    if (auto g = get("grad_avg"); g.defined()) s->grad_avg(g);
    return s;
  }
};

struct AdagradKind {
  static constexpr const char* kName = "adagrad";
  using Type = Adagrad;
  using Options = AdagradOptions;
  using State = AdagradParamState;
  static std::vector<NumberEntry> record(const Options& o) {
    return {{"lr", o.lr()},
            {"lr_decay", o.lr_decay()},
            {"weight_decay", o.weight_decay()},
            {"initial_accumulator_value", o.initial_accumulator_value()},
            {"eps", o.eps()}};
  }
  static Options replay(const ParamGroupData& g) {
    return Options(g.option("lr", 1e-2))
        .lr_decay(g.option("lr_decay", 0))
        .weight_decay(g.option("weight_decay", 0))
        .initial_accumulator_value(g.option("initial_accumulator_value", 0))
        .eps(g.option("eps", 1e-10));
  }
  static void recordState(const State& s, ParameterState& out) {
    out.step = s.step();
    addDefined(out, "sum", s.sum());
  }
  static std::unique_ptr<State> replayState(const Get& get, int64_t step) {
    auto sum = get("sum");
    if (!sum.defined()) return nullptr;
    auto s = std::make_unique<State>();
    s->step(step);
    s->sum(sum);
    return s;
  }
};

/// Calls `f(Kind{})` for each known kind until it returns true; AdamW before Adam, so a
/// dynamic_cast never mistakes one for the other.
template <typename F>
bool forEachKind(F&& f) {
  return f(SgdKind{}) || f(AdamWKind{}) || f(AdamKind{}) || f(RmspropKind{}) || f(AdagradKind{});
}

}  // namespace

OptimizerSpecData describeOptimizer(Optimizer& optimizer, const std::function<std::string(const at::Tensor&)>& nameOf,
                                    size_t& unnamed) {
  OptimizerSpecData spec;
  spec.kind = "unknown";
  forEachKind([&](auto kind) {
    using K = decltype(kind);
    if (!dynamic_cast<typename K::Type*>(&optimizer)) return false;
    spec.kind = K::kName;
    return true;
  });
  for (const auto& g : optimizer.param_groups()) {
    ParamGroupData group;
    for (const auto& p : g.params()) {
      std::string name = nameOf(p);
      if (name.empty())
        ++unnamed;
      else
        group.parameters.push_back(std::move(name));
    }
    bool known = forEachKind([&](auto kind) {
      using K = decltype(kind);
      auto* o = dynamic_cast<const typename K::Options*>(&g.options());
      if (o) group.options = K::record(*o);
      return o != nullptr;
    });
    if (!known) group.options = {{"lr", g.options().get_lr()}};
    spec.groups.push_back(std::move(group));
  }
  return spec;
}

ParameterState parameterState(Optimizer& optimizer, const at::Tensor& parameter) {
  ParameterState out;
  const auto& state = optimizer.state();
  auto it = state.find(stateKey<std::decay_t<decltype(state)>>(parameter));
  if (it == state.end()) return out;
  const OptimizerParamState& s = *it->second;
  forEachKind([&](auto kind) {
    using K = decltype(kind);
    auto* typed = dynamic_cast<const typename K::State*>(&s);
    if (typed) K::recordState(*typed, out);
    return typed != nullptr;
  });
  return out;
}

std::unique_ptr<Optimizer> makeOptimizer(const OptimizerSpecData& spec, const std::map<std::string, at::Tensor>& params) {
  if (spec.groups.empty()) throw Error(ErrorCode::Corrupt, "optimizer spec has no parameter groups");
  std::unique_ptr<Optimizer> out;
  bool known = forEachKind([&](auto kind) {
    using K = decltype(kind);
    if (spec.kind != K::kName) return false;
    std::vector<OptimizerParamGroup> groups;
    for (const auto& g : spec.groups) {
      std::vector<at::Tensor> ps;
      for (const auto& name : g.parameters) {
        auto it = params.find(name);
        if (it == params.end())
          throw Error(ErrorCode::Corrupt,
                      fmt::format("optimizer group names parameter '{}', which the step program lacks", name));
        ps.push_back(it->second);
      }
      groups.emplace_back(std::move(ps), std::make_unique<typename K::Options>(K::replay(g)));
    }
    // The defaults apply only to groups without options; every group here has its own.
    out = std::make_unique<typename K::Type>(std::move(groups), K::replay(spec.groups.front()));
    return true;
  });
  if (!known)
    throw Error(ErrorCode::Unsupported, fmt::format("optimizer kind '{}' cannot be replayed", spec.kind),
                "the recorder knows SGD, Adam, AdamW, RMSprop and Adagrad");
  return out;
}

void restoreParameterState(Optimizer& optimizer, const std::string& kind, const at::Tensor& parameter, const Get& get,
                           int64_t step) {
  forEachKind([&](auto k) {
    using K = decltype(k);
    if (kind != K::kName) return false;
    if (auto s = K::replayState(get, step)) {
      auto& state = optimizer.state();
      state[stateKey<std::decay_t<decltype(state)>>(parameter)] = std::move(s);
    }
    return true;
  });
}

}  // namespace crashcap::formats::torch
