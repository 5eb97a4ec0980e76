#include "crashcap/formats/layout.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <cstring>
#include <iterator>

#include "crashcap/formats/error.hpp"

namespace crashcap::formats {

uint64_t hash64(const void* data, size_t size) { return XXH3_64bits(data, size); }

namespace {

constexpr bool sameName(const char* a, const char* b) {
  while (*a && *a == *b) ++a, ++b;
  return *a == *b;
}

/// Each row of record_types.def has its own number (never 0) and its own name.
constexpr bool recordTableRowsDistinct() {
  constexpr size_t n = std::size(kRecordTypes);
  for (size_t i = 0; i < n; ++i) {
    if (kRecordTypes[i].number == 0) return false;
    for (size_t j = i + 1; j < n; ++j)
      if (kRecordTypes[i].number == kRecordTypes[j].number || sameName(kRecordTypes[i].name, kRecordTypes[j].name))
        return false;
  }
  return true;
}
static_assert(recordTableRowsDistinct(), "two rows of record_types.def share a type number or a name (or a number is 0)");

}  // namespace

const RecordTypeInfo* findRecordType(uint16_t type) {
  for (const auto& info : kRecordTypes)
    if (info.number == type) return &info;
  return nullptr;
}

std::string recordTypeName(uint16_t type) {
  if (const auto* info = findRecordType(type)) return info->name;
  return fmt::format("unknown({})", type);
}

namespace {
/// "89 43 43 41": readers build this for every file without a footer, so no fmt per byte.
std::string hexBytes(const uint8_t* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(3 * n);
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += kDigits[p[i] >> 4];
    s += kDigits[p[i] & 15];
  }
  return s;
}
}  // namespace

void encodeFileHeader(const FileHeader& h, uint8_t out[kFileHeaderSize]) {
  std::memset(out, 0, kFileHeaderSize);
  std::memcpy(out, kMagic.data(), kMagic.size());
  putU16(out + 10, h.formatMajor);
  putU16(out + 12, h.formatMinor);
  putU16(out + 14, kFileHeaderSize);
  std::memcpy(out + 16, h.recordingId.data(), 16);
  putU64(out + 32, static_cast<uint64_t>(h.createdNs));
  putU64(out + 40, h.flags);
  putU64(out + 56, hash64(out, 56));
}

FileHeader decodeFileHeader(const uint8_t in[kFileHeaderSize]) {
  if (std::memcmp(in, kMagic.data(), kMagic.size()) != 0)
    throw Error(ErrorCode::NotABundle,
                fmt::format("not a crashcap bundle: expected magic bytes {} at byte 0, found {}",
                            hexBytes(kMagic.data(), kMagic.size()), hexBytes(in, kMagic.size())));
  uint64_t stored = getU64(in + 56), computed = hash64(in, 56);
  if (stored != computed)
    throw Error(ErrorCode::Corrupt,
                fmt::format("file header checksum mismatch at byte 0: stored {:#018x}, computed {:#018x}", stored,
                            computed));
  if (in[9] != 0 || getU16(in + 14) != kFileHeaderSize)
    throw Error(ErrorCode::Corrupt, fmt::format("file header at byte 0 has byte 9 = {} and header size {}; expected 0 "
                                                "and {}",
                                                in[9], getU16(in + 14), kFileHeaderSize));
  FileHeader h;
  h.formatMajor = getU16(in + 10);
  h.formatMinor = getU16(in + 12);
  std::memcpy(h.recordingId.data(), in + 16, 16);
  h.createdNs = static_cast<int64_t>(getU64(in + 32));
  h.flags = getU64(in + 40);
  return h;
}

