#include "crashcap/formats/torch/tensor_bridge.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>
#include <sstream>

#include "crashcap/formats/error.hpp"
#include "crashcap/formats/torch/errors.hpp"
#include "crashcap/formats/tensor_info.hpp"

// Bundle tensors are little-endian; at::Tensor bytes are the host's. Copying them straight
// through is only right on a little-endian host.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "crashcap's tensor bridge copies host bytes as-is and needs a little-endian host"
#endif

namespace crashcap::formats::torch {
namespace {

constexpr const char* kAllowList =
    "a bundle holds float64, float32, float16, bfloat16, int8, int16, int32, int64, uint8, bool, "
    "complex64 and complex128";


std::vector<int64_t> shapeOf(const at::Tensor& t) { return std::vector<int64_t>(t.sizes().begin(), t.sizes().end()); }

// `t` as a contiguous, dense, host tensor whose bytes are its values: `t` itself when it
// already is one, else a copy. copy_ resolves what the bytes alone do not say: strides
// (transposed, sliced, expanded), the lazy conjugate and negative bits, and the device.
at::Tensor hostContiguous(const at::Tensor& t, const std::string& name) {
  at::Tensor src = t.detach();  // the copy below must not become part of an autograd graph
  bool usable = src.device().is_cpu() && src.is_contiguous() && !src.is_conj() && !src.is_neg() &&
                (src.data_ptr() != nullptr || src.numel() == 0);
  if (usable) return src;
  try {
    at::Tensor out = at::empty(src.sizes(), at::TensorOptions().dtype(src.scalar_type()).device(at::kCPU));
    out.copy_(src);
    return out;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::Unsupported,
                fmt::format("cannot copy tensor '{}' ({}, shape {}) from device {} to the host: {}", name,
                            c10::toString(src.scalar_type()), formatShape(shapeOf(src)), src.device().str(),
                            errorMessage(e)),
                "write tensors that live on the CPU or on a CUDA device");
  }
}

}  // namespace

std::optional<DType> toDType(c10::ScalarType type) {
  // `default` rather than a full list: newer LibTorch adds scalar types (uint16, float8, ...)
  // that a bundle does not hold.
  switch (type) {
    case c10::ScalarType::Double: return DType::Float64;
    case c10::ScalarType::Float: return DType::Float32;
    case c10::ScalarType::Half: return DType::Float16;
    case c10::ScalarType::BFloat16: return DType::BFloat16;
    case c10::ScalarType::Char: return DType::Int8;
    case c10::ScalarType::Short: return DType::Int16;
    case c10::ScalarType::Int: return DType::Int32;
    case c10::ScalarType::Long: return DType::Int64;
    case c10::ScalarType::Byte: return DType::UInt8;
    case c10::ScalarType::Bool: return DType::Bool;
    case c10::ScalarType::ComplexFloat: return DType::Complex64;
    case c10::ScalarType::ComplexDouble: return DType::Complex128;
    default: return std::nullopt;
  }
}

c10::ScalarType toScalarType(DType dtype) {
  switch (dtype) {
    case DType::Float64: return c10::ScalarType::Double;
    case DType::Float32: return c10::ScalarType::Float;
    case DType::Float16: return c10::ScalarType::Half;
    case DType::BFloat16: return c10::ScalarType::BFloat16;
    case DType::Int8: return c10::ScalarType::Char;
    case DType::Int16: return c10::ScalarType::Short;
    case DType::Int32: return c10::ScalarType::Int;
    case DType::Int64: return c10::ScalarType::Long;
    case DType::UInt8: return c10::ScalarType::Byte;
    case DType::Bool: return c10::ScalarType::Bool;
    case DType::Complex64: return c10::ScalarType::ComplexFloat;
    case DType::Complex128: return c10::ScalarType::ComplexDouble;
  }
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("dtype number {} is not on the bundle allow-list", static_cast<unsigned>(dtype)));
}

uint64_t writeTensor(BundleWriter& writer, const std::string& name, const at::Tensor& t) {
  if (!t.defined())
    throw Error(ErrorCode::InvalidArgument, fmt::format("tensor '{}' is undefined (a default-constructed at::Tensor)", name));
  auto dtype = toDType(t.scalar_type());
  if (!dtype)
    throw Error(ErrorCode::Unsupported,
                fmt::format("tensor '{}' has dtype {}, which a bundle cannot hold", name, c10::toString(t.scalar_type())),
                fmt::format("{}; convert it first, e.g. with .to(at::kFloat)", kAllowList));
  if (t.layout() != at::kStrided || t.is_nested()) {
    std::ostringstream layout;
    if (t.is_nested()) layout << "nested";
    else layout << t.layout();
    throw Error(ErrorCode::Unsupported,
                fmt::format("tensor '{}' has layout {}; a bundle holds dense (strided) tensors", name, layout.str()),
                "convert it first, e.g. with .to_dense()");
  }
  at::Tensor host = hostContiguous(t, name);
  uint64_t size = static_cast<uint64_t>(host.numel()) * elementSize(*dtype);
  CRASHCAP_ASSERT(size == host.nbytes(),
                  fmt::format("tensor '{}': {} elements of {} is {} bytes but at::Tensor says {}", name, host.numel(),
                              dtypeName(*dtype), size, host.nbytes()));
  return writer.writeTensor(name, *dtype, shapeOf(host), host.data_ptr(), size);
}

at::Tensor readTensor(const BundleReader& reader, const TensorInfo& info) {
  std::vector<int64_t> shape = info.shape;
  uint64_t expected = tensorByteSize(info.dtype, shape, "'" + info.name + "'");
  if (expected != info.totalBytes)
    throw Error(ErrorCode::Corrupt,
                fmt::format("tensor '{}' of dtype {} and shape {} should have {} bytes; its descriptor says {}",
                            info.name, dtypeName(info.dtype), formatShape(shape), expected, info.totalBytes),
                "run `crashcap verify` on the bundle");
  // Read straight into the tensor's storage: no intermediate buffer for large tensors.
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(toScalarType(info.dtype)).device(at::kCPU));
  reader.readTensor(info, out.data_ptr(), info.totalBytes);
  return out;
}

at::Tensor readTensor(const BundleReader& reader, const std::string& name) {
  return readTensor(reader, reader.get(name));
}

at::Tensor tensorFromBytes(DType dtype, const std::vector<int64_t>& shape, const void* bytes, uint64_t size) {
  uint64_t expected = tensorByteSize(dtype, shape, "from bytes");
  if (size != expected)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("a {} tensor of shape {} has {} bytes; got {}", dtypeName(dtype), formatShape(shape),
                            expected, size));
  if (size > 0 && bytes == nullptr)
    throw Error(ErrorCode::InvalidArgument, fmt::format("got a null pointer for {} bytes", size));
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(toScalarType(dtype)).device(at::kCPU));
  if (size > 0) std::memcpy(out.data_ptr(), bytes, size);
  return out;
}

}  // namespace crashcap::formats::torch
