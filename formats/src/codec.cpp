// ZSTD_createCCtx_advanced: a context whose workspace comes from WorkMemory.
#define ZSTD_STATIC_LINKING_ONLY
#include "codec.hpp"

#include "crashcap/formats/error.hpp"
#include "crashcap/formats/fork_private.hpp"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>

namespace crashcap::formats::detail {

void shuffleBytes(const uint8_t* in, uint8_t* out, size_t n, size_t k) {
  const size_t count = n / k;
  if (k == 4) {
    uint8_t* o0 = out;
    uint8_t* o1 = out + count;
    uint8_t* o2 = out + 2 * count;
    uint8_t* o3 = out + 3 * count;
    for (size_t i = 0; i < count; ++i) {
      o0[i] = in[4 * i];
      o1[i] = in[4 * i + 1];
      o2[i] = in[4 * i + 2];
      o3[i] = in[4 * i + 3];
    }
    return;
  }
  if (k == 2) {
    uint8_t* o0 = out;
    uint8_t* o1 = out + count;
    for (size_t i = 0; i < count; ++i) {
      o0[i] = in[2 * i];
      o1[i] = in[2 * i + 1];
    }
    return;
  }
  for (size_t b = 0; b < k; ++b) {
    uint8_t* o = out + b * count;
    for (size_t i = 0; i < count; ++i) o[i] = in[i * k + b];
  }
}

void unshuffleBytes(const uint8_t* in, uint8_t* out, size_t n, size_t k) {
  const size_t count = n / k;
  for (size_t b = 0; b < k; ++b) {
    const uint8_t* s = in + b * count;
    for (size_t i = 0; i < count; ++i) out[i * k + b] = s[i];
  }
}

void* WorkMemory::allocate(size_t n, bool forkPrivate) {
  n = std::max<size_t>(n, 1);
  if (!forkPrivate || n < kForkPrivateBytes) return std::malloc(n);
  return mapForkPrivate(n);
}

void WorkMemory::release(void* p, size_t n, bool forkPrivate, pid_t owner) {
  if (!p) return;
  if (!forkPrivate || std::max<size_t>(n, 1) < kForkPrivateBytes) std::free(p);
  else unmapForkPrivate(p, n, owner);
}

WorkBuffer::WorkBuffer(bool forkPrivate) : forkPrivate_(forkPrivate), owner_(::getpid()) {}

WorkBuffer::~WorkBuffer() { WorkMemory::release(data_, capacity_, forkPrivate_, owner_); }

uint8_t* WorkBuffer::reserve(size_t n) {
  if (n <= capacity_ && data_) return data_;
  // Grown by half again at least, so that a buffer that meets slowly growing sizes settles.
  const size_t grown = std::max(n, capacity_ + capacity_ / 2);
  void* p = WorkMemory::allocate(grown, forkPrivate_);
  if (!p) throw std::bad_alloc();
  WorkMemory::release(data_, capacity_, forkPrivate_, owner_);
  data_ = static_cast<uint8_t*>(p);
  capacity_ = grown;
  return data_;
}

struct Compressor::Blocks {
  bool forkPrivate = false;
  pid_t owner = ::getpid();
  std::mutex mu;
  std::unordered_map<void*, size_t> sizes;

