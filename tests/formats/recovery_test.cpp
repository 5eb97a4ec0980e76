// Bundles cut short or damaged: the forward scan recovers exactly the complete records.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <set>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "test_support.hpp"

using namespace crashcap;
using namespace crashcap::formats;
using crashcap::test::TempDir;

namespace {

struct Sample {
  std::string path;
  std::vector<RecordEntry> records;       // data records in file order (index excluded)
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::vector<uint8_t>> contents;
  uint64_t indexOffset = 0;
  uint64_t size = 0;
};

/// A sealed bundle with small and multi-chunk tensors of several dtypes and a note.
Sample makeSample(const TempDir& dir) {
  Sample s;
  s.path = dir.file("sample.ccap");
  WriterOptions options;
  options.chunkBytes = 4096;
  auto writer = BundleWriter::create(s.path, options);
  auto add = [&](const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    writer->writeTensor(name, dtype, shape, bytes.data(), bytes.size());
    s.contents[name] = std::move(bytes);
  };
  auto floats = test::randomFloats(3000, 1);
  std::vector<uint8_t> fb(floats.size() * 4);
  std::memcpy(fb.data(), floats.data(), fb.size());
  add("weights/conv1", DType::Float32, {3000}, fb);
  add("batch/labels", DType::Int64, {4}, test::randomBytes(32, 2));
  writer->writeNote("user.note", "between tensors");
  add("batch/images", DType::UInt8, {2, 3, 40, 40}, test::randomBytes(9600, 3));
  add("scalar", DType::Float64, {}, test::randomBytes(8, 4));
  writer->seal();
  auto reader = BundleReader::open(s.path);
  s.records = reader->records();
  s.tensors = reader->tensors();
  s.size = test::readFile(s.path).size();
  s.indexOffset = s.records.back().offset + s.records.back().length;
  return s;
}

}  // namespace

TEST_CASE("reader recovers every complete record of a truncated bundle", "[formats][recovery]") {
  TempDir dir;
  Sample s = makeSample(dir);
  auto full = test::readFile(s.path);

  // Cut points inside every structure: file header, each record's header, meta and body,
  // the index and the footer, plus exact record boundaries.
  std::set<uint64_t> cuts = {1, 8, 9, 30, 63, 64};
  for (const auto& r : s.records) {
    for (uint64_t d : {uint64_t(0), uint64_t(1), uint64_t(31), uint64_t(63), uint64_t(64), uint64_t(65)})
      cuts.insert(r.offset + d);
    cuts.insert(r.offset + r.length - 1);
    cuts.insert(r.offset + r.length / 2);
  }
  for (uint64_t d : {uint64_t(0), uint64_t(10), uint64_t(64), uint64_t(70)}) cuts.insert(s.indexOffset + d);
  for (uint64_t d = 1; d < kFooterSize; d += 7) cuts.insert(s.size - d);

  for (uint64_t cut : cuts) {
    if (cut >= s.size) continue;
    INFO("cut at byte " << cut << " of " << s.size);
    std::string path = dir.file("cut.ccap");
    test::writeFile(path, std::vector<uint8_t>(full.begin(), full.begin() + long(cut)));
    auto reader = BundleReader::open(path);
    const auto& report = reader->report();
    CHECK_FALSE(report.sealed);
    CHECK_FALSE((report.complete() && cut < s.indexOffset));

    std::vector<uint64_t> expectRecords;
    for (const auto& r : s.records)
      if (r.offset + r.length <= cut) expectRecords.push_back(r.offset);
    std::vector<uint64_t> got;
    for (const auto& r : reader->records()) got.push_back(r.offset);
    CHECK(got == expectRecords);
    CHECK(report.recordsRecovered == expectRecords.size());

    std::set<std::string> expectTensors, lost;
    for (const auto& t : s.tensors) {
      bool all = std::all_of(t.chunkRecords.begin(), t.chunkRecords.end(), [&](uint64_t off) {
        auto it = std::find_if(s.records.begin(), s.records.end(), [&](const RecordEntry& r) { return r.offset == off; });
        return it->offset + it->length <= cut;
      });
      if (all) expectTensors.insert(t.name);
    }
    std::set<std::string> gotTensors;
    for (const auto& t : reader->tensors()) {
      gotTensors.insert(t.name);
      CHECK(reader->readTensor(t) == s.contents.at(t.name));
    }
    CHECK(gotTensors == expectTensors);
    for (const auto& l : report.lostTensors) lost.insert(l.name);
    for (const auto& t : s.tensors) {
      // A tensor is known to be lost once its first chunk record is complete.
      const auto& first = *std::find_if(s.records.begin(), s.records.end(),
                                        [&](const RecordEntry& r) { return r.offset == t.chunkRecords.front(); });
      bool started = cut >= first.offset + first.length;
      if (started && !expectTensors.count(t.name)) CHECK(lost.count(t.name));
    }
    // Cutting inside a record (not at a boundary) is reported as truncation at that record.
    bool atBoundary = cut == kFileHeaderSize || cut == s.indexOffset ||
                      std::any_of(s.records.begin(), s.records.end(),
                                  [&](const RecordEntry& r) { return r.offset + r.length == cut; });
    if (!atBoundary) {
      REQUIRE(report.truncatedAt);
      CHECK(report.summary().find("truncated at byte") != std::string::npos);
    }
  }
}

