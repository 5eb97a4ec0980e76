#pragma once
// Summary statistics of a tensor, the first thing to look at when a step went non-finite.

#include <cstdint>
#include <optional>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "crashcap/inspect/host_tensor.hpp"

namespace crashcap::inspect {

/// Statistics over all elements. min/max/mean/std are over finite elements only and absent
/// when there are none (for complex tensors they are over the magnitude). NaN and Inf
/// positions are multi-indices of the first occurrence in row-major order.
struct TensorStats {
  uint64_t count = 0;
  uint64_t nanCount = 0;
  uint64_t posInfCount = 0;
  uint64_t negInfCount = 0;
  uint64_t zeroCount = 0;
  std::optional<double> min, max, mean, std;   ///< std is the population std (ddof 0)
  std::optional<std::vector<int64_t>> firstNan, firstInf;
};

/// One pass over t's bytes; Error{InvalidArgument} when they do not match its shape.
TensorStats computeStats(const HostTensor& t);
/// {"count", "nan_count", "inf_count", "pos_inf_count", "neg_inf_count", "zero_count",
///  "min", "max", "mean", "std" (null when absent), "first_nan", "first_inf" (index list or null)}.
nlohmann::json statsToJson(const TensorStats& s);
/// Multi-line text for the CLI: "min -1.5  max 3.25  mean ...\nNaN 3 (first at [0, 2])".
std::string formatStats(const TensorStats& s);

}  // namespace crashcap::inspect
