#include "host_pool.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <vector>

#include "crashcap/formats/fork_private.hpp"

namespace crashcap::recorder::detail {

void* HostPool::allocate(uint64_t bytes) {
  if (bytes < kPrivateBytes) {
    void* p = nullptr;
    return ::posix_memalign(&p, 64, bytes) == 0 ? p : nullptr;
  }
  return formats::mapForkPrivate(bytes);
}

HostPool::HostPool(uint64_t idleLimit) : idleLimit_(idleLimit), ownerPid_(::getpid()) {}

void HostPool::release(void* p, uint64_t bytes) const {
  if (bytes < kPrivateBytes) std::free(p);
  else formats::unmapForkPrivate(p, bytes, ownerPid_);
}

std::shared_ptr<HostPool> HostPool::create(uint64_t idleLimit) {
  return std::shared_ptr<HostPool>(new HostPool(idleLimit));
}

HostPool::~HostPool() {
  for (auto& i : idle_) release(i.p, i.bytes);
}

uint64_t HostPool::sizeClass(uint64_t bytes) {
  uint64_t power = 1;
  while (power * 2 <= bytes) power *= 2;
  const uint64_t step = power / 16 > 64 ? power / 16 : 64;
  return (bytes + step - 1) / step * step;
}

std::shared_ptr<void> HostPool::acquire(uint64_t requested) {
  const uint64_t bytes = sizeClass(requested);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // The most recently returned buffer of this class: the likeliest to be in cache.
    for (auto it = idle_.rbegin(); it != idle_.rend(); ++it)
      if (it->bytes == bytes) {
        p = it->p;
        idle_.erase(std::next(it).base());
        idleBytes_ -= bytes;
        break;
      }
    liveBytes_ += bytes;
    if (liveBytes_ + idleBytes_ > peakBytes_.load(std::memory_order_relaxed))
      peakBytes_.store(liveBytes_ + idleBytes_, std::memory_order_relaxed);
  }
  if (!p && !(p = allocate(bytes))) {
    std::lock_guard<std::mutex> lk(mu_);
    liveBytes_ -= bytes;
    return nullptr;
  }
  auto self = shared_from_this();  // the pool outlives every buffer it handed out
  return std::shared_ptr<void>(p, [self, bytes](void* q) { self->give(q, bytes); });
}

void HostPool::give(void* p, uint64_t bytes) {
  std::vector<Idle> evicted;
  {
    std::lock_guard<std::mutex> lk(mu_);
    liveBytes_ -= bytes;
    if (bytes > idleLimit_) {
      evicted.push_back({bytes, p});
    } else {
      idle_.push_back({bytes, p});
      idleBytes_ += bytes;
      while (idleBytes_ > idleLimit_) {  // the least recently returned go first
        evicted.push_back(idle_.front());
        idleBytes_ -= idle_.front().bytes;
        idle_.pop_front();
      }
    }
  }
  for (const Idle& i : evicted) release(i.p, i.bytes);
}

void HostPool::setIdleLimit(uint64_t idleLimit) {
  std::vector<Idle> evicted;
  {
    std::lock_guard<std::mutex> lk(mu_);
    idleLimit_ = idleLimit;
    while (idleBytes_ > idleLimit_) {
      evicted.push_back(idle_.front());
      idleBytes_ -= idle_.front().bytes;
      idle_.pop_front();
    }
  }
  for (const Idle& i : evicted) release(i.p, i.bytes);
}

uint64_t HostPool::idleLimit() const {
  std::lock_guard<std::mutex> lk(mu_);
  return idleLimit_;
}

uint64_t HostPool::idleBytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return idleBytes_;
}

uint64_t HostPool::liveBytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return liveBytes_;
}

uint64_t HostPool::peakBytes() const { return peakBytes_.load(std::memory_order_relaxed); }

}  // namespace crashcap::recorder::detail