TEST_CASE("a damaged record is skipped and the scan resynchronises on the next one", "[formats][recovery]") {
  TempDir dir;
  Sample s = makeSample(dir);
  // Break the header of the second chunk of weights/conv1 and a body byte of batch/images.
  auto bytes = test::readFile(s.path);
  const auto& w = *std::find_if(s.tensors.begin(), s.tensors.end(), [](auto& t) { return t.name == "weights/conv1"; });
  const auto& img = *std::find_if(s.tensors.begin(), s.tensors.end(), [](auto& t) { return t.name == "batch/images"; });
  bytes[w.chunkRecords[1] + 10] ^= 0x40;
  bytes[img.chunkRecords[0] + 200] ^= 0x01;
  test::writeFile(dir.file("bad.ccap"), bytes);

  // The index is intact, so open() trusts it; reading a damaged tensor then fails loudly.
  auto indexed = BundleReader::open(dir.file("bad.ccap"));
  CHECK(indexed->report().sealed);
  try {
    indexed->readTensor(indexed->get("batch/images"));
    FAIL("expected Corrupt");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Corrupt);
    CHECK_THAT(e.what(), Catch::Contains("body checksum mismatch") &&
                             Catch::Contains("at byte " + std::to_string(img.chunkRecords[0])) &&
                             Catch::Contains("while reading tensor 'batch/images' chunk 0 of 3"));
  }
  CHECK(indexed->readTensor(indexed->get("scalar")) == s.contents.at("scalar"));

  auto reader = BundleReader::scan(dir.file("bad.ccap"));
  const auto& report = reader->report();
  CHECK_FALSE(report.complete());
  CHECK(report.damage.size() == 2);
  std::set<std::string> names;
  for (const auto& t : reader->tensors()) names.insert(t.name);
  CHECK(names == std::set<std::string>{"batch/labels", "scalar"});
  std::set<std::string> lost;
  for (const auto& l : report.lostTensors) lost.insert(l.name);
  CHECK(lost == std::set<std::string>{"weights/conv1", "batch/images"});
}

TEST_CASE("recover writes a sealed copy that verifies and never touches the input", "[formats][recovery]") {
  TempDir dir;
  Sample s = makeSample(dir);
  auto full = test::readFile(s.path);
  // Cut in the middle of batch/images: weights, labels and the note survive.
  const auto& img = *std::find_if(s.tensors.begin(), s.tensors.end(), [](auto& t) { return t.name == "batch/images"; });
  uint64_t cut = img.chunkRecords[1] + 100;
  test::writeFile(dir.file("cut.ccap"), std::vector<uint8_t>(full.begin(), full.begin() + long(cut)));
  auto before = test::readFile(dir.file("cut.ccap"));

  auto report = recoverBundle(dir.file("cut.ccap"), dir.file("fixed.ccap"));
  CHECK(test::readFile(dir.file("cut.ccap")) == before);
  CHECK(report.tensorsCopied == 2);
  auto verify = verifyBundle(dir.file("fixed.ccap"));
  CHECK(verify.ok());
  auto reader = BundleReader::open(dir.file("fixed.ccap"));
  CHECK(reader->report().sealed);
  CHECK(reader->readTensor(reader->get("weights/conv1")) == s.contents.at("weights/conv1"));
  CHECK(reader->find("batch/images") == nullptr);
  bool noted = false;
  for (const auto& n : reader->notes())
    if (n.key == "crashcap.recovery") {
      noted = true;
      CHECK_THAT(n.text, Catch::Contains("truncated at byte " + std::to_string(cut)));
      CHECK_THAT(n.text, Catch::Contains("incomplete record at byte " + std::to_string(img.chunkRecords[1])));
      CHECK_THAT(n.text, Catch::Contains("batch/images"));
    }
  CHECK(noted);
  CHECK(reader->fileHeader().recordingId == BundleReader::open(s.path)->fileHeader().recordingId);

  CHECK_THROWS_WITH(recoverBundle(dir.file("cut.ccap"), dir.file("fixed.ccap")), Catch::Contains("already exists"));
  CHECK_THROWS_WITH(recoverBundle(dir.file("cut.ccap"), dir.file("cut.ccap")), Catch::Contains("same file"));
}

TEST_CASE("an unknown record type is skipped with a notice; a required one is refused", "[formats][evolution]") {
  TempDir dir;
  auto writer = BundleWriter::create(dir.file("b.ccap"));
  float x[2] = {1, 2};
  writer->writeTensor("x", DType::Float32, {2}, x, 8);
  std::vector<uint8_t> meta(16, 0);
  meta[0] = 0;  // a valid empty Cap'n Proto message: segment table (1 segment, 1 word) + null root
  meta[4] = 1;
  writer->writeRecord(77, meta, "future", 6, false);
  writer->seal();
  for (bool scan : {false, true}) {
    auto reader = scan ? BundleReader::scan(dir.file("b.ccap")) : BundleReader::open(dir.file("b.ccap"));
    CHECK(reader->report().unknownTypes.at(77) == 1);
    CHECK(reader->get("x").totalBytes == 8);
  }
  auto v = verifyBundle(dir.file("b.ccap"));
  CHECK(v.ok());
  REQUIRE(v.notices.size() == 1);
  CHECK_THAT(v.notices[0], Catch::Contains("unknown record type 77"));

  auto w2 = BundleWriter::create(dir.file("req.ccap"));
  w2->writeRecord(78, meta, "x", 1, false, kFlagRequired);
  w2->seal();
  try {
    BundleReader::open(dir.file("req.ccap"));
    FAIL("expected IncompatibleVersion");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::IncompatibleVersion);
    CHECK_THAT(e.what(), Catch::Contains("newer crashcap"));
  }
}
