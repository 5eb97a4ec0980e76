#pragma once
// The fixed-size binary parts of a bundle: file header, record header, footer.
// All integers are little-endian. docs/FORMAT.md draws the same layout with its rationale.
//
//   file    := FileHeader Record* [IndexRecord Footer]
//   Record  := RecordHeader meta[metaLength] body[bodyLength]
//
// Every byte of a sealed bundle is covered by exactly one checksum (XXH3-64): the file
// header's, a record header's, a record's meta or body checksum, or the footer's (whose
// trailing magic is compared byte for byte).

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace crashcap::formats {

/// "\x89CCAP\r\n\x1a\n" (9 bytes): the high byte catches 7-bit transfers, CR LF / LF catch
/// newline translation, ^Z stops DOS `type` (the PNG trick). Starts the file and ends the footer.
inline constexpr std::array<uint8_t, 9> kMagic = {0x89, 'C', 'C', 'A', 'P', '\r', '\n', 0x1a, '\n'};

/// Format version. A reader opens any minor of its major; a new major is refused with
/// ErrorCode::IncompatibleVersion. Additive changes (new record types, new schema fields)
/// bump the minor only.
inline constexpr uint16_t kFormatMajor = 1;
inline constexpr uint16_t kFormatMinor = 0;

inline constexpr uint32_t kFileHeaderSize = 64;
inline constexpr uint32_t kRecordHeaderSize = 64;
inline constexpr uint32_t kFooterSize = 48;
/// First four bytes of every record header (bytes 51 43 43 D2: "QCC" and a high byte that
/// is unlikely in float data).
inline constexpr uint32_t kRecordSync = 0xD2434351u;
/// Structural bound on a record's body (stored or decoded) length, far above any reader
/// limit; a header claiming more is not a header. Keeps header+meta+body sums from wrapping.
inline constexpr uint64_t kMaxRecordBodyBytes = 1ull << 48;

/// Record types, one enumerator per row of the record table (record_types.def). Numbers are
/// stable; a reader skips types it does not know with a notice, unless the record carries
/// kFlagRequired.
enum class RecordType : uint16_t {
#define CRASHCAP_READER_RECORD(number, Enum, name) Enum = number,
#define CRASHCAP_RECORDER_RECORD(number, Enum, name, Data, decoder, keep, member) Enum = number,
#include "crashcap/formats/record_types.def"
};

/// One row of the record table, as data.
struct RecordTypeInfo {
  uint16_t number = 0;
  const char* name = "";  ///< "tensor_chunk"
  bool recorder = false;  ///< decoded by records.hpp into BundleRecords; verify and scans check its meta
};

/// Every record type this crashcap knows, in table order (record_types.def).
inline constexpr RecordTypeInfo kRecordTypes[] = {
#define CRASHCAP_READER_RECORD(number, Enum, name) {number, name, false},
#define CRASHCAP_RECORDER_RECORD(number, Enum, name, Data, decoder, keep, member) {number, name, true},
#include "crashcap/formats/record_types.def"
};

/// The table row of `type`, or nullptr for a type this crashcap does not know.
const RecordTypeInfo* findRecordType(uint16_t type);

/// Short name of a record type ("tensor_chunk"), or "unknown(N)".
std::string recordTypeName(uint16_t type);

/// Body codec, in the low 4 bits of RecordHeader::flags.
enum class Codec : uint8_t { None = 0, Zstd = 1 };
inline constexpr uint16_t kCodecMask = 0x000F;
/// A reader that does not know this record's type must refuse the bundle instead of skipping.
inline constexpr uint16_t kFlagRequired = 0x8000;

/// File header, 64 bytes at offset 0.
struct FileHeader {
  uint16_t formatMajor = kFormatMajor;
  uint16_t formatMinor = kFormatMinor;
  std::array<uint8_t, 16> recordingId{};  ///< random UUID (v4) of the recording
  int64_t createdNs = 0;                  ///< wall clock at creation, ns since Unix epoch
  uint64_t flags = 0;                     ///< reserved, 0
};
// Byte layout:  0 magic[9] | 9 u8 zero | 10 u16 major | 12 u16 minor | 14 u16 headerSize (=64)
//               16 recordingId[16] | 32 i64 createdNs | 40 u64 flags | 48 u64 reserved (0)
//               56 u64 XXH3-64 of bytes 0..56

/// Record header, 64 bytes before each record's meta and body.
struct RecordHeader {
  uint16_t type = 0;
  uint16_t flags = 0;        ///< codec in bits 0-3, kFlagRequired; other bits 0
  uint64_t sequence = 0;     ///< 0,1,2,... in write order; gaps mean lost records
  uint32_t metaLength = 0;   ///< bytes of the Cap'n Proto meta message (multiple of 8)
  uint64_t bodyLength = 0;   ///< bytes of the body as stored
  uint64_t rawLength = 0;    ///< bytes of the body once decoded; == bodyLength for Codec::None
  uint64_t metaHash = 0;     ///< XXH3-64 of the meta bytes
  uint64_t bodyHash = 0;     ///< XXH3-64 of the stored body bytes

  Codec codec() const { return static_cast<Codec>(flags & kCodecMask); }
  uint64_t totalLength() const { return kRecordHeaderSize + uint64_t(metaLength) + bodyLength; }
};
// Byte layout:  0 u32 sync | 4 u16 type | 6 u16 flags | 8 u64 sequence
//               16 u32 metaLength | 20 u32 reserved (0) | 24 u64 bodyLength
//               32 u64 rawLength | 40 u64 metaHash | 48 u64 bodyHash
//               56 u64 XXH3-64 of bytes 0..56

/// Footer, the last 48 bytes of a sealed bundle.
struct Footer {
  uint64_t indexOffset = 0;   ///< file offset of the index record's header
  uint64_t recordCount = 0;   ///< records before the index
  uint64_t footerReserved = 0;
};
// Byte layout:  0 u64 indexOffset | 8 u64 recordCount | 16 u64 reserved (0)
//               24 u64 XXH3-64 of bytes 0..24 | 32 u8[7] zero | 39 magic[9]

/// XXH3-64 as used for every checksum in the format.
uint64_t hash64(const void* data, size_t size);

void encodeFileHeader(const FileHeader& h, uint8_t out[kFileHeaderSize]);
/// Decodes and checks magic, header size and checksum; the error says which failed.
/// Does not check the version (callers decide how to report it).
FileHeader decodeFileHeader(const uint8_t in[kFileHeaderSize]);

void encodeRecordHeader(const RecordHeader& h, uint8_t out[kRecordHeaderSize]);
/// Decoding result of a record header: the header, or why it is not one.
struct RecordHeaderCheck {
  std::optional<RecordHeader> header;
  std::string problem;  ///< empty when header is set
};
RecordHeaderCheck decodeRecordHeader(const uint8_t in[kRecordHeaderSize]);

void encodeFooter(const Footer& f, uint8_t out[kFooterSize]);
struct FooterCheck {
  std::optional<Footer> footer;
  std::string problem;
};
FooterCheck decodeFooter(const uint8_t in[kFooterSize]);

/// Little-endian helpers.
inline void putU16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v); p[1] = uint8_t(v >> 8); }
inline void putU32(uint8_t* p, uint32_t v) { for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i)); }
inline void putU64(uint8_t* p, uint64_t v) { for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i)); }
inline uint16_t getU16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
inline uint32_t getU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t getU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace crashcap::formats
