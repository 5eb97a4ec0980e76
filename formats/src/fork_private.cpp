#include "crashcap/formats/fork_private.hpp"

#include <sys/mman.h>
#include <unistd.h>

namespace crashcap::formats {

void* mapForkPrivate(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  (void)::madvise(p, bytes, MADV_DONTFORK);
  return p;
}

void unmapForkPrivate(void* block, size_t bytes, pid_t owner) {
  if (block && ::getpid() == owner) ::munmap(block, bytes);
}

}  // namespace crashcap::formats
