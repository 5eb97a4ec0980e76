#pragma once
// Turns CUPTI activity buffers into crashcap's kernel trace entries: a bounded ring of the
// last activities, the external-correlation links (kernel -> ATen op) and the drop counts.
// Pure conversion, no driver needed: tests feed it hand-built buffers in CUDA 13's layouts.

#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "crashcap/formats/records.hpp"

namespace crashcap::cupti {

class ActivityCollector {
 public:
  explicit ActivityCollector(size_t capacity = 2048);

  /// Walks one completed CUPTI buffer (`validSize` bytes of activity records) with
  /// cuptiActivityGetNextRecord. `dropped` is what CUPTI reported lost for it. Throws
  /// crashcap::Error{Unsupported} when CUPTI cannot be loaded to walk it.
  void addBuffer(const uint8_t* buffer, size_t validSize, uint64_t dropped = 0);

  /// The last activities, oldest first, with op links resolved; the counters.
  void fill(formats::KernelTraceData& out) const;

  uint64_t total() const;

  /// The op linked to a correlation id by an external correlation record; -1 none.
  int64_t opFor(uint32_t correlationId) const;

 private:
  void add(formats::TraceActivityData activity);
  void link(uint32_t correlationId, int64_t opIndex);

  size_t capacity_;
  mutable std::mutex mu_;
  std::deque<formats::TraceActivityData> ring_;
  std::unordered_map<uint32_t, int64_t> ops_;   ///< correlation id -> op index
  std::deque<uint32_t> opsOrder_;                ///< for evicting the oldest links
  uint64_t total_ = 0, dropped_ = 0, truncated_ = 0;
};

}  // namespace crashcap::cupti
