// Fuzz target: everything the CLI does with an untrusted bundle (open, list, read every
// tensor, stats and printing, verify, scan, recover) must end in a value or a crashcap::Error,
// never a crash, hang or allocation past the reader's limits.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/inspect/print.hpp"
#include "crashcap/inspect/stats.hpp"
#include "mem_file.hpp"

namespace {

/// Limits small enough that the biggest legal allocation is far below the fuzz cap.
crashcap::formats::ReaderLimits fuzzLimits() {
  crashcap::formats::ReaderLimits l;
  l.maxMetaBytes = 1 << 20;
  l.maxChunkBytes = 16 << 20;
  l.maxIndexBytes = 16 << 20;
  l.maxTensorBytes = 32 << 20;
  l.maxRecords = 100000;
  return l;
}

template <typename Fn>
void expectValueOrError(Fn&& fn) {
  try {
    fn();
  } catch (const crashcap::Error&) {
  }
}

}  // namespace

#ifdef CRASHCAP_FUZZ_STANDALONE
int fuzzBundleReader(const uint8_t* data, size_t size) {
#else
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
#endif
  using namespace crashcap;
  fuzz::MemFile input(data, size);
  const std::string path = input.path();
  auto limits = fuzzLimits();
  for (bool scan : {false, true}) {
    expectValueOrError([&] {
      auto reader = scan ? formats::BundleReader::scan(path, limits) : formats::BundleReader::open(path, limits);
      (void)reader->report().summary();
      (void)reader->environment();
      for (const auto& t : reader->tensors()) {
        expectValueOrError([&] {
          inspect::HostTensor h;
          h.dtype = t.dtype;
          h.shape = t.shape;
          h.bytes = reader->readTensor(t);
          (void)inspect::computeStats(h);
          (void)inspect::formatTensor(h);
        });
      }
    });
  }
  expectValueOrError([&] { (void)formats::verifyBundle(path, limits); });
  char out[] = "/tmp/crashcap-fuzz-recover-XXXXXX";
  int ofd = mkstemp(out);
  if (ofd >= 0) {
    close(ofd);
    unlink(out);
    expectValueOrError([&] {
      formats::recoverBundle(path, out, limits);
      auto v = formats::verifyBundle(out, limits);
      if (!v.ok()) {
        std::fprintf(stderr, "recover wrote a bundle that does not verify: %s\n", v.problems[0].what.c_str());
        std::abort();
      }
    });
    unlink(out);
  }
  return 0;
}
