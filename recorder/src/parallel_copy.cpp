#include "parallel_copy.hpp"

#include <algorithm>
#include <cstring>
#include <system_error>
#include <thread>

namespace crashcap::recorder::detail {
namespace {

/// Copies bytes [begin, end) of the tasks laid end to end.
void copyRange(const std::vector<CopyTask>& tasks, uint64_t begin, uint64_t end) {
  uint64_t at = 0;
  for (const auto& t : tasks) {
    const uint64_t from = std::max(begin, at), to = std::min(end, at + t.bytes);
    if (from < to)
      std::memcpy(static_cast<char*>(t.dst) + (from - at), static_cast<const char*>(t.src) + (from - at), to - from);
    at += t.bytes;
    if (at >= end) break;
  }
}

}  // namespace

unsigned copyInParallel(const std::vector<CopyTask>& tasks) {
  uint64_t total = 0;
  for (const auto& t : tasks) total += t.bytes;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t byChunks = std::max<uint64_t>(1, total / (4ull << 20));
  const unsigned threads =
      total < kParallelCopyMinBytes ? 1 : static_cast<unsigned>(std::min<uint64_t>({cores, kParallelCopyMaxThreads, byChunks}));
  if (threads <= 1) {
    copyRange(tasks, 0, total);
    return 1;
  }
  // Shares end on 64-byte boundaries, so that no two threads write one cache line.
  auto boundary = [&](unsigned i) { return i == threads ? total : (total * i / threads) & ~uint64_t(63); };
  std::vector<std::thread> helpers;
  helpers.reserve(threads - 1);
  unsigned started = 1;
  for (unsigned i = 1; i < threads; ++i) {
    try {
      helpers.emplace_back(copyRange, std::cref(tasks), boundary(i), boundary(i + 1));
      ++started;
    } catch (const std::system_error&) {
      copyRange(tasks, boundary(i), boundary(i + 1));
    }
  }
  copyRange(tasks, 0, boundary(1));
  for (auto& h : helpers) h.join();
  return started;
}

}  // namespace crashcap::recorder::detail
