#pragma once
// Body codecs: byte shuffle and zstd frames, with bounded decoding for untrusted input.

#include <zstd.h>

#include <cstdint>
#include <vector>

#include "crashcap/formats/layout.hpp"

namespace crashcap::formats::detail {

/// Transposes n bytes of k-byte elements: out = all byte 0s, then all byte 1s, ...
/// n must be a multiple of k.
void shuffleBytes(const uint8_t* in, uint8_t* out, size_t n, size_t k);
/// Inverse of shuffleBytes.
void unshuffleBytes(const uint8_t* in, uint8_t* out, size_t n, size_t k);

/// A zstd compression context with the bundle's frame settings (content size and checksum
/// on). One per thread.
class Compressor {
 public:
  Compressor();
  ~Compressor();
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;
  /// Compresses into the start of `out` (grown to zstd's bound when smaller, never shrunk, so a
  /// buffer reused for every chunk is allocated once); returns the frame's size.
  size_t compress(const void* in, size_t size, int level, std::vector<uint8_t>& out);

 private:
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
  Codec codec = Codec::None;
  uint8_t shuffle = 0;           ///< element size used for shuffling, 0 for none
  std::vector<uint8_t> owned;    ///< holds the encoded bytes (its first `size`) when codec != None; reused
  const uint8_t* data = nullptr; ///< what to write
  size_t size = 0;
};

/// Encodes one chunk: shuffle (when shuffleElement > 1) then zstd at `level`; falls back to
/// raw (unshuffled, pointing at `in`) when level == 0 or zstd saves less than minSavings.
/// `scratch` is reused between calls.
void encodeBody(Compressor& c, const uint8_t* in, size_t size, int level, size_t shuffleElement, double minSavings,
                std::vector<uint8_t>& scratch, EncodedBody& out);

}  // namespace crashcap::formats::detail
