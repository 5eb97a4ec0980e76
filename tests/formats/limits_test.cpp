// Untrusted input and hostile environments: lengths that pass their checksums but lie,
// limits that must hold, and writes that fail half-way.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "test_support.hpp"

using namespace crashcap;
using namespace crashcap::formats;
using crashcap::test::TempDir;

namespace {

/// A file header followed by one record header with the given lengths and valid checksums
/// (anyone can compute XXH3), then `tail` bytes of zeros.
std::vector<uint8_t> craftedRecord(uint32_t meta, uint64_t body, uint64_t raw, size_t tail) {
  std::vector<uint8_t> b(kFileHeaderSize + kRecordHeaderSize + tail, 0);
  FileHeader fh;
  encodeFileHeader(fh, b.data());
  RecordHeader h;
  h.type = static_cast<uint16_t>(RecordType::TensorChunk);
  h.metaLength = meta;
  h.bodyLength = body;
  h.rawLength = raw;
  encodeRecordHeader(h, b.data() + kFileHeaderSize);
  putU64(b.data() + kFileHeaderSize + 56, hash64(b.data() + kFileHeaderSize, 56));
  return b;
}

}  // namespace

TEST_CASE("record lengths that would wrap 64-bit offsets are rejected, not looped on", "[formats][limits]") {
  TempDir dir;
  for (uint64_t body : {UINT64_MAX - 64 - 8, UINT64_MAX, uint64_t(1) << 63, (uint64_t(1) << 48) + 1}) {
    INFO("body length " << body);
    auto bytes = craftedRecord(8, body, body, 64);
    test::writeFile(dir.file("evil.ccap"), bytes);
    auto reader = BundleReader::open(dir.file("evil.ccap"));  // must return: no hang, no huge allocation
    CHECK(reader->records().empty());
    CHECK_FALSE(reader->report().complete());
    auto v = verifyBundle(dir.file("evil.ccap"));
    CHECK_FALSE(v.ok());
  }
}

