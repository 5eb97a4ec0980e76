#include "meta.hpp"

#include "capnp_util.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>
#include <kj/exception.h>

#include <cstring>

#include "bundle.capnp.h"
#include "crashcap/formats/error.hpp"

namespace crashcap::formats::detail {

std::vector<uint8_t> encodeRecordingInfo(const RecordingInfoData& info) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::RecordingInfo>();
  r.setProducer(info.producer);
  r.setToolVersion(info.toolVersion);
  r.setHostname(info.hostname);
  r.setPid(info.pid);
  r.setCreatedNs(info.createdNs);
  return toBytes(b);
}

std::vector<uint8_t> encodeChunk(const ChunkMeta& c) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::TensorChunk>();
  r.setTensorId(c.tensorId);
  r.setName(c.name);
  r.setDtype(static_cast<schema::DType>(c.dtype));
  auto shape = r.initShape(unsigned(c.shape.size()));
  for (unsigned i = 0; i < c.shape.size(); ++i) shape.set(i, c.shape[i]);
  r.setTotalBytes(c.totalBytes);
  r.setChunkIndex(c.chunkIndex);
  r.setChunkCount(c.chunkCount);
  r.setOffset(c.offset);
  r.setLength(c.length);
  r.setShuffle(c.shuffle);
  return toBytes(b);
}

std::vector<uint8_t> encodeNote(const NoteData& n) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::Note>();
  r.setKey(n.key);
  r.setText(n.text);
  return toBytes(b);
}

std::vector<uint8_t> encodeEnvironment(const EnvironmentData& env) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::Environment>();
  auto fill = [](auto list, const std::vector<std::pair<std::string, std::string>>& kv) {
    for (unsigned i = 0; i < kv.size(); ++i) {
      list[i].setKey(kv[i].first);
      list[i].setValue(kv[i].second);
    }
  };
  fill(r.initFacts(unsigned(env.facts.size())), env.facts);
  fill(r.initVariables(unsigned(env.variables.size())), env.variables);
  auto cmd = r.initCommandLine(unsigned(env.commandLine.size()));
  for (unsigned i = 0; i < env.commandLine.size(); ++i) cmd.set(i, env.commandLine[i]);
  auto red = r.initRedacted(unsigned(env.redacted.size()));
  for (unsigned i = 0; i < env.redacted.size(); ++i) red.set(i, env.redacted[i]);
  return toBytes(b);
}

std::vector<uint8_t> encodeIndexInfo(uint64_t recordCount, uint64_t tensorCount) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::IndexInfo>();
  r.setRecordCount(recordCount);
  r.setTensorCount(tensorCount);
  return toBytes(b);
}

std::vector<uint8_t> encodeIndex(const IndexData& index) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::Index>();
  auto records = r.initRecords(unsigned(index.records.size()));
  for (unsigned i = 0; i < index.records.size(); ++i) {
    const auto& e = index.records[i];
    auto o = records[i];
    o.setOffset(e.offset);
    o.setType(e.type);
    o.setSequence(e.sequence);
    o.setLength(e.length);
  }
  auto tensors = r.initTensors(unsigned(index.tensors.size()));
  for (unsigned i = 0; i < index.tensors.size(); ++i) {
    const auto& t = index.tensors[i];
    auto o = tensors[i];
    o.setTensorId(t.id);
    o.setName(t.name);
    o.setDtype(static_cast<schema::DType>(t.dtype));
    auto shape = o.initShape(unsigned(t.shape.size()));
    for (unsigned j = 0; j < t.shape.size(); ++j) shape.set(j, t.shape[j]);
    o.setTotalBytes(t.totalBytes);
    o.setStoredBytes(t.storedBytes);
    auto chunks = o.initChunkRecords(unsigned(t.chunkRecords.size()));
    for (unsigned j = 0; j < t.chunkRecords.size(); ++j) chunks.set(j, t.chunkRecords[j]);
  }
  return toBytes(b);
}

