// Round trips through BundleWriter and BundleReader.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <sstream>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "test_support.hpp"

using namespace crashcap;
using namespace crashcap::formats;
using crashcap::test::TempDir;

namespace {

std::vector<uint8_t> patternFor(DType dtype, uint64_t numel, uint64_t seed) {
  std::vector<uint8_t> bytes = test::randomBytes(numel * elementSize(dtype), seed);
  if (dtype == DType::Bool)
    for (auto& b : bytes) b &= 1;
  return bytes;
}

/// Bytes of this process's mappings the kernel leaves out of a fork (smaps VmFlags "dc").
uint64_t bytesNotForked() {
  std::ifstream smaps("/proc/self/smaps");
  uint64_t total = 0, size = 0;
  std::string line;
  while (std::getline(smaps, line)) {
    if (line.rfind("Size:", 0) == 0) size = std::stoull(line.substr(5)) * 1024;
    if (line.rfind("VmFlags:", 0) == 0 && (" " + line.substr(8) + " ").find(" dc ") != std::string::npos) total += size;
  }
  return total;
}

}  // namespace

TEST_CASE("every dtype and shape round-trips bit for bit", "[formats][roundtrip]") {
  TempDir dir;
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {1}, {7}, {3, 0, 2}, {2, 3, 5}, {1, 1, 1, 1, 1, 1, 1, 1}};
  struct Expect {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Expect> expected;
  WriterOptions options;
  options.chunkBytes = 4096;
  auto writer = BundleWriter::create(dir.file("b.ccap"), options);
  uint64_t seed = 1;
  for (int d = 0; d < kDTypeCount; ++d) {
    auto dtype = *dtypeFromNumber(unsigned(d));
    for (const auto& shape : shapes) {
      uint64_t numel = 1;
      for (auto s : shape) numel *= uint64_t(s);
      Expect e{std::string(dtypeName(dtype)) + "/" + formatShape(shape), dtype, shape, patternFor(dtype, numel, seed++)};
      writer->writeTensor(e.name, e.dtype, e.shape, e.bytes.data(), e.bytes.size());
      expected.push_back(std::move(e));
    }
    // One tensor spanning many chunks, with a partial last chunk.
    uint64_t numel = (3 * 4096 + 24) / elementSize(dtype);
    Expect e{std::string(dtypeName(dtype)) + "/multi", dtype, {int64_t(numel)}, patternFor(dtype, numel, seed++)};
    writer->writeTensor(e.name, e.dtype, e.shape, e.bytes.data(), e.bytes.size());
    expected.push_back(std::move(e));
  }
  writer->seal();

  for (bool scan : {false, true}) {
    auto reader = scan ? BundleReader::scan(dir.file("b.ccap")) : BundleReader::open(dir.file("b.ccap"));
    CHECK(reader->report().sealed == !scan);
    CHECK(reader->report().complete());
    REQUIRE(reader->tensors().size() == expected.size());
    for (const auto& e : expected) {
      INFO(e.name);
      const auto& t = reader->get(e.name);
      CHECK(t.dtype == e.dtype);
      CHECK(t.shape == e.shape);
      CHECK(reader->readTensor(t) == e.bytes);
    }
  }
}

TEST_CASE("compressible floats are shuffled and compressed, noise is stored raw", "[formats][codec]") {
  TempDir dir;
  std::vector<float> smooth(100000);
  for (size_t i = 0; i < smooth.size(); ++i) smooth[i] = float(i % 100) * 0.5f;
  auto noise = test::randomBytes(400000, 9);
  auto writer = BundleWriter::create(dir.file("b.ccap"));
  writer->writeTensor("smooth", DType::Float32, {int64_t(smooth.size())}, smooth.data(), smooth.size() * 4);
  writer->writeTensor("noise", DType::UInt8, {int64_t(noise.size())}, noise.data(), noise.size());
  writer->seal();
  auto reader = BundleReader::open(dir.file("b.ccap"));
  CHECK(reader->get("smooth").storedBytes < smooth.size() * 4 / 10);
  CHECK(reader->get("noise").storedBytes == noise.size());
  auto back = reader->readTensor(reader->get("smooth"));
  CHECK(std::memcmp(back.data(), smooth.data(), back.size()) == 0);
}

