#pragma once
// Copies with the memory bandwidth the machine has. One core's memcpy reaches a fraction of it
// (on a 2-vCPU machine, 9 GB/s against 20 GB/s for two threads), and a keyframe's copy is the
// one place the training waits for the recorder in proportion to the model: while beginStep
// copies, the training's own threads are idle, so the copy may use every core for that moment.

#include <cstdint>
#include <vector>

namespace crashcap::recorder::detail {

/// One contiguous copy.
struct CopyTask {
  void* dst;
  const void* src;
  uint64_t bytes;
};

/// Below this many bytes in all, the copies run on the calling thread: a helper thread costs
/// tens of microseconds to start.
constexpr uint64_t kParallelCopyMinBytes = 8ull << 20;
/// At most this many threads (the calling one included) share a copy.
constexpr unsigned kParallelCopyMaxThreads = 8;

/// Performs every task. With kParallelCopyMinBytes or more in all and more than one core, the
/// bytes are split evenly across min(cores, kParallelCopyMaxThreads, bytes / 4 MiB) threads, the
/// calling thread one of them; helpers are started for the call and joined before it returns (so
/// nothing is left behind in a process that forks). A helper that cannot be started leaves its
/// share to the calling thread. Returns the number of threads used.
unsigned copyInParallel(const std::vector<CopyTask>& tasks);

}  // namespace crashcap::recorder::detail