void encodeRecordHeader(const RecordHeader& h, uint8_t out[kRecordHeaderSize]) {
  std::memset(out, 0, kRecordHeaderSize);
  putU32(out + 0, kRecordSync);
  putU16(out + 4, h.type);
  putU16(out + 6, h.flags);
  putU64(out + 8, h.sequence);
  putU32(out + 16, h.metaLength);
  putU64(out + 24, h.bodyLength);
  putU64(out + 32, h.rawLength);
  putU64(out + 40, h.metaHash);
  putU64(out + 48, h.bodyHash);
  putU64(out + 56, hash64(out, 56));
}

RecordHeaderCheck decodeRecordHeader(const uint8_t in[kRecordHeaderSize]) {
  RecordHeaderCheck r;
  uint32_t sync = getU32(in);
  if (sync != kRecordSync) {
    r.problem = fmt::format("bad sync word: expected {:#010x}, found {:#010x}", kRecordSync, sync);
    return r;
  }
  uint64_t stored = getU64(in + 56), computed = hash64(in, 56);
  if (stored != computed) {
    r.problem = fmt::format("record header checksum mismatch: stored {:#018x}, computed {:#018x}", stored, computed);
    return r;
  }
  RecordHeader h;
  h.type = getU16(in + 4);
  h.flags = getU16(in + 6);
  h.sequence = getU64(in + 8);
  h.metaLength = getU32(in + 16);
  h.bodyLength = getU64(in + 24);
  h.rawLength = getU64(in + 32);
  h.metaHash = getU64(in + 40);
  h.bodyHash = getU64(in + 48);
  if (getU32(in + 20) != 0) {
    r.problem = fmt::format("record header reserved field (bytes 20..24) is {:#x}, expected 0", getU32(in + 20));
    return r;
  }
  if (h.bodyLength > kMaxRecordBodyBytes || h.rawLength > kMaxRecordBodyBytes) {
    r.problem = fmt::format("record body length {} (decoded {}) exceeds the format's maximum of {}", h.bodyLength,
                            h.rawLength, kMaxRecordBodyBytes);
    return r;
  }
  if (h.metaLength % 8 != 0) {
    r.problem = fmt::format("record meta length {} is not a multiple of 8", h.metaLength);
    return r;
  }
  auto codec = h.flags & kCodecMask;
  if (codec > static_cast<uint16_t>(Codec::Zstd)) {
    r.problem = fmt::format("unknown body codec {}", codec);
    return r;
  }
  if (codec == static_cast<uint16_t>(Codec::None) && h.rawLength != h.bodyLength) {
    r.problem = fmt::format("raw body of {} bytes claims a decoded length of {}", h.bodyLength, h.rawLength);
    return r;
  }
  r.header = h;
  return r;
}

void encodeFooter(const Footer& f, uint8_t out[kFooterSize]) {
  std::memset(out, 0, kFooterSize);
  putU64(out + 0, f.indexOffset);
  putU64(out + 8, f.recordCount);
  putU64(out + 16, f.footerReserved);
  putU64(out + 24, hash64(out, 24));
  std::memcpy(out + kFooterSize - kMagic.size(), kMagic.data(), kMagic.size());
}

FooterCheck decodeFooter(const uint8_t in[kFooterSize]) {
  FooterCheck r;
  const uint8_t* tail = in + 32;
  uint8_t expectedTail[16] = {};
  std::memcpy(expectedTail + 7, kMagic.data(), kMagic.size());
  if (std::memcmp(tail, expectedTail, 16) != 0) {
    r.problem = fmt::format("no footer: the last 16 bytes are {}, expected {}", hexBytes(tail, 16),
                            hexBytes(expectedTail, 16));
    return r;
  }
  uint64_t stored = getU64(in + 24), computed = hash64(in, 24);
  if (stored != computed) {
    r.problem = fmt::format("footer checksum mismatch: stored {:#018x}, computed {:#018x}", stored, computed);
    return r;
  }
  Footer f;
  f.indexOffset = getU64(in);
  f.recordCount = getU64(in + 8);
  f.footerReserved = getU64(in + 16);
  r.footer = f;
  return r;
}

}  // namespace crashcap::formats
