#include "scanner.hpp"

#include <fmt/format.h>

#include <cstring>

#include "crashcap/formats/error.hpp"

namespace crashcap::formats::detail {

uint64_t bodyLimitFor(uint16_t type, const ReaderLimits& limits) {
  return type == static_cast<uint16_t>(RecordType::Index) ? limits.maxIndexBytes : limits.maxChunkBytes;
}

bool recordFollowsFileHeader(const File& file) {
  uint8_t head[kRecordHeaderSize];
  if (file.preadSome(head, kRecordHeaderSize, kFileHeaderSize) != kRecordHeaderSize) return false;
  return decodeRecordHeader(head).header.has_value();
}

namespace {

/// Finds the next offset in (from, end - header size] where a record header decodes cleanly,
/// or nullopt. `buf` is scratch space, reused from call to call.
std::optional<uint64_t> resync(const File& file, uint64_t from, uint64_t end, std::vector<uint8_t>& buf) {
  constexpr uint64_t kBlock = 1 << 20;
  if (from >= end) return std::nullopt;
  // No bigger than what is left to search: a damaged range near the end of a small file
  // costs no 1 MiB buffer.
  buf.resize(std::min<uint64_t>(kBlock, end - from) + kRecordHeaderSize);
  uint8_t sync[4];
  putU32(sync, kRecordSync);
  for (uint64_t base = from; base + kRecordHeaderSize <= end; base += kBlock) {
    uint64_t want = std::min<uint64_t>(buf.size(), end - base);
    uint64_t got = file.preadSome(buf.data(), want, base);
    for (uint64_t i = 0; i + kRecordHeaderSize <= got; ++i) {
      const uint8_t* p = static_cast<const uint8_t*>(memchr(buf.data() + i, sync[0], got - kRecordHeaderSize + 1 - i));
      if (!p) break;
      i = uint64_t(p - buf.data());
      if (std::memcmp(p, sync, 4) == 0 && decodeRecordHeader(p).header) return base + i;
    }
  }
  return std::nullopt;
}

}  // namespace

ScanResult scanRecords(const File& file, const ReaderLimits& limits, const ScanOptions& options,
                       const std::function<void(ScannedRecord&)>& onRecord,
                       const std::function<void(const ScanDamage&)>& onDamage) {
  ScanResult result;
  uint64_t pos = options.begin;
  const uint64_t end = options.end;
  result.usableEnd = pos;
  uint64_t accepted = 0;
  uint64_t nextReport = pos + (64ull << 20);
  // Reused from record to record, so a scan allocates only when a record is bigger than all
  // before it: the record handed to onRecord, and the bodies that are checked but not kept.
  ScannedRecord rec;
  std::vector<uint8_t> scratch, resyncBuffer;
  while (pos < end) {
    if (options.progress && pos >= nextReport) {
      options.progress(pos, end);
      nextReport = pos + (64ull << 20);
    }
    if (end - pos < kRecordHeaderSize) {
      result.truncatedAt = pos;
      break;
    }
    uint8_t head[kRecordHeaderSize];
    file.preadExact(head, kRecordHeaderSize, pos);
    auto check = decodeRecordHeader(head);
    if (!check.header) {
      auto next = resync(file, pos + 1, end, resyncBuffer);
      uint64_t stop = next ? *next : end;
      onDamage({pos, stop - pos, check.problem, std::nullopt});
      pos = stop;
      continue;
    }
    const RecordHeader& h = *check.header;
    uint64_t bodyLimit = bodyLimitFor(h.type, limits);
    if (h.metaLength > limits.maxMetaBytes || h.bodyLength > bodyLimit || h.rawLength > bodyLimit) {
      // The header checksum holds, so the lengths are what the writer wrote.
      std::string what = fmt::format(
          "{} record #{} exceeds the reader's limits (meta {} bytes, limit {}; body {} bytes stored / {} decoded, "
          "limit {})",
          recordTypeName(h.type), h.sequence, h.metaLength, limits.maxMetaBytes, h.bodyLength, h.rawLength, bodyLimit);
      if (h.totalLength() > end - pos) {
        onDamage({pos, end - pos, what, h});
        pos = end;
      } else {
        onDamage({pos, h.totalLength(), what, h});
        pos += h.totalLength();
      }
      continue;
    }
    if (h.totalLength() > end - pos) {
      result.truncatedAt = pos;
      result.truncatedHeader = h;
      if (end - pos - kRecordHeaderSize >= h.metaLength) {
        std::vector<uint8_t> meta(h.metaLength);
        file.preadExact(meta.data(), meta.size(), pos + kRecordHeaderSize);
        if (hash64(meta.data(), meta.size()) == h.metaHash) result.truncatedMeta = std::move(meta);
      }
      break;
    }
    rec.offset = pos;
    rec.header = h;
    rec.meta.resize(h.metaLength);
    file.preadExact(rec.meta.data(), h.metaLength, pos + kRecordHeaderSize);
    std::string problem;
    if (hash64(rec.meta.data(), rec.meta.size()) != h.metaHash) {
      problem = fmt::format("meta checksum mismatch in {} record #{} (meta bytes {}..{})", recordTypeName(h.type),
                            h.sequence, pos + kRecordHeaderSize, pos + kRecordHeaderSize + h.metaLength);
    } else {
      std::vector<uint8_t>& body = options.keepBodies ? rec.body : scratch;
      body.resize(h.bodyLength);
      file.preadExact(body.data(), h.bodyLength, pos + kRecordHeaderSize + h.metaLength);
      uint64_t computed = hash64(body.data(), body.size());
      if (computed != h.bodyHash)
        problem = fmt::format("body checksum mismatch in {} record #{} (body bytes {}..{}): stored {:#018x}, "
                              "computed {:#018x}",
                              recordTypeName(h.type), h.sequence, pos + kRecordHeaderSize + h.metaLength,
                              pos + h.totalLength(), h.bodyHash, computed);
    }
    if (!problem.empty()) {
      onDamage({pos, h.totalLength(), problem, h});
      pos += h.totalLength();
      continue;
    }
    if (++accepted > limits.maxRecords)
      throw Error(ErrorCode::LimitExceeded,
                  fmt::format("{} holds more than {} records", file.path(), limits.maxRecords),
                  "raise ReaderLimits::maxRecords");
    pos += h.totalLength();
    result.usableEnd = pos;
    onRecord(rec);
  }
  return result;
}

}  // namespace crashcap::formats::detail
