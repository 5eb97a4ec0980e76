#pragma once
// .pt files that Python's torch.load reads.

#include <string>

#include <ATen/core/Tensor.h>

namespace crashcap::formats::torch {

/// Saves `t` so that `torch.load(path)` in Python returns an equal tensor (dtype, shape,
/// values). Throws Error{Io} naming the path.
void savePt(const at::Tensor& t, const std::string& path);

/// Loads a tensor saved by savePt (or by Python's torch.save of a single tensor).
at::Tensor loadPt(const std::string& path);

}  // namespace crashcap::formats::torch
