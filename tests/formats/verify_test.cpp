// verify: every checksum, and every single flipped bit found with its record and offset.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "test_support.hpp"

using namespace crashcap;
using namespace crashcap::formats;
using crashcap::test::TempDir;

TEST_CASE("verify passes a clean bundle and fails an unsealed one", "[formats][verify]") {
  TempDir dir;
  auto writer = BundleWriter::create(dir.file("b.ccap"));
  auto f = test::randomFloats(1000, 3);
  writer->writeTensor("w", DType::Float32, {1000}, f.data(), 4000);
  writer->sync();
  auto unsealed = verifyBundle(dir.file("b.ccap"));
  CHECK_FALSE(unsealed.ok());
  CHECK_THAT(unsealed.problems.at(0).what, Catch::Contains("not sealed"));
  writer->seal();
  auto v = verifyBundle(dir.file("b.ccap"));
  CHECK(v.ok());
  CHECK(v.sealed);
  CHECK(v.recordsChecked == 3);  // recording info, one chunk, the index
  CHECK(v.tensorsChecked == 1);
  CHECK(v.bytesChecked == v.fileSize);
}

TEST_CASE("verify reports a single flipped bit anywhere with the damaged structure", "[formats][verify]") {
  TempDir dir;
  WriterOptions options;
  options.chunkBytes = 4096;
  auto writer = BundleWriter::create(dir.file("b.ccap"), options);
  std::vector<float> smooth(3000);
  for (size_t i = 0; i < smooth.size(); ++i) smooth[i] = float(i % 50);
  writer->writeTensor("smooth", DType::Float32, {3000}, smooth.data(), smooth.size() * 4);
  auto noise = test::randomBytes(5000, 5);
  writer->writeTensor("noise", DType::UInt8, {5000}, noise.data(), noise.size());
  writer->writeNote("k", "v");
  writer->seal();
  auto clean = test::readFile(dir.file("b.ccap"));
  REQUIRE(verifyBundle(dir.file("b.ccap")).ok());

  std::mt19937 rng(7);
  for (size_t byte = 0; byte < clean.size(); ++byte) {
    auto bytes = clean;
    int bit = int(rng() % 8);
    bytes[byte] ^= uint8_t(1u << bit);
    test::writeFile(dir.file("flip.ccap"), bytes);
    INFO("flipped bit " << bit << " of byte " << byte << " of " << clean.size());
    auto v = verifyBundle(dir.file("flip.ccap"));
    REQUIRE_FALSE(v.ok());
    bool located = false;
    for (const auto& p : v.problems) located |= p.offset <= byte && byte < p.offset + p.length;
    if (!located)
      for (const auto& p : v.problems) UNSCOPED_INFO(p.where << " @" << p.offset << "+" << p.length << ": " << p.what);
    CHECK(located);
  }
}

TEST_CASE("long scans report progress up to the end of the file", "[formats][verify]") {
  TempDir dir;
  WriterOptions options;
  options.zstdLevel = 0;  // raw, so the file is as big as the data
  auto writer = BundleWriter::create(dir.file("big.ccap"), options);
  std::vector<uint8_t> zeros(150u << 20, 0);
  writer->writeTensor("zeros", DType::UInt8, {int64_t(zeros.size())}, zeros.data(), zeros.size());
  writer->seal();
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  auto v = verifyBundle(dir.file("big.ccap"), {}, [&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); });
  CHECK(v.ok());
  REQUIRE(calls.size() >= 2);
  for (size_t i = 1; i < calls.size(); ++i) CHECK(calls[i].first > calls[i - 1].first);
  CHECK(calls.back().first <= calls.back().second);
  CHECK(calls.back().second == v.fileSize - kFooterSize);
}
