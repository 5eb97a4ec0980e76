#pragma once
// numpy-like printing of a tensor that summarizes large ones.

#include <cstdint>
#include <string>

#include "crashcap/inspect/host_tensor.hpp"

namespace crashcap::inspect {

struct PrintOptions {
  uint64_t threshold = 1000;   ///< summarize when numel > threshold (numpy's default)
  int edgeItems = 3;           ///< items kept at each edge of a summarized dimension
  int precision = 4;           ///< significant digits after the point for floating types
  int lineWidth = 100;         ///< wrap rows longer than this
};

/// numpy-style text: "[[ 1.0000, -2.5000,  nan],\n [ ...]]" with "..." where summarized;
/// 0-d tensors print as a scalar, empty tensors as "[]". Bool as True/False, complex as
/// "1.0000+2.0000j". Never reads outside t.bytes.
std::string formatTensor(const HostTensor& t, const PrintOptions& options = {});

}  // namespace crashcap::inspect
