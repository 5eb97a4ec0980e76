#pragma once
// Replay for trainings recorded with Recorder::setModel (a torch::nn::Module, no TorchScript
// step program): the caller rebuilds the model and gives its step function; the engine is the
// same as crashcap::replayer::replay — the keyframe restored into the model's named parameters
// and buffers, the optimizer built from the recording, each recorded batch, generator state
// and learning rate replayed, fingerprints compared bit for bit, the target step probed op by op.
//
//   auto r = crashcap::replayer::replay("crash.ccap", *net, [&](const auto& batch) {
//     return torch::nll_loss(net->forward(batch.at("image")), batch.at("label"));
//   });
//   if (r.verdict == "reproduced-bitwise") ...

#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "crashcap/replayer/replay.hpp"

namespace crashcap::replayer {

/// Forward and loss of one step for a batch named as it was given to beginStep. Backward, the
/// gradient clipping and the optimizer step are the engine's (the recorded recipe).
using StepFunction = std::function<at::Tensor(const std::map<std::string, at::Tensor>& batch)>;

/// Named tensors as Recorder::setModel takes them (named_parameters(), named_buffers()).
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// Replays a recording made with Recorder::setModel. `model` must have the parameters and
/// buffers the recording names (its initial values do not matter: the keyframe replaces them).
/// Throws crashcap::Error as replay(bundle) does, and InvalidArgument for a recording made
/// with a TorchScript step program.
ReplayResult replay(const std::string& bundle, torch::nn::Module& model, const StepFunction& step,
                    const ReplayOptions& options = {});
/// The same for a model given as named tensors: the tensors `step` computes with, which replay
/// moves (set_data) and overwrites in place. The caller puts the model in training mode.
ReplayResult replay(const std::string& bundle, const NamedTensors& parameters, const NamedTensors& buffers,
                    const StepFunction& step, const ReplayOptions& options = {});

/// Ops bisection (compareWithReference in replay.hpp) of a setModel recording. The model ends in
/// the dtypes and on the device it started with.
ReferenceComparison compareWithReference(const std::string& bundle, const NamedTensors& parameters,
                                         const NamedTensors& buffers, const StepFunction& step, ReplayOptions options,
                                         double tolerance = 1e-3);

}  // namespace crashcap::replayer