RecordingInfoData decodeRecordingInfo(const uint8_t* meta, size_t size, const ReaderLimits& limits) {
  return withRoot<schema::RecordingInfo>(meta, size, limits, "recording_info", [](auto r) {
    RecordingInfoData d;
    d.producer = text(r.getProducer(), 4096, "producer");
    d.toolVersion = text(r.getToolVersion(), 256, "tool version");
    d.hostname = text(r.getHostname(), 4096, "hostname");
    d.pid = r.getPid();
    d.createdNs = r.getCreatedNs();
    return d;
  });
}

ChunkMeta decodeChunk(const uint8_t* meta, size_t size, uint64_t rawLength, const ReaderLimits& limits) {
  ChunkMeta c = withRoot<schema::TensorChunk>(meta, size, limits, "tensor_chunk", [](auto r) {
    ChunkMeta c;
    c.tensorId = r.getTensorId();
    c.name = text(r.getName(), kMaxNameBytes, "tensor name");
    c.dtype = dtypeOf(r.getDtype());
    c.shape = shapeOf(r.getShape());
    c.totalBytes = r.getTotalBytes();
    c.chunkIndex = r.getChunkIndex();
    c.chunkCount = r.getChunkCount();
    c.offset = r.getOffset();
    c.length = r.getLength();
    c.shuffle = r.getShuffle();
    return c;
  });
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::Corrupt, fmt::format("tensor_chunk '{}' chunk {}: {}", c.name, c.chunkIndex, what));
  };
  if (c.tensorId == 0) throw bad("tensorId is 0");
  try {
    validateTensorName(c.name);
  } catch (const Error& e) {
    throw bad(e.message());
  }
  uint64_t expect = 0;
  try {
    expect = tensorByteSize(c.dtype, c.shape, "'" + c.name + "'");
  } catch (const Error& e) {
    throw bad(e.message());
  }
  if (expect != c.totalBytes)
    throw bad(fmt::format("totalBytes {} but shape {} of {} needs {}", c.totalBytes, formatShape(c.shape),
                          dtypeName(c.dtype), expect));
  const uint64_t maxChunks = c.totalBytes == 0 ? 1 : c.totalBytes / elementSize(c.dtype);
  if (c.chunkCount > maxChunks)
    throw bad(fmt::format("chunk count {} exceeds the {} element(s) of the tensor", c.chunkCount, maxChunks));
  if (c.chunkCount == 0 || c.chunkIndex >= c.chunkCount)
    throw bad(fmt::format("chunk index {} outside chunk count {}", c.chunkIndex, c.chunkCount));
  if (c.length != rawLength)
    throw bad(fmt::format("length {} differs from the record's decoded body length {}", c.length, rawLength));
  if (c.offset > c.totalBytes || c.length > c.totalBytes - c.offset)
    throw bad(fmt::format("bytes [{}, {}) lie outside the tensor's {} bytes", c.offset, c.offset + c.length,
                          c.totalBytes));
  size_t es = elementSize(c.dtype);
  if (c.length % es != 0 || c.offset % es != 0)
    throw bad(fmt::format("offset {} / length {} not a multiple of the element size {}", c.offset, c.length, es));
  if (c.shuffle != 0 && c.shuffle != es)
    throw bad(fmt::format("shuffle {} does not match the element size {}", c.shuffle, es));
  if (c.length == 0 && c.totalBytes != 0) throw bad("empty chunk in a non-empty tensor");
  if (c.length > limits.maxChunkBytes)
    throw Error(ErrorCode::LimitExceeded,
                fmt::format("tensor_chunk '{}' chunk {} is {} bytes; the limit is {}", c.name, c.chunkIndex, c.length,
                            limits.maxChunkBytes));
  return c;
}

NoteData decodeNote(const uint8_t* meta, size_t size, const ReaderLimits& limits) {
  return withRoot<schema::Note>(meta, size, limits, "note", [](auto r) {
    NoteData n;
    n.key = text(r.getKey(), 256, "note key");
    n.text = text(r.getText(), kMaxNoteTextBytes, "note text");
    return n;
  });
}

