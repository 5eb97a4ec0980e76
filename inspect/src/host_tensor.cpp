#include "crashcap/inspect/host_tensor.hpp"

#include <cmath>
#include <limits>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/error.hpp"
#include "tensor_util.hpp"

namespace crashcap::inspect {

HostTensor loadTensor(const formats::BundleReader& reader, const std::string& name) {
  const auto& t = reader.get(name);
  HostTensor h;
  h.dtype = t.dtype;
  h.shape = t.shape;
  h.bytes = reader.readTensor(t);
  return h;
}

uint64_t HostTensor::numel() const { return detail::checkedNumel(shape, "tensor"); }

double HostTensor::at(uint64_t i) const {
  size_t size = formats::elementSize(dtype);
  CRASHCAP_ASSERT(size != 0 && i < bytes.size() / size,
                  "element " + std::to_string(i) + " of a " + std::string(formats::dtypeName(dtype)) +
                      " tensor holding " + std::to_string(bytes.size()) + " bytes");
  return detail::loadReal(dtype, bytes.data() + i * size);
}

double HostTensor::imagAt(uint64_t i) const {
  size_t size = formats::elementSize(dtype);
  CRASHCAP_ASSERT(size != 0 && i < bytes.size() / size,
                  "element " + std::to_string(i) + " of a " + std::string(formats::dtypeName(dtype)) +
                      " tensor holding " + std::to_string(bytes.size()) + " bytes");
  return detail::loadImag(dtype, bytes.data() + i * size);
}

std::vector<int64_t> unravelIndex(uint64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> index(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    CRASHCAP_ASSERT(shape[d] > 0, "unravelIndex over shape " + detail::shapeToString(shape));
    auto n = uint64_t(shape[d]);
    index[d] = int64_t(flat % n);
    flat /= n;
  }
  CRASHCAP_ASSERT(flat == 0, "flat index beyond the end of shape " + detail::shapeToString(shape));
  return index;
}

float halfToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {
      // Subnormal: mantissa * 2^-24, exact in float.
      float f = std::ldexp(float(mantissa), -24);
      return sign ? -f : f;
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);   // Inf, or NaN with its payload kept
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float bfloat16ToFloat(uint16_t bits16) {
  uint32_t bits = uint32_t(bits16) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

namespace detail {

uint64_t checkedNumel(const std::vector<int64_t>& shape, std::string_view what) {
  uint64_t n = 1;
  bool overflow = false, zero = false;
  for (int64_t d : shape) {
    if (d < 0)
      throw Error(ErrorCode::InvalidArgument,
                  std::string(what) + " has a negative dimension: shape " + shapeToString(shape));
    if (d == 0) zero = true;
    else if (n > std::numeric_limits<uint64_t>::max() / uint64_t(d)) overflow = true;
    n *= uint64_t(d);
  }
  // A zero dimension anywhere makes an overflowing product of the others harmless.
  if (zero) return 0;
  if (overflow)
    throw Error(ErrorCode::InvalidArgument,
                std::string(what) + " shape " + shapeToString(shape) + " has more than 2^64 elements");
  return n;
}

uint64_t requireConsistent(const HostTensor& t, std::string_view what) {
  size_t size = formats::elementSize(t.dtype);
  if (size == 0)
    throw Error(ErrorCode::InvalidArgument,
                std::string(what) + " has an invalid dtype number " + std::to_string(unsigned(t.dtype)));
  uint64_t n = checkedNumel(t.shape, what);
  if (n > std::numeric_limits<uint64_t>::max() / size || t.bytes.size() != n * size)
    throw Error(ErrorCode::InvalidArgument,
                std::string(what) + ": shape " + shapeToString(t.shape) + " of " +
                    std::string(formats::dtypeName(t.dtype)) + " needs " + std::to_string(n) + " x " +
                    std::to_string(size) + " bytes, found " + std::to_string(t.bytes.size()));
  return n;
}

std::string shapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace detail
}  // namespace crashcap::inspect
