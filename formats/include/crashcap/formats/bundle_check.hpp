#pragma once
// verify (every checksum and invariant, read-only) and recover (a repaired copy).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/limits.hpp"

namespace crashcap::formats {

/// One problem verify found.
struct Problem {
  uint64_t offset = 0;        ///< first byte of the damaged structure
  uint64_t length = 0;        ///< its length in bytes (0 when unknown)
  std::string where;          ///< "file header", "record #12 (tensor_chunk 'w' chunk 3)", "footer", "index"
  std::string what;           ///< "body checksum mismatch: stored 0x..., computed 0x..."
};

struct VerifyReport {
  uint64_t fileSize = 0;
  bool sealed = false;          ///< a valid footer and index were found
  uint64_t recordsChecked = 0;
  uint64_t tensorsChecked = 0;
  uint64_t bytesChecked = 0;
  std::vector<Problem> problems;
  std::vector<std::string> notices;   ///< not problems: unknown record types skipped, ...
  bool ok() const { return problems.empty(); }
};

/// Checks every byte of `path`: file header, each record's header, meta and body checksums,
/// meta decoding, zstd frames, tensor tiling, the index against the records, the footer.
/// An unsealed bundle is a problem ("not sealed"). Throws for I/O errors, files that are not
/// bundles at all, and bundles holding more records than limits.maxRecords.
VerifyReport verifyBundle(const std::string& path, const ReaderLimits& limits = {}, const Progress& progress = {});
/// verifyBundle for a bundle held in memory (BundleReader::openBytes); `name` stands for the
/// path in messages.
VerifyReport verifyBundleBytes(const std::vector<uint8_t>& bytes, const std::string& name,
                               const ReaderLimits& limits = {});

struct RecoverReport {
  OpenReport source;           ///< what the scan of the input found
  uint64_t recordsCopied = 0;
  uint64_t tensorsCopied = 0;
  uint64_t bytesWritten = 0;
};

/// Writes a sealed copy of `in` to `out` holding every intact record of `in` (copied byte for
/// byte, no recompression; sequence numbers renumbered without gaps) except chunks of incomplete tensors, plus a "crashcap.recovery"
/// note saying what was lost. Never modifies `in`; refuses an existing `out` and out == in.
RecoverReport recoverBundle(const std::string& in, const std::string& out, const ReaderLimits& limits = {},
                            const Progress& progress = {});

/// A bundle written as OUT.partial and renamed to OUT only when complete, so a failure never
/// leaves a half-written OUT that would block the retry. The partial file is removed on
/// destruction unless commit() ran. Used by recover and by sealing a recording.
class PartialOutput {
 public:
  explicit PartialOutput(std::string out);
  ~PartialOutput();
  PartialOutput(const PartialOutput&) = delete;
  PartialOutput& operator=(const PartialOutput&) = delete;
  /// OUT.partial: where to write.
  const std::string& path() const { return partial_; }
  /// Renames OUT.partial to OUT and fsyncs the directory so the new name is durable.
  /// Throws Error{Io}.
  void commit();

 private:
  std::string out_, partial_;
  bool committed_ = false;
};

struct CopyReport {
  uint64_t recordsCopied = 0;
  uint64_t tensorsCopied = 0;
  uint64_t recordsSkipped = 0;       ///< chunks of incomplete or undecodable tensors, undecodable records
  std::vector<std::string> lines;    ///< one line per dropped tensor or record, for a note
};

/// Appends every intact record of `reader` to `writer` byte for byte (no recompression; the
/// writer renumbers sequences) and lists the copied tensors in the writer's index. Chunks of
/// incomplete or undecodable tensors are dropped; `keep`, when given, may reject records
/// other than tensor chunks (every complete tensor is copied). Used by recover and by sealing a
/// recording. With `decodeChunks` false, chunk bodies are not test-decompressed first (their
/// checksums were checked by the scan that opened `reader`; only a writer bug could make one
/// undecodable): much faster, for the crash path. `keepTensor`, when given, may reject whole
/// tensors (their chunks are neither copied nor indexed): `crashcap pack`.
CopyReport copyRecords(const BundleReader& reader, BundleWriter& writer,
                       const std::function<bool(const RecordEntry&)>& keep = {}, bool decodeChunks = true,
                       const std::function<bool(const TensorInfo&)>& keepTensor = {});

}  // namespace crashcap::formats
