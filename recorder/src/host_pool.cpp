#include "host_pool.hpp"

#include <cstdlib>

namespace crashcap::recorder::detail {

std::shared_ptr<HostPool> HostPool::create(uint64_t idleLimit) {
  return std::shared_ptr<HostPool>(new HostPool(idleLimit));
}

HostPool::~HostPool() {
  for (auto& [bytes, p] : idle_) std::free(p);
}

std::shared_ptr<void> HostPool::acquire(uint64_t bytes) {
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // Exactly this size: a larger buffer would hand the writer stale bytes past the copy's end
    // only if sizes were mixed up, but it would also keep big buffers busy for small copies.
    auto it = idle_.find(bytes);
    if (it != idle_.end()) {
      p = it->second;
      idle_.erase(it);
      idleBytes_ -= bytes;
    }
    liveBytes_ += bytes;
  }
  if (!p && ::posix_memalign(&p, 64, bytes) != 0) {
    std::lock_guard<std::mutex> lk(mu_);
    liveBytes_ -= bytes;
    return nullptr;
  }
  auto self = shared_from_this();  // the pool outlives every buffer it handed out
  return std::shared_ptr<void>(p, [self, bytes](void* q) { self->give(q, bytes); });
}

void HostPool::give(void* p, uint64_t bytes) {
  std::unique_lock<std::mutex> lk(mu_);
  liveBytes_ -= bytes;
  if (idleBytes_ + bytes > idleLimit_) {
    lk.unlock();
    std::free(p);
    return;
  }
  idle_.emplace(bytes, p);
  idleBytes_ += bytes;
}

uint64_t HostPool::idleBytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return idleBytes_;
}

uint64_t HostPool::liveBytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return liveBytes_;
}

}  // namespace crashcap::recorder::detail
