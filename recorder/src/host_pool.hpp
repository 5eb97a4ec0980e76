#pragma once
// Host memory for the copies the recorder hands its writer (batches, generator states, keyframe
// tensors), reused by size. A fresh allocation per copy is mapped anew by the kernel (a page
// fault per 4 KiB) and unmapped when the writer frees it (a TLB shootdown on every core): for a
// batch of a few hundred KiB that costs several times the copy itself, on the training thread.
// Trainings copy the same sizes every step, so a buffer the writer is done with serves the next
// copy of its size class (sizes rounded up by at most 1/16, so that a batch padded to a varying
// length still finds one); idle buffers beyond the limit go, least recently returned first.

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>

namespace crashcap::recorder::detail {

class HostPool : public std::enable_shared_from_this<HostPool> {
 public:
  /// Keeps at most `idleLimit` bytes of buffers nobody uses; beyond it, a returned buffer is freed.
  static std::shared_ptr<HostPool> create(uint64_t idleLimit);
  ~HostPool();

  /// The size class of `bytes`: rounded up to a 1/16 step of its power of two (at least 64).
  static uint64_t sizeClass(uint64_t bytes);

  /// A buffer of at least `bytes` (> 0), 64-byte aligned, back in the pool when its last owner
  /// lets go.
  /// nullptr when the memory cannot be had.
  std::shared_ptr<void> acquire(uint64_t bytes);

  /// Changes how many idle bytes it keeps (the recorder raises it to hold one keyframe's copies);
  /// a lower limit frees the least recently returned buffers now.
  void setIdleLimit(uint64_t idleLimit);
  uint64_t idleLimit() const;

  uint64_t idleBytes() const;
  uint64_t liveBytes() const;   ///< handed out and not yet returned

 private:
  explicit HostPool(uint64_t idleLimit) : idleLimit_(idleLimit) {}
  void give(void* p, uint64_t bytes);

  struct Idle {
    uint64_t bytes;  ///< its size class
    void* p;
  };
  uint64_t idleLimit_;
  mutable std::mutex mu_;
  std::list<Idle> idle_;  ///< least recently returned first
  uint64_t idleBytes_ = 0, liveBytes_ = 0;
};

}  // namespace crashcap::recorder::detail
