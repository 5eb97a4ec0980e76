#pragma once
// BundleWriter: appends records to a bundle file and seals it with an index and footer.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/dtype.hpp"
#include "crashcap/formats/layout.hpp"
#include "crashcap/formats/tensor_info.hpp"

namespace crashcap::formats {

/// When the writer asks the OS to put data on stable storage (fdatasync).
struct Durability {
  /// fdatasync after this many bytes were written since the last sync; 0 = never in between.
  uint64_t syncEveryBytes = 0;
  /// fdatasync when sealing (and fsync the directory so the file name is durable too).
  bool syncOnSeal = true;
};

/// What a writer encodes with: its zstd context and the buffers a body is shuffled and compressed
/// into, grown to the largest body and kept. A writer makes its own unless given one; a producer
/// that writes file after file (the recorder's segments) keeps one for all of them, so that each
/// file does not allocate and first-touch them again. Writers that share one take turns: no two
/// write at the same time.
class EncodeMemory {
 public:
  /// forkPrivate: its large blocks are left out of the children the process forks
  /// (MADV_DONTFORK), so that writing after a fork copies none of them. A forked child must never
  /// write with it (the recorder does nothing in a forked child).
  static std::shared_ptr<EncodeMemory> create(bool forkPrivate);
  ~EncodeMemory();
  EncodeMemory(const EncodeMemory&) = delete;
  EncodeMemory& operator=(const EncodeMemory&) = delete;

  struct Parts;
  Parts& parts() { return *parts_; }

 private:
  explicit EncodeMemory(bool forkPrivate);
  std::unique_ptr<Parts> parts_;
};

struct WriterOptions {
  int zstdLevel = 1;                      ///< 1..19; 0 stores every body raw
  uint64_t chunkBytes = 4ull << 20;       ///< tensor chunk size; 4 KiB..64 MiB
  unsigned compressionThreads = 0;        ///< 0: compress on the calling thread
  bool shuffle = true;                    ///< byte-shuffle floating types before zstd
  /// A chunk is stored raw when zstd saves less than this fraction of it; within a tensor, the
  /// chunks after such a chunk are tried only every 8th, until one compresses again.
  double minSavings = 0.05;
  /// A tensor whose role (its name with the numbers blanked: steps/#/batch/image) did not compress
  /// last time is stored raw until its rawRetryEvery-th write, when zstd tries it again: noisy
  /// images cost a compression each step and save nothing. 0 (the default) tries every time; the
  /// recorder, whose names have such roles, uses 16.
  uint32_t rawRetryEvery = 0;
  Durability durability;
  std::string producer = "crashcap";      ///< goes into the RecordingInfo record
  bool overwrite = false;                 ///< replace an existing file instead of refusing
  /// Id of the first tensor written. Files that are later merged into one bundle (the
  /// recorder's segments) use disjoint ranges so their tensor ids stay unique.
  uint64_t firstTensorId = 1;
  /// What the writer encodes with; null: its own, not fork-private.
  std::shared_ptr<EncodeMemory> encodeMemory;
};

/// Counters for tests, benchmarks and `info`.
struct WriterStats {
  uint64_t records = 0;
  uint64_t rawBodyBytes = 0;     ///< body bytes before compression
  uint64_t storedBodyBytes = 0;  ///< body bytes as written
  uint64_t fileBytes = 0;        ///< everything written so far
  uint64_t syncs = 0;
  uint64_t writeNs = 0;          ///< time spent handing bytes to the OS (pwritev and fdatasync)
};

/// Writes one bundle. Not thread-safe: one thread owns it (the recorder's background writer);
/// compression may fan out to `compressionThreads` internal threads. Every record reaches
/// the OS in one writev(2) before the call that produced it returns, so a crash of the
/// process loses at most the record being written; the file stays recoverable by the
/// reader's forward scan at every instant.
class BundleWriter {
 public:
  /// Creates the file (refuses an existing one unless options.overwrite), writes the file
  /// header and the RecordingInfo record. Throws Error{Io} with the path on failure.
  static std::unique_ptr<BundleWriter> create(const std::string& path, const WriterOptions& options = {});
  ~BundleWriter();  ///< closes without sealing when seal() was not called (file stays recoverable)
  BundleWriter(const BundleWriter&) = delete;
  BundleWriter& operator=(const BundleWriter&) = delete;

  /// Writes a tensor from contiguous row-major bytes; `bytes` is only read during the call.
  /// The name must be unique in the bundle. Returns the tensor id.
  uint64_t writeTensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                       const void* bytes, uint64_t size);

  /// The zstd level of the bodies written from now on (0..19; 0 stores raw); the options' level
  /// until called. The recorder's writer stores raw when compression cannot keep pace.
  void setZstdLevel(int level);
  int zstdLevel() const;

  /// Writes a Note record.
  void writeNote(const std::string& key, const std::string& text);

  /// Writes an Environment record. The caller redacts secrets first (recorder/environment).
  void writeEnvironment(const EnvironmentData& environment);

  /// Low-level: writes one record with an already-built meta (Cap'n Proto flat array,
  /// multiple of 8 bytes) and body, compressing the body when `compress`. Returns the
  /// record's file offset. For record types added by later parts of crashcap.
  uint64_t writeRecord(uint16_t type, const std::vector<uint8_t>& meta, const void* body,
                       uint64_t bodySize, bool compress, uint16_t extraFlags = 0);

  /// For `recover`: a writer that keeps `header` (recording id, creation time) and writes
  /// no RecordingInfo record of its own.
  static std::unique_ptr<BundleWriter> createCopy(const std::string& path, const FileHeader& header,
                                                  const WriterOptions& options = {});
  /// For `recover`: appends a record with meta and body verbatim (type, flags, lengths and
  /// checksums as in `header`, which must describe them); only the sequence number is
  /// renumbered to the next one. Returns its new offset.
  uint64_t copyRecord(const RecordHeader& header, const std::vector<uint8_t>& meta,
                      const std::vector<uint8_t>& storedBody);
  /// For `recover`: lists a tensor whose chunk records were appended with copyRecord
  /// (chunkRecords are their new offsets) in the index.
  void indexTensor(const TensorInfo& tensor);

  /// fdatasync now.
  void sync();
  /// Writes the index record and footer, syncs per Durability, closes the file. `sync` false
  /// skips the sync whatever Durability says: for a file its owner is about to remove, whose
  /// bytes the page cache serves to every reader until then.
  void seal(bool sync = true);

  bool sealed() const;
  const std::string& path() const;
  const FileHeader& fileHeader() const;
  const WriterStats& stats() const;

 private:
  struct Impl;
  explicit BundleWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// A fresh random 16-byte id (UUID v4 layout).
std::array<uint8_t, 16> newRecordingId();
/// "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx".
std::string formatRecordingId(const std::array<uint8_t, 16>& id);

/// The crashcap version string.
const char* toolVersion();

}  // namespace crashcap::formats
