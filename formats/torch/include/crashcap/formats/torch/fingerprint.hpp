#pragma once
// The loss and gradient norm of a step's fingerprint (step_end.loss, step_end.gradNorm), computed
// the same way by the recorder and by the replayer, which compares the two bit for bit. Each step_end says which
// method made its norm, so a replay computes it the same way whichever crashcap recorded it.

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "crashcap/formats/records.hpp"

namespace crashcap::formats::torch {

struct GradientNorm {
  double value = 0;
  GradNormMethod method = GradNormMethod::ForeachNorm;
  /// `value` is not finite though every gradient is: their norm overflows float32.
  bool overflowed = false;
};

/// The total 2-norm of `grads`. Blocked (when every gradient is a float32 CPU tensor): the
/// elements in fixed blocks of kGradNormBlock, each block's squares summed in 16 float lanes and
/// the lanes in double, the blocks added in order, on every LibTorch thread: one read of the
/// gradients at the memory's bandwidth, and the same bits whatever the thread count or the
/// vector width. Otherwise, or when the blocked sum is not finite although every gradient is
/// (a float square overflows at about 1e19): `at::_foreach_norm` and the norm of the norms, as
/// LibTorch computes them, so that such a step is judged exactly as before. A sparse gradient
/// counts as its coalesced values (duplicate indices summed), whose norm is its own.
GradientNorm gradientNorm(const std::vector<at::Tensor>& grads);

/// The norm by a given method, as a replay recomputes a recorded one. Gradients the blocked
/// method cannot read (a replay in float64, or on a device: a setup other than the recorded one,
/// where no bits are compared) get LibTorch's norm in their own dtype, which a float32 copy could
/// overflow.
double gradientNorm(const std::vector<at::Tensor>& grads, GradNormMethod method);

/// A step's loss as one number (step_end.loss): a one-element loss's value, a larger loss's sum
/// (a per-sample loss given to backward() with a gradient). Reads the value, so on a device it
/// waits for the step's kernels.
double lossValue(const at::Tensor& loss);

inline constexpr int64_t kGradNormBlock = 64 * 1024;

}  // namespace crashcap::formats::torch
