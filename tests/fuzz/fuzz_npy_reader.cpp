// Fuzz target: readNpy on untrusted bytes ends in a tensor or a crashcap::Error.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "crashcap/formats/error.hpp"
#include "crashcap/inspect/npy.hpp"
#include "crashcap/inspect/stats.hpp"

#ifdef CRASHCAP_FUZZ_STANDALONE
int fuzzNpyReader(const uint8_t* data, size_t size) {
#else
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
#endif
  int fd = memfd_create("fuzz-npy", 0);
  if (fd < 0) std::abort();
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += size_t(n);
  }
  try {
    auto t = crashcap::inspect::readNpy("/proc/self/fd/" + std::to_string(fd), 32 << 20);
    (void)crashcap::inspect::computeStats(t);
  } catch (const crashcap::Error&) {
  }
  close(fd);
  return 0;
}
