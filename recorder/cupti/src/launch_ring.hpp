#pragma once
// The host-side launch ring: each kernel launch as the launching thread made it (callback
// API). Written on the launch path: a short critical section, no allocation once warm.

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "crashcap/formats/records.hpp"

namespace crashcap::cupti::detail {

class LaunchRing {
 public:
  explicit LaunchRing(size_t capacity) : entries_(capacity ? capacity : 1) {}

  /// Records a launch at API entry; returns its slot for finish().
  uint64_t begin(const char* symbol, const char* api, const int32_t grid[3], const int32_t block[3], uint64_t stream,
                 uint32_t correlationId, uint64_t timeNs, uint32_t threadId, int64_t opIndex) {
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t index = next_++;
    auto& e = entries_[index % entries_.size()];
    e.index = index;
    e.symbol.assign(symbol ? symbol : "<unknown kernel>");  // reuses the slot's capacity
    if (e.symbol.size() > formats::kMaxTraceNameBytes) e.symbol.resize(formats::kMaxTraceNameBytes);
    e.api.assign(api ? api : "");
    for (int i = 0; i < 3; ++i) {
      e.grid[i] = grid[i];
      e.block[i] = block[i];
    }
    e.stream = stream;
    e.correlationId = correlationId;
    e.timeNs = timeNs;
    e.threadId = threadId;
    e.returnCode = -1;
    e.opIndex = opIndex;
    return index;
  }
  /// The launch call returned `code`.
  void finish(uint64_t index, int32_t code) {
    std::lock_guard<std::mutex> lk(mu_);
    auto& e = entries_[index % entries_.size()];
    if (e.index == index) e.returnCode = code;
  }
  void fill(formats::KernelTraceData& out) const {
    std::lock_guard<std::mutex> lk(mu_);
    out.totalLaunches = next_;
    uint64_t first = next_ > entries_.size() ? next_ - entries_.size() : 0;
    out.launches.clear();
    for (uint64_t i = first; i < next_; ++i) out.launches.push_back(entries_[i % entries_.size()]);
  }

 private:
  mutable std::mutex mu_;
  std::vector<formats::KernelLaunchData> entries_;
  uint64_t next_ = 0;
};

}  // namespace crashcap::cupti::detail
