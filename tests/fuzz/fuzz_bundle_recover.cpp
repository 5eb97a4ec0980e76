// Fuzz target: recover on an untrusted bundle ends in a crashcap::Error or a sealed copy that
// verifies, never a crash, hang or allocation past the reader's limits. Recover writes a
// real file and syncs it, so the copies go to a directory on tmpfs (/dev/shm) when there is
// one, where a sync costs nothing; the input is a memfd.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/directory.hpp"
#include "fuzz_limits.hpp"
#include "mem_file.hpp"

namespace {

/// A directory of this process for the recovered copies, removed at exit.
const std::string& outputDirectory() {
  // Never destroyed, so the exit handler that removes the directory can still read it.
  static const std::string* dir = [] {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path base = fs::is_directory("/dev/shm", ec) && access("/dev/shm", W_OK) == 0 ? fs::path("/dev/shm")
                                                                                          : fs::temp_directory_path();
    auto* d = new std::string((base / ("crashcap-fuzz-recover-" + std::to_string(getpid()))).string());
    fs::create_directories(*d);
    std::atexit([] {
      crashcap::formats::removeTree(outputDirectory());
    });
    return d;
  }();
  return *dir;
}

}  // namespace

#ifdef CRASHCAP_FUZZ_STANDALONE
int fuzzBundleRecover(const uint8_t* data, size_t size) {
#else
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
#endif
  using namespace crashcap;
  fuzz::MemFile input(data, size);
  const std::string out = outputDirectory() + "/recovered.ccap";
  std::remove(out.c_str());
  fuzz::expectValueOrError([&] {
    auto limits = fuzz::fuzzLimits();
    formats::recoverBundle(input.path(), out, limits);
    auto v = formats::verifyBundle(out, limits);
    if (!v.ok()) {
      std::fprintf(stderr, "recover wrote a bundle that does not verify: %s: %s\n", v.problems[0].where.c_str(),
                   v.problems[0].what.c_str());
      std::abort();
    }
  });
  std::remove(out.c_str());
  return 0;
}
