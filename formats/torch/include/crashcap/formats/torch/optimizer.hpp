#pragma once
// The optimizer, both ways, in one place: what the recorder writes of a torch::optim::Optimizer
// (its kind, each group's options, each parameter's state tensors and step counter: the
// optimizer_spec record and the keyframe's optimizer tensors) and how replay builds the same
// optimizer back from it. Each kind's two directions sit side by side in optimizer.cpp, so a
// field cannot be written under one name and read under another.
//
// Known kinds: "sgd", "adam", "adamw", "rmsprop", "adagrad". Another optimizer is recorded as
// "unknown" with its learning rate only, and replay refuses it.

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "crashcap/formats/records.hpp"

namespace torch::optim {
class Optimizer;
}

namespace crashcap::formats::torch {

/// The spec of `optimizer`: its kind and, per group, its options and its parameters as `nameOf`
/// names them. A parameter `nameOf` gives "" for is left out and counted in `unnamed`.
OptimizerSpecData describeOptimizer(::torch::optim::Optimizer& optimizer,
                                    const std::function<std::string(const at::Tensor&)>& nameOf, size_t& unnamed);

/// One parameter's optimizer state: named tensors ("exp_avg", "momentum_buffer", ...) and the
/// step counter of the kinds that keep one.
struct ParameterState {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::optional<int64_t> step;
};
/// The state `optimizer` holds for `parameter` (empty before its first step). The tensors are the
/// optimizer's own, not copies.
ParameterState parameterState(::torch::optim::Optimizer& optimizer, const at::Tensor& parameter);

/// An optimizer of `spec.kind` over `params` (by name) with each group's recorded options.
/// Throws Error{Unsupported} for a kind replay does not know, Error{Corrupt} for a group that
/// names a parameter `params` lacks or a spec without groups.
std::unique_ptr<::torch::optim::Optimizer> makeOptimizer(const OptimizerSpecData& spec,
                                                         const std::map<std::string, at::Tensor>& params);

/// Gives `parameter` in `optimizer` (of kind `kind`) the state parameterState wrote: `get(key)`
/// returns the tensor of that key, or an undefined tensor when the keyframe has none. A parameter
/// whose state was never created (no step yet) stays without state.
void restoreParameterState(::torch::optim::Optimizer& optimizer, const std::string& kind, const at::Tensor& parameter,
                           const std::function<at::Tensor(const char* key)>& get, int64_t step);

}  // namespace crashcap::formats::torch
