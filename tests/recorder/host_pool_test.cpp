// The recorder's reused host buffers (recorder/src/host_pool.hpp).
#include <catch2/catch.hpp>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

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

namespace {
/// The VmFlags line of the mapping that holds `p` in /proc/self/smaps ("" when none does).
std::string mappingFlags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    unsigned long from = 0, to = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &from, &to) == 2 && line.find('-') < line.find(' ')) {
      inside = from <= at && at < to;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}
}  // namespace

TEST_CASE("large buffers are withheld from forked children, small ones come from the heap") {
  auto pool = HostPool::create(64 << 20);
  auto large = pool->acquire(HostPool::kPrivateBytes);
  auto small = pool->acquire(HostPool::kPrivateBytes / 2);
  REQUIRE(large);
  REQUIRE(small);
  CHECK(reinterpret_cast<uintptr_t>(large.get()) % 4096 == 0);
  // "dc": do not copy on fork. A DataLoader forks its workers every epoch; without it every page
  // of the buffer would be copied on the recorder's next write to it.
  std::string flags = mappingFlags(large.get());
  INFO(flags);
  CHECK(flags.find(" dc") != std::string::npos);
  CHECK(mappingFlags(small.get()).find(" dc") == std::string::npos);

  // The child has no such mapping: a read there would fault, so the recorder never reads it there.
  pid_t child = ::fork();
  if (child == 0) {
    std::string inChild = mappingFlags(large.get());
    std::_Exit(inChild.empty() ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  // Returned and reused as before.
  void* first = large.get();
  large.reset();
  CHECK(pool->acquire(HostPool::kPrivateBytes).get() == first);
}

TEST_CASE("a forked child that frees the pool leaves the memory at a private buffer's address alone") {
  auto pool = HostPool::create(64 << 20);
  void* at = nullptr;
  {
    auto buffer = pool->acquire(HostPool::kPrivateBytes);
    REQUIRE(buffer);
    at = buffer.get();
  }  // idle in the pool now
  pid_t child = ::fork();
  if (child == 0) {
    // The range is free in the child, so the child's own memory may come to live there.
    void* mine = ::mmap(at, HostPool::kPrivateBytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (mine != at) std::_Exit(2);
    std::memset(mine, 7, HostPool::kPrivateBytes);
    pool.reset();  // frees the idle buffers: must not unmap the child's memory
    volatile unsigned char* bytes = static_cast<unsigned char*>(mine);
    std::_Exit(bytes[0] == 7 && bytes[HostPool::kPrivateBytes - 1] == 7 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO("child status " << status);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