  static void* allocate(void* self, size_t n) {
    auto* b = static_cast<Blocks*>(self);
    void* p = WorkMemory::allocate(n, b->forkPrivate);
    if (p) {
      std::lock_guard<std::mutex> lk(b->mu);
      b->sizes[p] = n;
    }
    return p;
  }
  static void release(void* self, void* p) {
    if (!p) return;
    auto* b = static_cast<Blocks*>(self);
    size_t n = 0;
    {
      std::lock_guard<std::mutex> lk(b->mu);
      auto it = b->sizes.find(p);
      if (it == b->sizes.end()) return;
      n = it->second;
      b->sizes.erase(it);
    }
    WorkMemory::release(p, n, b->forkPrivate, b->owner);
  }
};

Compressor::Compressor(bool forkPrivate) : blocks_(std::make_unique<Blocks>()) {
  blocks_->forkPrivate = forkPrivate;
  ctx_ = forkPrivate ? ZSTD_createCCtx_advanced(ZSTD_customMem{&Blocks::allocate, &Blocks::release, blocks_.get()})
                     : ZSTD_createCCtx();
  if (!ctx_) throw std::bad_alloc();
  ZSTD_CCtx_setParameter(ctx_, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(ctx_, ZSTD_c_contentSizeFlag, 1);
}

Compressor::~Compressor() {
  // In a forked child the workspace's blocks are not there to free (zstd reads its own header).
  if (!blocks_->forkPrivate || ::getpid() == blocks_->owner) ZSTD_freeCCtx(ctx_);
}

size_t Compressor::compress(const void* in, size_t size, int level, WorkBuffer& out) {
  ZSTD_CCtx_setParameter(ctx_, ZSTD_c_compressionLevel, level);
  out.reserve(ZSTD_compressBound(size));
  size_t n = ZSTD_compress2(ctx_, out.data(), out.capacity(), in, size);
  if (ZSTD_isError(n))
    throw Error(ErrorCode::Internal, fmt::format("zstd compression of {} bytes at level {} failed: {}", size, level,
                                                 ZSTD_getErrorName(n)));
  return n;
}

namespace {

/// One spare zstd decompression context per thread: a context is about 100 KiB to allocate and
/// clear, and readers make a Decompressor for every record and tensor they decode.
struct SpareDecompressionContext {
  ZSTD_DCtx* ctx = nullptr;
  ~SpareDecompressionContext() {
    if (ctx) ZSTD_freeDCtx(ctx);
  }
};
thread_local SpareDecompressionContext tSpare;

}  // namespace

Decompressor::Decompressor(unsigned windowLogMax) : windowLogMax_(windowLogMax) {}

Decompressor::~Decompressor() {
  if (!ctx_) return;
  if (tSpare.ctx) ZSTD_freeDCtx(ctx_);
  else tSpare.ctx = ctx_;
}

std::string Decompressor::decompress(const void* in, size_t size, void* out, size_t rawSize) {
  unsigned long long content = ZSTD_getFrameContentSize(in, size);
  if (content == ZSTD_CONTENTSIZE_ERROR) return "body is not a zstd frame";
  if (content == ZSTD_CONTENTSIZE_UNKNOWN) return "zstd frame does not declare its content size";
  if (content != rawSize)
    return fmt::format("zstd frame declares {} bytes, the record header {}", content, rawSize);
  size_t frame = ZSTD_findFrameCompressedSize(in, size);
  if (ZSTD_isError(frame)) return fmt::format("zstd frame is incomplete: {}", ZSTD_getErrorName(frame));
  if (frame != size) return fmt::format("zstd frame is {} bytes but the body is {}", frame, size);
  if (!ctx_) {
    if (tSpare.ctx) {
      ctx_ = std::exchange(tSpare.ctx, nullptr);
      ZSTD_DCtx_reset(ctx_, ZSTD_reset_session_and_parameters);
    } else {
      ctx_ = ZSTD_createDCtx();
      if (!ctx_) throw std::bad_alloc();
    }
    ZSTD_DCtx_setParameter(ctx_, ZSTD_d_windowLogMax, int(windowLogMax_));
  }
  size_t n = ZSTD_decompressDCtx(ctx_, out, rawSize, in, size);
  if (ZSTD_isError(n)) return fmt::format("zstd decoding failed: {}", ZSTD_getErrorName(n));
  if (n != rawSize) return fmt::format("zstd frame decoded to {} bytes, expected {}", n, rawSize);
  return {};
}

void encodeBody(Compressor& c, const uint8_t* in, size_t size, int level, size_t shuffleElement, double minSavings,
                WorkBuffer& scratch, EncodedBody& out) {
  out.codec = Codec::None;
  out.shuffle = 0;
  out.data = in;
  out.size = size;
  if (level <= 0 || size == 0) return;
  const uint8_t* src = in;
  if (shuffleElement > 1 && size % shuffleElement == 0) {
    shuffleBytes(in, scratch.reserve(size), size, shuffleElement);
    src = scratch.data();
  } else {
    shuffleElement = 0;
  }
  const size_t n = c.compress(src, size, level, out.owned);
  if (double(n) > double(size) * (1.0 - minSavings)) return;  // not worth it: store the caller's bytes as they are
  out.codec = Codec::Zstd;
  out.shuffle = uint8_t(shuffleElement);
  out.data = out.owned.data();
  out.size = n;
}

}  // namespace crashcap::formats::detail