EnvironmentData decodeEnvironment(const uint8_t* meta, size_t size, const ReaderLimits& limits) {
  return withRoot<schema::Environment>(meta, size, limits, "environment", [](auto r) {
    EnvironmentData env;
    auto pairs = [](auto list, std::vector<std::pair<std::string, std::string>>& out) {
      for (auto e : list) out.emplace_back(text(e.getKey(), 4096, "environment key"), text(e.getValue(), 65536, "environment value"));
    };
    pairs(r.getFacts(), env.facts);
    pairs(r.getVariables(), env.variables);
    for (auto t : r.getCommandLine()) env.commandLine.push_back(text(t, 65536, "command line argument"));
    for (auto t : r.getRedacted()) env.redacted.push_back(text(t, 4096, "redacted name"));
    return env;
  });
}

std::pair<uint64_t, uint64_t> decodeIndexInfo(const uint8_t* meta, size_t size, const ReaderLimits& limits) {
  return withRoot<schema::IndexInfo>(meta, size, limits, "index_info", [](auto r) {
    return std::make_pair(r.getRecordCount(), r.getTensorCount());
  });
}

IndexData decodeIndex(const uint8_t* body, size_t size, uint64_t firstRecord, uint64_t indexOffset,
                      const ReaderLimits& limits) {
  return withRoot<schema::Index>(body, size, limits, "index", [&](auto r) {
    IndexData d;
    auto records = r.getRecords();
    if (records.size() > limits.maxRecords)
      throw Error(ErrorCode::LimitExceeded,
                  fmt::format("index lists {} records; the limit is {}", records.size(), limits.maxRecords));
    uint64_t next = firstRecord;
    for (auto rec : records) {
      RecordEntry e{rec.getOffset(), rec.getType(), rec.getSequence(), rec.getLength()};
      if (e.offset != next || e.length < kRecordHeaderSize || e.length > indexOffset - e.offset)
        throw Error(ErrorCode::Corrupt,
                    fmt::format("index entry {} places a record at byte {} of length {}; expected one at byte {} "
                                "ending before the index at byte {}",
                                d.records.size(), e.offset, e.length, next, indexOffset));
      next = e.offset + e.length;
      d.records.push_back(e);
    }
    if (next != indexOffset)
      throw Error(ErrorCode::Corrupt,
                  fmt::format("index records end at byte {} but the index starts at byte {}", next, indexOffset));
    auto tensors = r.getTensors();
    if (tensors.size() > records.size())
      throw Error(ErrorCode::Corrupt, fmt::format("index lists {} tensors but only {} records", tensors.size(),
                                                  records.size()));
    for (auto t : tensors) {
      TensorInfo info;
      info.id = t.getTensorId();
      info.name = text(t.getName(), kMaxNameBytes, "tensor name");
      info.dtype = dtypeOf(t.getDtype());
      info.shape = shapeOf(t.getShape());
      info.totalBytes = t.getTotalBytes();
      info.storedBytes = t.getStoredBytes();
      uint64_t expect = 0;
      try {
        expect = tensorByteSize(info.dtype, info.shape, "'" + info.name + "'");
      } catch (const Error& e) {
        throw Error(ErrorCode::Corrupt, "index entry: " + e.message());
      }
      if (expect != info.totalBytes)
        throw Error(ErrorCode::Corrupt, fmt::format("index entry for tensor '{}' has totalBytes {}, shape needs {}",
                                                    info.name, info.totalBytes, expect));
      auto chunks = t.getChunkRecords();
      if (chunks.size() == 0 || chunks.size() > records.size())
        throw Error(ErrorCode::Corrupt,
                    fmt::format("index entry for tensor '{}' lists {} chunks", info.name, chunks.size()));
      info.chunkRecords.reserve(chunks.size());
      for (auto off : chunks) info.chunkRecords.push_back(off);
      d.tensors.push_back(std::move(info));
    }
    return d;
  });
}

bool sameTensor(const ChunkMeta& a, const ChunkMeta& b) {
  return a.tensorId == b.tensorId && a.name == b.name && a.dtype == b.dtype && a.shape == b.shape &&
         a.totalBytes == b.totalBytes && a.chunkCount == b.chunkCount;
}

}  // namespace crashcap::formats::detail
