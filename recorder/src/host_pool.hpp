#pragma once
// Host memory for the copies the recorder hands its writer (batches, generator states, keyframe
// tensors), reused by size. A fresh allocation per copy is mapped anew by the kernel (a page
// fault per 4 KiB) and unmapped when the writer frees it (a TLB shootdown on every core): for a
// batch of a few hundred KiB that costs several times the copy itself, on the training thread.
// Trainings copy the same sizes every step, so a buffer the writer is done with serves the next
// copy of its size class (sizes rounded up by at most 1/16, so that a batch padded to a varying
// length still finds one); idle buffers beyond the limit go, least recently returned first.
//
// Buffers of kPrivateBytes and more are mapped on their own and withheld from child processes
// (formats::mapForkPrivate). A training forks: a DataLoader starts its workers anew every epoch. Pages a
// child shares are copied on the parent's next write to them (a page fault and a 4 KiB copy
// each), and the recorder rewrites its buffers every step; a child never reads them (only the
// writer thread, which a child does not have, does).

#include <atomic>
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

  /// Buffers at least this large are mappings of their own, not inherited by a forked child.
  static constexpr uint64_t kPrivateBytes = 64 << 10;

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
  uint64_t peakBytes() const;   ///< the most it held at once, handed out and idle (no lock)

 private:
  explicit HostPool(uint64_t idleLimit);
  void give(void* p, uint64_t bytes);
  static void* allocate(uint64_t bytes);
  /// Frees a buffer. In a forked child a private buffer's range is not the child's: the address
  /// may hold the child's own memory by then, so it is left alone.
  void release(void* p, uint64_t bytes) const;

  struct Idle {
    uint64_t bytes;  ///< its size class
    void* p;
  };
  uint64_t idleLimit_;
  const int ownerPid_;  ///< the process that mapped the private buffers
  mutable std::mutex mu_;
  std::list<Idle> idle_;  ///< least recently returned first
  uint64_t idleBytes_ = 0, liveBytes_ = 0;
  std::atomic<uint64_t> peakBytes_{0};  ///< written under mu_, read without it (at every step)
};

}  // namespace crashcap::recorder::detail
