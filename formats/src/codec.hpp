#pragma once
// Body codecs: byte shuffle and zstd frames, with bounded decoding for untrusted input.

#include <sys/types.h>
#include <zstd.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "crashcap/formats/layout.hpp"

namespace crashcap::formats::detail {

/// Transposes n bytes of k-byte elements: out = all byte 0s, then all byte 1s, ...
/// n must be a multiple of k.
void shuffleBytes(const uint8_t* in, uint8_t* out, size_t n, size_t k);
/// Inverse of shuffleBytes.
void unshuffleBytes(const uint8_t* in, uint8_t* out, size_t n, size_t k);

/// Memory to encode in. Fork-private memory maps its blocks of kForkPrivateBytes and more with
/// mapForkPrivate (fork_private.hpp), out of the children the process forks. A forked child does
/// not have these blocks: only a writer whose owner never encodes in a forked child (the recorder
/// stops in one) asks for them, and a child never releases them.
struct WorkMemory {
  static constexpr size_t kForkPrivateBytes = 64 << 10;
  /// Allocates `n` bytes (at least one); nullptr when the system has none.
  static void* allocate(size_t n, bool forkPrivate);
  static void release(void* p, size_t n, bool forkPrivate, pid_t owner);
};

/// A buffer that grows and never shrinks, and is never zeroed: a chunk is encoded into the same
/// memory every time.
class WorkBuffer {
 public:
  explicit WorkBuffer(bool forkPrivate = false);
  ~WorkBuffer();
  WorkBuffer(const WorkBuffer&) = delete;
  WorkBuffer& operator=(const WorkBuffer&) = delete;
  /// At least n bytes; what the buffer held is not kept when it grows.
  uint8_t* reserve(size_t n);
  uint8_t* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  bool forkPrivate_;
  pid_t owner_;
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
};

/// A zstd compression context with the bundle's frame settings (content size and checksum
/// on), its workspace in fork-private memory when asked. One per thread.
class Compressor {
 public:
  explicit Compressor(bool forkPrivate = false);
  ~Compressor();
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;
  /// Compresses into the start of `out` (grown to zstd's bound when smaller, so a buffer reused
  /// for every chunk is allocated once); returns the frame's size.
  size_t compress(const void* in, size_t size, int level, WorkBuffer& out);

  struct Blocks;  ///< the sizes of the workspace's blocks, which zstd frees without

 private:
  std::unique_ptr<Blocks> blocks_;
  ZSTD_CCtx* ctx_;
};

/// A zstd decompression context bounded by a window limit, taken on the first frame (a reader
/// that meets only raw bodies never pays for one) from the thread's spare, which it becomes
/// again afterwards. One per thread at a time.
class Decompressor {
 public:
  explicit Decompressor(unsigned windowLogMax);
  ~Decompressor();
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;
  /// Decodes exactly one frame occupying all of `in` whose content size is `rawSize`, into
  /// out[0..rawSize). Returns an empty string on success, else what was wrong.
  std::string decompress(const void* in, size_t size, void* out, size_t rawSize);

 private:
  unsigned windowLogMax_;
  ZSTD_DCtx* ctx_ = nullptr;
};

/// A record body ready to write: either a view of the caller's bytes (raw) or an owned
/// encoded buffer.
struct EncodedBody {
  explicit EncodedBody(bool forkPrivate = false) : owned(forkPrivate) {}
  EncodedBody(Codec c, uint8_t s, const uint8_t* d, size_t n) : codec(c), shuffle(s), data(d), size(n) {}
  Codec codec = Codec::None;
  uint8_t shuffle = 0;           ///< element size used for shuffling, 0 for none
  WorkBuffer owned;              ///< holds the encoded bytes (its first `size`) when codec != None; reused
  const uint8_t* data = nullptr; ///< what to write
  size_t size = 0;
};

/// Encodes one chunk: shuffle (when shuffleElement > 1) then zstd at `level`; falls back to
/// raw (unshuffled, pointing at `in`) when level == 0 or zstd saves less than minSavings.
/// `scratch` is reused between calls.
void encodeBody(Compressor& c, const uint8_t* in, size_t size, int level, size_t shuffleElement, double minSavings,
                WorkBuffer& scratch, EncodedBody& out);

}  // namespace crashcap::formats::detail
