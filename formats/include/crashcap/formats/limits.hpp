#pragma once
// Bounds on untrusted input. Every length read from a file is checked against these before
// anything is allocated. Reading a tensor beyond a limit throws ErrorCode::LimitExceeded
// naming the limit (the CLI raises maxTensorBytes with --max-tensor-bytes); during a scan, a
// record beyond the limits is reported as damage and skipped.

#include <cstdint>
#include <functional>

namespace crashcap::formats {

/// A record meta never exceeds this (the writer refuses larger ones); the default
/// ReaderLimits::maxMetaBytes.
inline constexpr uint64_t kMaxMetaBytes = 1ull << 20;
/// The default ReaderLimits::maxDecodedTraceNameBytes; kernel trace writers stay under it.
inline constexpr uint64_t kMaxDecodedTraceNameBytes = 64ull << 20;
/// Longest note text the writer accepts.
inline constexpr uint64_t kMaxNoteTextBytes = 64ull << 10;

/// Called now and then during long reads (scans, verify, recover) with the bytes done so far
/// and the total; may be empty. Called on the reading thread.
using Progress = std::function<void(uint64_t done, uint64_t total)>;

struct ReaderLimits {
  uint64_t maxMetaBytes = kMaxMetaBytes;     ///< one record's meta
  uint64_t maxChunkBytes = 64ull << 20;      ///< one record's body, stored or decoded
  uint64_t maxIndexBytes = 256ull << 20;     ///< the decoded index body
  uint64_t maxTensorBytes = 16ull << 30;     ///< one tensor read into memory
  uint64_t maxRecords = 50'000'000;          ///< records in one bundle
  unsigned zstdWindowLogMax = 27;            ///< zstd decoder window (128 MiB)
  uint64_t capnpTraversalWords = 64ull << 20;   ///< Cap'n Proto traversal limit (words)
  /// One kernel_trace record's names once decoded: each entry copies its name out of the
  /// record's string table, so a small record naming one 4 KiB symbol many times would decode
  /// to gigabytes. Writers trim their traces to fit the default.
  uint64_t maxDecodedTraceNameBytes = kMaxDecodedTraceNameBytes;
  int capnpNestingLimit = 16;
};

}  // namespace crashcap::formats
