// Fuzz target: readNpy on untrusted bytes ends in a tensor or a crashcap::Error.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "crashcap/formats/error.hpp"
#include "crashcap/inspect/npy.hpp"
#include "crashcap/inspect/stats.hpp"
#include "mem_file.hpp"

#ifdef CRASHCAP_FUZZ_STANDALONE
int fuzzNpyReader(const uint8_t* data, size_t size) {
#else
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
#endif
  crashcap::fuzz::MemFile input(data, size);
  try {
    auto t = crashcap::inspect::readNpy(input.path(), 32 << 20);
    (void)crashcap::inspect::computeStats(t);
  } catch (const crashcap::Error&) {
  }
  return 0;
}
