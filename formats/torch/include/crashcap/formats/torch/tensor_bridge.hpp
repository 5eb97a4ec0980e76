#pragma once
// The thin bridge between at::Tensor and bundle tensors. The only formats code that sees ATen.

#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/dtype.hpp"

namespace crashcap::formats::torch {

/// The bundle dtype of a scalar type, or nullopt for types a bundle does not hold
/// (quantized, complex32, ...).
std::optional<DType> toDType(c10::ScalarType type);
/// The scalar type of a bundle dtype.
c10::ScalarType toScalarType(DType dtype);

/// Writes `t` under `name`: any dtype on the allow-list, any shape (0-d, empty,
/// non-contiguous); device tensors are copied to the host first. Throws
/// Error{Unsupported} for other dtypes, naming the dtype. Returns the tensor id.
uint64_t writeTensor(BundleWriter& writer, const std::string& name, const at::Tensor& t);

/// Reads the tensor described by `info` into a new contiguous CPU tensor.
at::Tensor readTensor(const BundleReader& reader, const TensorInfo& info);
/// Reads the tensor named `name`; throws Error{NotFound}.
at::Tensor readTensor(const BundleReader& reader, const std::string& name);

/// A CPU tensor over a copy of contiguous bytes with this dtype and shape.
at::Tensor tensorFromBytes(DType dtype, const std::vector<int64_t>& shape, const void* bytes, uint64_t size);

}  // namespace crashcap::formats::torch
