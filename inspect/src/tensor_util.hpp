#pragma once
// Private helpers shared by the inspect sources: shape checks and typed element loads.

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "crashcap/formats/dtype.hpp"
#include "crashcap/inspect/host_tensor.hpp"

namespace crashcap::inspect::detail {

/// Product of `shape`; throws Error{InvalidArgument} naming `what` for a negative dimension
/// or a product that overflows uint64.
uint64_t checkedNumel(const std::vector<int64_t>& shape, std::string_view what);

/// Throws Error{InvalidArgument} naming `what` unless t.bytes.size() == numel * elementSize
/// and the dtype is one of the allow-list. Returns numel.
uint64_t requireConsistent(const HostTensor& t, std::string_view what);

/// "[2, 3]" (numpy would say "(2, 3)"; crashcap's CLI uses brackets everywhere).
std::string shapeToString(const std::vector<int64_t>& shape);

template <typename T>
inline T loadAs(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

/// Real part (or the value) of the element at `p`, widened exactly to double.
inline double loadReal(formats::DType dtype, const uint8_t* p) {
  using formats::DType;
  switch (dtype) {
    case DType::Float64: return loadAs<double>(p);
    case DType::Float32: return loadAs<float>(p);
    case DType::Float16: return halfToFloat(loadAs<uint16_t>(p));
    case DType::BFloat16: return bfloat16ToFloat(loadAs<uint16_t>(p));
    case DType::Int8: return loadAs<int8_t>(p);
    case DType::Int16: return loadAs<int16_t>(p);
    case DType::Int32: return loadAs<int32_t>(p);
    case DType::Int64: return double(loadAs<int64_t>(p));
    case DType::UInt8: return loadAs<uint8_t>(p);
    case DType::Bool: return loadAs<uint8_t>(p) != 0 ? 1.0 : 0.0;
    case DType::Complex64: return loadAs<float>(p);
    case DType::Complex128: return loadAs<double>(p);
  }
  return 0.0;
}

/// Imaginary part of the element at `p` (0 for real dtypes).
inline double loadImag(formats::DType dtype, const uint8_t* p) {
  if (dtype == formats::DType::Complex64) return loadAs<float>(p + 4);
  if (dtype == formats::DType::Complex128) return loadAs<double>(p + 8);
  return 0.0;
}

/// Integer and bool elements exactly (int64 does not fit a double).
inline int64_t loadInt(formats::DType dtype, const uint8_t* p) {
  using formats::DType;
  switch (dtype) {
    case DType::Int8: return loadAs<int8_t>(p);
    case DType::Int16: return loadAs<int16_t>(p);
    case DType::Int32: return loadAs<int32_t>(p);
    case DType::Int64: return loadAs<int64_t>(p);
    case DType::UInt8: return loadAs<uint8_t>(p);
    case DType::Bool: return loadAs<uint8_t>(p) != 0 ? 1 : 0;
    default: return int64_t(loadReal(dtype, p));
  }
}

}  // namespace crashcap::inspect::detail
