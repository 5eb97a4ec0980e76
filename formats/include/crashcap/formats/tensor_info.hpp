#pragma once
// Description of a tensor stored in a bundle, shared by the writer, reader and tools.

#include <cstdint>
#include <string>
#include <vector>

#include "crashcap/formats/dtype.hpp"

namespace crashcap::formats {

inline constexpr size_t kMaxRank = 16;
inline constexpr size_t kMaxNameBytes = 1024;

/// A tensor as the reader sees it: its descriptor and where its chunks are.
struct TensorInfo {
  uint64_t id = 0;               ///< tensorId shared by its chunks; > 0
  std::string name;
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  uint64_t totalBytes = 0;       ///< product(shape) * elementSize(dtype)
  uint64_t storedBytes = 0;      ///< bytes of its chunk bodies on disk
  std::vector<uint64_t> chunkRecords;  ///< file offsets of its chunk records, by chunk index

  uint64_t numel() const { return elementSize(dtype) ? totalBytes / elementSize(dtype) : 0; }
};

/// Checks a tensor name against the schema's rules (1..1024 bytes of valid UTF-8 without
/// control characters); throws InvalidArgument saying why.
void validateTensorName(const std::string& name);

/// product(shape) * elementSize(dtype); throws InvalidArgument on a negative dim, rank >
/// kMaxRank or overflow (readers rethrow it as Corrupt). `what` names the tensor.
uint64_t tensorByteSize(DType dtype, const std::vector<int64_t>& shape, const std::string& what);

/// "[2, 3, 224, 224]".
std::string formatShape(const std::vector<int64_t>& shape);

}  // namespace crashcap::formats
