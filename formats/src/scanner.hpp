#pragma once
// The forward scan shared by the reader (unsealed or damaged bundles), verify and recover:
// walks records from the file header on, accepting only records whose sync word, header
// checksum, lengths, meta and body checksums all hold, and resynchronising on the next
// valid record header after damage.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "crashcap/formats/layout.hpp"
#include "crashcap/formats/limits.hpp"
#include "file_io.hpp"

namespace crashcap::formats::detail {

/// One record the scan accepted (checksums good). meta is always read; body only when
/// ScanOptions::keepBodies.
struct ScannedRecord {
  uint64_t offset = 0;
  RecordHeader header;
  std::vector<uint8_t> meta;
  std::vector<uint8_t> body;  ///< stored (not decoded) body, when kept
};

/// A byte range the scan could not use.
struct ScanDamage {
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string what;
  std::optional<RecordHeader> header;  ///< when the header itself was intact
};

struct ScanOptions {
  uint64_t begin = kFileHeaderSize;
  uint64_t end = 0;          ///< stop here (exclusive); a valid footer's offset or the file size
  bool keepBodies = false;
  Progress progress;         ///< called about every 64 MiB scanned
};

struct ScanResult {
  std::optional<uint64_t> truncatedAt;     ///< an incomplete record starts here
  std::optional<RecordHeader> truncatedHeader;  ///< its header, when complete
  std::vector<uint8_t> truncatedMeta;      ///< its meta, when complete
  uint64_t usableEnd = 0;                  ///< end of the last accepted record
};

/// Scans [options.begin, options.end) of `file`, calling onRecord for each accepted record and
/// onDamage for each damaged range, in file order. The record onRecord gets is reused for the
/// next one: take what you keep (moving its meta or body out is fine).
ScanResult scanRecords(const File& file, const ReaderLimits& limits, const ScanOptions& options,
                       const std::function<void(ScannedRecord&)>& onRecord,
                       const std::function<void(const ScanDamage&)>& onDamage);

/// True when an intact record header sits right after the file header: the file is a
/// bundle whose magic was damaged, not some other file.
bool recordFollowsFileHeader(const File& file);

/// Maximum stored/decoded body a record of this type may have under `limits`.
uint64_t bodyLimitFor(uint16_t type, const ReaderLimits& limits);

}  // namespace crashcap::formats::detail
