#pragma once
// BundleReader: opens a bundle, sealed or not, and reads tensors by name.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "crashcap/formats/layout.hpp"
#include "crashcap/formats/limits.hpp"
#include "crashcap/formats/tensor_info.hpp"

namespace crashcap::formats {

/// One record as found in the file.
struct RecordEntry {
  uint64_t offset = 0;   ///< file offset of its header
  uint16_t type = 0;
  uint64_t sequence = 0;
  uint64_t length = 0;   ///< header + meta + body
};

/// A stretch of the file the reader could not use, and why.
struct Damage {
  uint64_t offset = 0;   ///< first byte of the damaged range
  uint64_t length = 0;   ///< bytes skipped
  std::string what;      ///< "record header checksum mismatch", "body checksum mismatch in record #12 (tensor_chunk)"
};

/// A tensor some of whose chunks were lost.
struct LostTensor {
  std::string name;
  uint32_t chunksFound = 0;
  uint32_t chunkCount = 0;
};

/// How the bundle was opened and what, if anything, was lost.
struct OpenReport {
  bool sealed = false;           ///< footer and index were valid and used
  bool footerPresent = false;    ///< a valid footer ends the file (used or not)
  bool scanned = false;          ///< records were found by the forward scan
  std::string whyScanned;        ///< "no footer (not sealed: crash during recording?)", ...
  uint64_t fileSize = 0;
  uint64_t usableBytes = 0;      ///< bytes up to the end of the last valid record
  /// Where the incomplete trailing record starts (the file ends inside it); fileSize when the
  /// file ends inside the file header.
  std::optional<uint64_t> truncatedAt;
  bool fileHeaderDamaged = false;
  uint64_t recordsRecovered = 0;
  std::vector<Damage> damage;    ///< damaged ranges the scan skipped
  std::vector<uint64_t> missingSequences;  ///< gaps in the record sequence numbers (capped)
  uint64_t missingSequenceCount = 0;
  std::vector<LostTensor> lostTensors;
  std::map<uint16_t, uint64_t> unknownTypes;  ///< record type -> count, skipped with a notice
  std::vector<std::string> notices;           ///< human-readable, one line each

  /// True when nothing was lost: the file ends with a valid footer and nothing was damaged,
  /// truncated or missing.
  bool complete() const;
  /// One line: "sealed, 212 records" or "truncated at byte 1048576 (crash during recording?): ...".
  std::string summary() const;
};

struct RecordingInfoData {
  std::string producer, toolVersion, hostname;
  uint32_t pid = 0;
  int64_t createdNs = 0;
};

struct NoteData {
  std::string key, text;
};

/// The environment fingerprint record (see bundle.capnp `Environment`).
struct EnvironmentData {
  std::vector<std::pair<std::string, std::string>> facts;      ///< "cpu.model", "os.wsl2", ...
  std::vector<std::pair<std::string, std::string>> variables;  ///< sorted by name
  std::vector<std::string> commandLine;                        ///< secrets replaced
  std::vector<std::string> redacted;                           ///< names whose values were withheld

  /// The value of a fact, or "" when absent.
  std::string fact(const std::string& key) const;
};

/// A read-only view of one bundle. Opening reads the footer and index (sealed bundles) or
/// scans every record (unsealed or damaged ones); reading a tensor then touches only its
/// own chunks, each checked against its checksums. Safe on untrusted files: every length is
/// bounded by ReaderLimits before anything is allocated. Thread-compatible (const methods
/// may be called from several threads; each read uses pread, or copies from memory for a
/// bundle opened with openBytes).
class BundleReader {
 public:
  /// Opens `path`. Throws Error{NotABundle, IncompatibleVersion, Io, LimitExceeded, ...}.
  /// `progress` is called while a forward scan runs (never on the indexed path).
  static std::unique_ptr<BundleReader> open(const std::string& path, const ReaderLimits& limits = {},
                                            const Progress& progress = {});
  /// Like open, but ignores footer and index and always scans (for recover and tests).
  static std::unique_ptr<BundleReader> scan(const std::string& path, const ReaderLimits& limits = {},
                                            const Progress& progress = {});
  /// Opens a bundle held in memory, exactly as open() opens a file; `name` stands for the
  /// path in messages and path(). The reader keeps `bytes`. For bundles that never touch a
  /// disk: received over a network, built by a test, a fuzzer's input.
  static std::unique_ptr<BundleReader> openBytes(std::vector<uint8_t> bytes, const std::string& name,
                                                 const ReaderLimits& limits = {});
  /// Like openBytes, but ignores footer and index and always scans, as scan() does.
  static std::unique_ptr<BundleReader> scanBytes(std::vector<uint8_t> bytes, const std::string& name,
                                                 const ReaderLimits& limits = {});
  ~BundleReader();

  const std::string& path() const;
  const FileHeader& fileHeader() const;
  const OpenReport& report() const;
  const ReaderLimits& limits() const;
  /// The RecordingInfo record. For sealed bundles this and notes() read their records on
  /// first use; they throw Error{Corrupt} when those records are damaged.
  std::optional<RecordingInfoData> recordingInfo() const;
  const std::vector<NoteData>& notes() const;
  /// The environment fingerprint, when the bundle has one (the last one written wins).
  std::optional<EnvironmentData> environment() const;
  /// Every usable record, in file order (index record excluded).
  const std::vector<RecordEntry>& records() const;
  /// Every complete tensor, in first-write order.
  const std::vector<TensorInfo>& tensors() const;
  /// The tensor named `name`, or nullptr.
  const TensorInfo* find(const std::string& name) const;
  /// The tensor named `name`; throws NotFound listing close names.
  const TensorInfo& get(const std::string& name) const;

  /// Reads a tensor's contiguous bytes into `out` (exactly t.totalBytes), checking every
  /// chunk's checksums and invariants. Throws LimitExceeded when t.totalBytes exceeds
  /// limits().maxTensorBytes.
  void readTensor(const TensorInfo& t, void* out, uint64_t outSize) const;
  std::vector<uint8_t> readTensor(const TensorInfo& t) const;

  /// Reads one record's raw parts (header checked, meta and body checksums checked, body
  /// decoded). For tools and later record types.
  struct RawRecord {
    RecordHeader header;
    std::vector<uint8_t> meta;
    std::vector<uint8_t> body;  ///< decoded
  };
  RawRecord readRecord(uint64_t offset) const;
  /// Like readRecord, but the body as stored (a zstd body stays compressed): for copying a
  /// record verbatim.
  RawRecord readStoredRecord(uint64_t offset) const;

 private:
  struct Impl;
  explicit BundleReader(std::unique_ptr<Impl> impl);
  /// Opens the bundle in impl->file (set by the caller).
  static std::unique_ptr<Impl> load(std::unique_ptr<Impl> impl, const ReaderLimits& limits, bool useIndex,
                                    const Progress& progress);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crashcap::formats
