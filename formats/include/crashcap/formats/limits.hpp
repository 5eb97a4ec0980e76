#pragma once
// Bounds on untrusted input. Every length read from a file is checked against these before
// anything is allocated; a bundle that needs more is refused with ErrorCode::LimitExceeded
// and a message naming the limit (raise it with the CLI's --max-tensor-bytes etc.).

#include <cstdint>

namespace crashcap::formats {

struct ReaderLimits {
  uint64_t maxMetaBytes = 1ull << 20;        ///< one record's meta
  uint64_t maxChunkBytes = 64ull << 20;      ///< one record's body, stored or decoded
  uint64_t maxIndexBytes = 256ull << 20;     ///< the decoded index body
  uint64_t maxTensorBytes = 16ull << 30;     ///< one tensor read into memory
  uint64_t maxRecords = 50'000'000;          ///< records in one bundle
  unsigned zstdWindowLogMax = 27;            ///< zstd decoder window (128 MiB)
  uint64_t capnpTraversalWords = 64ull << 20;   ///< Cap'n Proto traversal limit (words)
  int capnpNestingLimit = 16;
};

}  // namespace crashcap::formats