TEST_CASE("a tensor role that did not compress is stored raw until zstd is due to try it again", "[formats][codec]") {
  TempDir dir;
  auto noise = test::randomBytes(40000, 3);
  std::vector<uint8_t> zeros(40000, 0);
  WriterOptions o;
  o.rawRetryEvery = 4;
  auto writer = BundleWriter::create(dir.file("b.ccap"), o);
  // Steps 0..2 carry noise; from step 3 on the role's data compresses, and zstd finds out at its
  // next try: step 0 was tried and stored raw, steps 1..3 are not tried, step 4 is.
  for (int step = 0; step < 10; ++step) {
    const auto& data = step < 3 ? noise : zeros;
    writer->writeTensor("steps/" + std::to_string(step) + "/batch/image", DType::UInt8, {40000}, data.data(), data.size());
    writer->writeTensor("steps/" + std::to_string(step) + "/batch/mask", DType::UInt8, {40000}, zeros.data(), zeros.size());
  }
  writer->seal();
  auto reader = BundleReader::open(dir.file("b.ccap"));
  for (int step = 0; step < 10; ++step) {
    INFO("step " << step);
    auto stored = reader->get("steps/" + std::to_string(step) + "/batch/image").storedBytes;
    if (step < 4)
      CHECK(stored == 40000);
    else
      CHECK(stored < 1000);
    CHECK(reader->get("steps/" + std::to_string(step) + "/batch/mask").storedBytes < 1000);  // another role
    auto back = reader->readTensor(reader->get("steps/" + std::to_string(step) + "/batch/image"));
    CHECK(std::memcmp(back.data(), (step < 3 ? noise : zeros).data(), back.size()) == 0);
  }
}

TEST_CASE("within a tensor, a chunk that did not compress makes zstd try only every 8th chunk after it",
          "[formats][codec]") {
  TempDir dir;
  // 16 chunks of 4 KiB: noise first, zeros after. Chunk 0 is tried and stored raw; chunks 1..7
  // are not tried (raw); chunk 8 is tried, compresses, and from then on every chunk is tried.
  const uint64_t chunk = 4096;
  std::vector<uint8_t> data(16 * chunk, 0);
  auto noise = test::randomBytes(chunk, 5);
  std::memcpy(data.data(), noise.data(), chunk);
  for (unsigned threads : {0u, 2u}) {
    INFO(threads << " compression threads");
    WriterOptions o;
    o.chunkBytes = chunk;
    o.compressionThreads = threads;
    const std::string path = dir.file("p" + std::to_string(threads) + ".ccap");
    auto writer = BundleWriter::create(path, o);
    writer->writeTensor("t", DType::UInt8, {int64_t(data.size())}, data.data(), data.size());
    writer->seal();
    auto reader = BundleReader::open(path);
    const auto& t = reader->get("t");
    if (threads == 0) {
      CHECK(t.storedBytes >= 8 * chunk);  // chunks 0..7 raw
      CHECK(t.storedBytes < 9 * chunk);   // chunks 8..15 compressed
    } else {
      // Threads decide by the chunks written when they are handed one: chunks 1..3 are already
      // in flight (tried, and compressed) when chunk 0 comes back raw.
      CHECK(t.storedBytes < 16 * chunk);
    }
    auto back = reader->readTensor(t);
    CHECK(back == data);
  }
}

TEST_CASE("compression threads write the same tensors as the calling thread", "[formats][threads]") {
  TempDir dir;
  std::vector<float> data = test::randomFloats(3'000'000, 4);
  for (unsigned threads : {0u, 1u, 3u}) {
    WriterOptions options;
    options.compressionThreads = threads;
    options.chunkBytes = 1 << 20;
    std::string path = dir.file("t" + std::to_string(threads) + ".ccap");
    auto writer = BundleWriter::create(path, options);
    writer->writeTensor("w", DType::Float32, {3, 1'000'000}, data.data(), data.size() * 4);
    writer->writeTensor("w2", DType::Float32, {1'000'000}, data.data(), 4'000'000);
    writer->seal();
    auto reader = BundleReader::open(path);
    auto back = reader->readTensor(reader->get("w"));
    CHECK(std::memcmp(back.data(), data.data(), back.size()) == 0);
    CHECK(reader->get("w").chunkRecords.size() == 12);
  }
}

