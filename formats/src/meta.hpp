#pragma once
// Record metas: Cap'n Proto encode/decode with every schema invariant checked on decode.

#include <cstdint>
#include <string>
#include <vector>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/limits.hpp"
#include "crashcap/formats/tensor_info.hpp"

namespace crashcap::formats::detail {

/// The meta of one tensor chunk record.
struct ChunkMeta {
  uint64_t tensorId = 0;
  std::string name;
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  uint64_t totalBytes = 0;
  uint32_t chunkIndex = 0;
  uint32_t chunkCount = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint8_t shuffle = 0;
};

/// The decoded index body.
struct IndexData {
  std::vector<RecordEntry> records;
  std::vector<TensorInfo> tensors;
};

std::vector<uint8_t> encodeRecordingInfo(const RecordingInfoData& info);
std::vector<uint8_t> encodeChunk(const ChunkMeta& chunk);
std::vector<uint8_t> encodeNote(const NoteData& note);
std::vector<uint8_t> encodeEnvironment(const EnvironmentData& env);
std::vector<uint8_t> encodeIndexInfo(uint64_t recordCount, uint64_t tensorCount);
std::vector<uint8_t> encodeIndex(const IndexData& index);

// Decoders throw Error{Corrupt} (or LimitExceeded) saying which invariant failed.
RecordingInfoData decodeRecordingInfo(const uint8_t* meta, size_t size, const ReaderLimits& limits);
/// Also checks rawLength == length and every per-chunk invariant of bundle.capnp.
ChunkMeta decodeChunk(const uint8_t* meta, size_t size, uint64_t rawLength, const ReaderLimits& limits);
NoteData decodeNote(const uint8_t* meta, size_t size, const ReaderLimits& limits);
EnvironmentData decodeEnvironment(const uint8_t* meta, size_t size, const ReaderLimits& limits);
/// Returns (recordCount, tensorCount).
std::pair<uint64_t, uint64_t> decodeIndexInfo(const uint8_t* meta, size_t size, const ReaderLimits& limits);
/// Checks record offsets are increasing, inside [firstRecord, indexOffset), and each
/// tensor's chunk offsets name listed tensor_chunk records.
IndexData decodeIndex(const uint8_t* body, size_t size, uint64_t firstRecord, uint64_t indexOffset,
                      const ReaderLimits& limits);

/// True when two chunks carry the same tensor descriptor (id, name, dtype, shape, total, count).
bool sameTensor(const ChunkMeta& a, const ChunkMeta& b);

}  // namespace crashcap::formats::detail
