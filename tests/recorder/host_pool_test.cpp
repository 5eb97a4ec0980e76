// The recorder's reused host buffers (recorder/src/host_pool.hpp).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>

#include "host_pool.hpp"

using crashcap::recorder::detail::HostPool;

TEST_CASE("a buffer the writer lets go of serves the next copy of its size class") {
  auto pool = HostPool::create(1 << 20);
  void* first = nullptr;
  {
    auto a = pool->acquire(1000);
    REQUIRE(a);
    first = a.get();
    CHECK(reinterpret_cast<uintptr_t>(first) % 64 == 0);
    std::memset(first, 1, 1000);
    CHECK(pool->liveBytes() == HostPool::sizeClass(1000));
  }
  CHECK(pool->liveBytes() == 0);
  CHECK(pool->idleBytes() == HostPool::sizeClass(1000));
  auto b = pool->acquire(1010);  // the same class: reused
  CHECK(b.get() == first);
  CHECK(pool->idleBytes() == 0);
}

TEST_CASE("size classes round up by at most a sixteenth") {
  CHECK(HostPool::sizeClass(1) == 64);
  CHECK(HostPool::sizeClass(64) == 64);
  CHECK(HostPool::sizeClass(65) == 128);
  for (uint64_t bytes : {1000ull, 4097ull, 262144ull, 262145ull, 50ull << 20, (50ull << 20) + 1})
    CHECK(HostPool::sizeClass(bytes) - bytes <= bytes / 16 + 64);
  CHECK(HostPool::sizeClass(262144) == 262144);
}

TEST_CASE("idle buffers beyond the limit go, least recently returned first") {
  auto pool = HostPool::create(3 * 4096);
  void *p1, *p2, *p3, *p4;
  {
    auto a = pool->acquire(4096), b = pool->acquire(4096), c = pool->acquire(4096), d = pool->acquire(4096);
    p1 = a.get(), p2 = b.get(), p3 = c.get(), p4 = d.get();
    a.reset();  // returned first: the first to go
    b.reset();
    c.reset();
    CHECK(pool->idleBytes() == 3 * 4096);
  }  // d returned: over the limit, a goes
  CHECK(pool->idleBytes() == 3 * 4096);
  auto x = pool->acquire(4096);
  CHECK(x.get() == p4);  // the most recently returned
  auto y = pool->acquire(4096), z = pool->acquire(4096);
  CHECK(((y.get() == p3 && z.get() == p2) || (y.get() == p2 && z.get() == p3)));
  CHECK(pool->idleBytes() == 0);
  (void)p1;
  auto big = pool->acquire(1 << 20);  // larger than the idle limit: freed when returned
  big.reset();
  CHECK(pool->idleBytes() == 0);
}

TEST_CASE("buffers outlive the recorder's handle on the pool") {
  auto pool = HostPool::create(1 << 20);
  auto buffer = pool->acquire(128);
  pool.reset();  // the writer may still hold copies when the Recorder goes
  std::memset(buffer.get(), 7, 128);
  buffer.reset();
  SUCCEED("no use after free (ASan builds check it)");
}