TEST_CASE("writers that take turns with one fork-private encode memory write what writers of their own do",
          "[formats][codec]") {
  TempDir dir;
  std::vector<float> smooth(300000);
  for (size_t i = 0; i < smooth.size(); ++i) smooth[i] = float(i % 100) * 0.25f;
  auto noise = test::randomBytes(500000, 11);
  auto write = [&](const std::string& path, const std::shared_ptr<EncodeMemory>& memory, unsigned threads) {
    WriterOptions options;
    options.encodeMemory = memory;
    options.compressionThreads = threads;
    options.chunkBytes = 256 << 10;
    auto writer = BundleWriter::create(path, options);
    writer->writeTensor("smooth", DType::Float32, {int64_t(smooth.size())}, smooth.data(), smooth.size() * 4);
    writer->writeTensor("noise", DType::UInt8, {int64_t(noise.size())}, noise.data(), noise.size());
    writer->writeNote("k", std::string(60000, 'x'));
    writer->seal();
  };
  const uint64_t before = bytesNotForked();
  auto memory = EncodeMemory::create(true);
  // Two writers open at once, writing in turns, as the recorder's run file and segment do.
  WriterOptions shared;
  shared.encodeMemory = memory;
  auto first = BundleWriter::create(dir.file("a.ccap"), shared);
  auto second = BundleWriter::create(dir.file("b.ccap"), shared);
  first->writeTensor("smooth", DType::Float32, {int64_t(smooth.size())}, smooth.data(), smooth.size() * 4);
  second->writeTensor("noise", DType::UInt8, {int64_t(noise.size())}, noise.data(), noise.size());
  first->writeTensor("noise", DType::UInt8, {int64_t(noise.size())}, noise.data(), noise.size());
  second->writeTensor("smooth", DType::Float32, {int64_t(smooth.size())}, smooth.data(), smooth.size() * 4);
  first->seal();
  second->seal();
  // Its blocks (the zstd workspace, the shuffled and compressed chunk) stay out of forks.
  CHECK(bytesNotForked() >= before + 2 * smooth.size() * 4);
  write(dir.file("threads.ccap"), memory, 2);
  write(dir.file("own.ccap"), nullptr, 0);
  for (const char* name : {"a.ccap", "b.ccap", "threads.ccap", "own.ccap"}) {
    INFO(name);
    auto reader = BundleReader::open(dir.file(name));
    CHECK(reader->get("smooth").storedBytes < smooth.size() * 4 / 4);
    CHECK(reader->get("noise").storedBytes == noise.size());
    auto back = reader->readTensor(reader->get("smooth"));
    CHECK(std::memcmp(back.data(), smooth.data(), back.size()) == 0);
    back = reader->readTensor(reader->get("noise"));
    CHECK(std::memcmp(back.data(), noise.data(), back.size()) == 0);
  }
  const uint64_t withMemory = bytesNotForked();
  memory.reset();
  shared.encodeMemory.reset();
  CHECK(bytesNotForked() == withMemory);  // the writers still hold it
  first.reset();
  second.reset();
  CHECK(bytesNotForked() < withMemory);  // released with the last writer
}

TEST_CASE("notes and recording info survive a round trip", "[formats][roundtrip]") {
  TempDir dir;
  WriterOptions options;
  options.producer = "bundle_test";
  auto writer = BundleWriter::create(dir.file("b.ccap"), options);
  writer->writeNote("user.comment", "loss went NaN at step 1033");
  writer->seal();
  auto reader = BundleReader::open(dir.file("b.ccap"));
  REQUIRE(reader->recordingInfo());
  CHECK(reader->recordingInfo()->producer == "bundle_test");
  CHECK(reader->recordingInfo()->toolVersion == toolVersion());
  REQUIRE(reader->notes().size() == 1);
  CHECK(reader->notes()[0].text == "loss went NaN at step 1033");
  CHECK(reader->fileHeader().recordingId == writer->fileHeader().recordingId);
}

TEST_CASE("the writer refuses bad names, sizes, duplicates and existing files", "[formats][errors]") {
  TempDir dir;
  auto writer = BundleWriter::create(dir.file("b.ccap"));
  float x[4] = {};
  CHECK_THROWS_WITH(writer->writeTensor("", DType::Float32, {4}, x, 16), Catch::Contains("empty"));
  CHECK_THROWS_WITH(writer->writeTensor("a\nb", DType::Float32, {4}, x, 16), Catch::Contains("control character"));
  CHECK_THROWS_WITH(writer->writeTensor("a", DType::Float32, {5}, x, 16), Catch::Contains("needs 20 bytes, got 16"));
  CHECK_THROWS_WITH(writer->writeTensor("a", DType::Float32, {-1}, x, 16), Catch::Contains("negative"));
  writer->writeTensor("a", DType::Float32, {4}, x, 16);
  CHECK_THROWS_WITH(writer->writeTensor("a", DType::Float32, {4}, x, 16), Catch::Contains("already written"));
  writer->seal();
  CHECK_THROWS_WITH(writer->writeTensor("b", DType::Float32, {4}, x, 16), Catch::Contains("already sealed"));
  try {
    BundleWriter::create(dir.file("b.ccap"));
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("already exists"));
  }
  try {
    BundleWriter::create(dir.file("no/such/dir/b.ccap"));
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Io);
    CHECK_THAT(e.what(), Catch::Contains("no/such/dir/b.ccap"));
  }
}

TEST_CASE("a missing tensor name is reported with close matches", "[formats][errors]") {
  TempDir dir;
  auto writer = BundleWriter::create(dir.file("b.ccap"));
  float x[2] = {1, 2};
  writer->writeTensor("batch/images", DType::Float32, {2}, x, 8);
  writer->seal();
  auto reader = BundleReader::open(dir.file("b.ccap"));
  try {
    reader->get("images");
    FAIL("expected NotFound");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::NotFound);
    CHECK_THAT(e.what(), Catch::Contains("did you mean batch/images"));
  }
}