TEST_CASE("a record beyond the reader's limits is reported, never allocated", "[formats][limits]") {
  TempDir dir;
  // Genuine header (valid checksum) claiming a 1 TiB body in a tiny file: truncation, no allocation.
  test::writeFile(dir.file("claim.ccap"), craftedRecord(8, 1ull << 40, 1ull << 40, 100));
  auto reader = BundleReader::open(dir.file("claim.ccap"));
  CHECK(reader->records().empty());
  REQUIRE(reader->report().damage.size() == 1);
  CHECK_THAT(reader->report().damage[0].what, Catch::Contains("exceeds the reader's limits"));

  // A real bundle read with limits below its chunk size.
  std::vector<float> data = test::randomFloats(300'000, 1);
  auto w = BundleWriter::create(dir.file("real.ccap"));
  w->writeTensor("w", DType::Float32, {300'000}, data.data(), data.size() * 4);
  w->seal();
  ReaderLimits small;
  small.maxChunkBytes = 100'000;
  auto indexed = BundleReader::open(dir.file("real.ccap"), small);
  try {
    indexed->readTensor(indexed->get("w"));
    FAIL("expected LimitExceeded");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::LimitExceeded);
    CHECK_THAT(e.what(), Catch::Contains("the limits are"));
  }
  auto scanned = BundleReader::scan(dir.file("real.ccap"), small);
  CHECK(scanned->find("w") == nullptr);
  REQUIRE_FALSE(scanned->report().damage.empty());
  CHECK_THAT(scanned->report().damage[0].what, Catch::Contains("exceeds the reader's limits"));

  ReaderLimits tiny;
  tiny.maxTensorBytes = 1000;
  auto r = BundleReader::open(dir.file("real.ccap"), tiny);
  try {
    r->readTensor(r->get("w"));
    FAIL("expected LimitExceeded");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::LimitExceeded);
    CHECK_THAT(e.what(), Catch::Contains("1200000 bytes") && Catch::Contains("--max-tensor-bytes"));
  }
}

TEST_CASE("a damaged note in a sealed bundle is reported, and the rest still reads", "[formats][limits]") {
  TempDir dir;
  auto w = BundleWriter::create(dir.file("b.ccap"));
  float x[3] = {1, 2, 3};
  w->writeTensor("x", DType::Float32, {3}, x, sizeof x);
  w->writeNote("user.note", "hello");
  w->seal();
  auto reader = BundleReader::open(dir.file("b.ccap"));
  uint64_t noteAt = 0;
  for (const auto& r : reader->records())
    if (r.type == static_cast<uint16_t>(RecordType::Note)) noteAt = r.offset;
  REQUIRE(noteAt);
  auto bytes = test::readFile(dir.file("b.ccap"));
  bytes[noteAt + kRecordHeaderSize + 12] ^= 0x20;  // inside the note's meta
  test::writeFile(dir.file("b.ccap"), bytes);

  auto damaged = BundleReader::open(dir.file("b.ccap"));
  CHECK(damaged->notes().empty());
  CHECK_FALSE(damaged->report().complete());
  REQUIRE(damaged->report().damage.size() == 1);
  CHECK_THAT(damaged->report().damage[0].what, Catch::Contains("meta checksum mismatch"));
  CHECK(damaged->readTensor(damaged->get("x")).size() == sizeof x);
}

TEST_CASE("the writer refuses metas and notes readers would reject", "[formats][limits]") {
  TempDir dir;
  auto w = BundleWriter::create(dir.file("b.ccap"));
  CHECK_THROWS_WITH(w->writeNote("k", std::string(kMaxNoteTextBytes + 1, 'a')), Catch::Contains("at most"));
  std::vector<uint8_t> meta(kMaxMetaBytes + 8, 0);
  CHECK_THROWS_WITH(w->writeRecord(40, meta, nullptr, 0, false), Catch::Contains("readers accept at most"));
  w->writeNote("k", std::string(kMaxNoteTextBytes, 'a'));
  w->seal();
  CHECK(verifyBundle(dir.file("b.ccap")).ok());
}

TEST_CASE("a write that fails half-way (file size limit) throws Io and leaves a recoverable file",
          "[formats][limits]") {
  TempDir dir;
  // In a child: RLIMIT_FSIZE applies to the whole process, and compression threads must be
  // waited for before the failing call unwinds (the bodies they encode into are freed then).
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    rlimit lim{3u << 20, 3u << 20};
    setrlimit(RLIMIT_FSIZE, &lim);
    int code = 10;
    try {
      WriterOptions o;
      o.compressionThreads = 3;
      o.chunkBytes = 256 << 10;
      o.zstdLevel = 1;
      auto w = BundleWriter::create(dir.file("b.ccap"), o);
      auto noise = test::randomBytes(2u << 20, 1);
      w->writeTensor("first", DType::UInt8, {int64_t(noise.size())}, noise.data(), noise.size());
      auto more = test::randomBytes(8u << 20, 2);
      w->writeTensor("second", DType::UInt8, {int64_t(more.size())}, more.data(), more.size());
      code = 11;  // the limit did not bite
    } catch (const Error& e) {
      code = (e.code() == ErrorCode::Io && std::string(e.what()).find("ulimit -f") != std::string::npos) ? 0 : 12;
    }
    _exit(code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  auto reader = BundleReader::open(dir.file("b.ccap"));
  CHECK(reader->find("first") != nullptr);
  CHECK(reader->find("second") == nullptr);
  REQUIRE(reader->report().lostTensors.size() == 1);
  CHECK(reader->report().lostTensors[0].name == "second");
}

TEST_CASE("tensor names must be valid UTF-8", "[formats][limits]") {
  TempDir dir;
  auto w = BundleWriter::create(dir.file("b.ccap"));
  float x = 1;
  w->writeTensor("gewichte/größe/λ", DType::Float32, {}, &x, 4);
  for (std::string bad : {std::string("\xff"), std::string("a\xc3"), std::string("\xed\xa0\x80"),
                          std::string("\xc0\xaf"), std::string("\xf4\x90\x80\x80")}) {
    INFO("name bytes " << bad.size());
    CHECK_THROWS_WITH(w->writeTensor(bad, DType::Float32, {}, &x, 4), Catch::Contains("not valid UTF-8"));
  }
}
