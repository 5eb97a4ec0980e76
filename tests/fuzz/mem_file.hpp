#pragma once
// An in-memory file holding a fuzz input, reachable by path, for readers that take paths.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace crashcap::fuzz {

/// A memfd with `size` bytes of `data`; closed on destruction.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) : fd_(memfd_create("crashcap-fuzz", 0)) {
    if (fd_ < 0) std::abort();
    for (size_t done = 0; done < size;) {
      ssize_t n = write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += size_t(n);
    }
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace crashcap::fuzz