TEST_CASE("files that are not bundles are refused with the bytes found", "[formats][errors]") {
  TempDir dir;
  test::writeText(dir.file("text.txt"), "hello, this is not a bundle at all; it is long enough for a header......");
  test::writeText(dir.file("empty"), "");
  try {
    BundleReader::open(dir.file("text.txt"));
    FAIL("expected NotABundle");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::NotABundle);
    CHECK_THAT(e.what(), Catch::Contains("expected magic bytes 89 43 43 41 50") && Catch::Contains("found 68 65 6c"));
  }
  try {
    BundleReader::open(dir.file("empty"));
    FAIL("expected NotABundle");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::NotABundle);
  }
  try {
    BundleReader::open(dir.file("missing.ccap"));
    FAIL("expected NotFound");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::NotFound);
  }
}

TEST_CASE("a bundle from a newer format major is refused as incompatible", "[formats][errors]") {
  TempDir dir;
  auto writer = BundleWriter::create(dir.file("b.ccap"));
  writer->seal();
  auto bytes = test::readFile(dir.file("b.ccap"));
  FileHeader h = decodeFileHeader(bytes.data());
  h.formatMajor = 2;
  encodeFileHeader(h, bytes.data());
  test::writeFile(dir.file("b.ccap"), bytes);
  try {
    BundleReader::open(dir.file("b.ccap"));
    FAIL("expected IncompatibleVersion");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::IncompatibleVersion);
    CHECK_THAT(e.what(), Catch::Contains("format 2.0") && Catch::Contains("upgrade"));
  }
}

TEST_CASE("a bundle held in memory opens, scans, verifies and copies as the same file does", "[formats][memory]") {
  TempDir dir;
  WriterOptions options;
  options.chunkBytes = 4096;
  auto w = BundleWriter::create(dir.file("b.ccap"), options);
  auto floats = test::randomFloats(3000, 7);
  w->writeTensor("w", DType::Float32, {3000}, floats.data(), floats.size() * 4);
  w->writeNote("user.comment", "in memory");
  w->seal();
  w.reset();
  auto bytes = test::readFile(dir.file("b.ccap"));

  for (bool scan : {false, true}) {
    INFO((scan ? "scanned" : "opened through the index"));
    auto fromFile = scan ? BundleReader::scan(dir.file("b.ccap")) : BundleReader::open(dir.file("b.ccap"));
    auto fromMemory = scan ? BundleReader::scanBytes(bytes, "held.ccap") : BundleReader::openBytes(bytes, "held.ccap");
    CHECK(fromMemory->path() == "held.ccap");
    CHECK(fromMemory->report().summary() == fromFile->report().summary());
    CHECK(fromMemory->records().size() == fromFile->records().size());
    REQUIRE(fromMemory->notes().size() == 1);
    CHECK(fromMemory->notes()[0].text == "in memory");
    CHECK(fromMemory->readTensor(fromMemory->get("w")) == fromFile->readTensor(fromFile->get("w")));
  }
  CHECK(verifyBundleBytes(bytes, "held.ccap").ok());

  // Damage reads the same, and messages name the bundle by the name it was given.
  auto damaged = bytes;
  damaged[damaged.size() / 2] ^= 0x04;
  auto onDisk = dir.file("damaged.ccap");
  test::writeFile(onDisk, damaged);
  auto fileReport = verifyBundle(onDisk), memoryReport = verifyBundleBytes(damaged, "held.ccap");
  REQUIRE(memoryReport.problems.size() == fileReport.problems.size());
  REQUIRE(!memoryReport.ok());
  CHECK(memoryReport.problems[0].what == fileReport.problems[0].what);
  try {
    BundleReader::openBytes({'n', 'o', 't', ' ', 'a', ' ', 'b', 'u', 'n', 'd', 'l', 'e'}, "held.txt");
    FAIL("bytes that are no bundle were opened");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::NotABundle);
    CHECK_THAT(e.what(), Catch::Contains("while opening held.txt"));
  }
  CHECK_THROWS_WITH(BundleReader::openBytes({}, "nothing.ccap"), Catch::Contains("nothing.ccap is empty"));

  // copyRecords reads through the reader, so a bundle in memory copies to a file.
  auto source = BundleReader::scanBytes(bytes, "held.ccap");
  auto copy = BundleWriter::create(dir.file("copy.ccap"));
  auto copied = copyRecords(*source, *copy);
  copy->seal();
  copy.reset();
  CHECK(copied.tensorsCopied == 1);
  CHECK(verifyBundle(dir.file("copy.ccap")).ok());
  auto back = BundleReader::open(dir.file("copy.ccap"));
  CHECK(back->readTensor(back->get("w")) == source->readTensor(source->get("w")));
}
