// Fuzz target: everything the CLI does to read an untrusted bundle (open through the index
// and by a forward scan, the report, recording info, notes and environment, the recorder's
// records, every tensor with its statistics and printing, verify) must end in a value or a
// crashcap::Error, never a crash, hang or allocation past the reader's limits. The input is
// read from memory (BundleReader::openBytes, verifyBundleBytes): no file is touched, so an
// input costs only the decoding. recover, which writes a bundle, is fuzz_bundle_recover.
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/inspect/print.hpp"
#include "crashcap/inspect/stats.hpp"
#include "fuzz_limits.hpp"

namespace {

/// What reading a tensor depends on besides the bytes: two readers of one input that agree
/// on it read the same bytes in the same way.
using TensorKey = std::tuple<uint64_t, std::string, int, std::vector<int64_t>, uint64_t, std::vector<uint64_t>>;

TensorKey keyOf(const crashcap::formats::TensorInfo& t) {
  return {t.id, t.name, static_cast<int>(t.dtype), t.shape, t.totalBytes, t.chunkRecords};
}

/// The same for readRecords: the records' offsets, types and sequence numbers.
std::vector<std::tuple<uint64_t, uint16_t, uint64_t>> recordsKey(const crashcap::formats::BundleReader& reader) {
  std::vector<std::tuple<uint64_t, uint16_t, uint64_t>> key;
  for (const auto& r : reader.records()) key.emplace_back(r.offset, r.type, r.sequence);
  return key;
}

}  // namespace

#ifdef CRASHCAP_FUZZ_STANDALONE
int fuzzBundleReader(const uint8_t* data, size_t size) {
#else
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
#endif
  using namespace crashcap;
  using fuzz::expectValueOrError;
  std::vector<uint8_t> bytes(data, data + size);
  const std::string name = "fuzz-input.ccap";
  auto limits = fuzz::fuzzLimits();
  expectValueOrError([&] { (void)formats::verifyBundleBytes(bytes, name, limits); });
  // The scan repeats only what opening did not already exercise identically: when opening
  // fell back to the forward scan (no usable index), scanning again would redo the same work.
  std::set<TensorKey> tensorsRead;
  std::set<std::vector<std::tuple<uint64_t, uint16_t, uint64_t>>> recordListsRead;
  bool openScanned = false;
  for (bool scan : {false, true}) {
    if (scan && openScanned) break;
    expectValueOrError([&] {
      // The scan, last to read the input, takes it over instead of copying it.
      auto reader = scan ? formats::BundleReader::scanBytes(std::move(bytes), name, limits)
                         : formats::BundleReader::openBytes(bytes, name, limits);
      if (!scan) openScanned = reader->report().scanned;
      (void)reader->report().summary();
      expectValueOrError([&] { (void)reader->recordingInfo(); });
      (void)reader->notes();
      (void)reader->environment();
      if (recordListsRead.insert(recordsKey(*reader)).second) (void)formats::readRecords(*reader);
      for (const auto& t : reader->tensors()) {
        if (!tensorsRead.insert(keyOf(t)).second) continue;
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
  return 0;
}
