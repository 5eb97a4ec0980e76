#pragma once
// HostTensor: a tensor's contiguous bytes in host memory, as read from a bundle or a .npy.

#include <cstdint>
#include <string>
#include <vector>

#include "crashcap/formats/dtype.hpp"

namespace crashcap::formats {
class BundleReader;
}

namespace crashcap::inspect {

/// Owning, contiguous, row-major, little-endian tensor bytes. Invariant:
/// bytes.size() == product(shape) * elementSize(dtype).
struct HostTensor {
  formats::DType dtype = formats::DType::Float32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  /// Product of shape (1 for 0-d); Error{InvalidArgument} for a negative dimension or overflow.
  uint64_t numel() const;
  /// Element i (flat index) as double; complex types give the real part. Half and bfloat16
  /// are widened exactly.
  double at(uint64_t i) const;
  /// Imaginary part of element i (0 for real types).
  double imagAt(uint64_t i) const;
};

/// Tensor `name` of `reader`, read whole into memory (within the reader's limits). Throws
/// Error{NotFound} for a name the bundle lacks and the reader's errors for damage.
HostTensor loadTensor(const formats::BundleReader& reader, const std::string& name);

/// Flat index -> multi-index for `shape`.
std::vector<int64_t> unravelIndex(uint64_t flat, const std::vector<int64_t>& shape);

/// float16 / bfloat16 bit patterns to float, exactly (NaN and Inf preserved).
float halfToFloat(uint16_t bits);
float bfloat16ToFloat(uint16_t bits);

}  // namespace crashcap::inspect
