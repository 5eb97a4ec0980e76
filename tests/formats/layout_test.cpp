// The fixed binary structures: encode/decode and their checks.
#include <catch2/catch.hpp>

#include <cstring>

#include "crashcap/formats/error.hpp"
#include "crashcap/formats/layout.hpp"

using namespace crashcap;
using namespace crashcap::formats;

TEST_CASE("record headers round-trip and any flipped bit is detected", "[formats][layout]") {
  RecordHeader h;
  h.type = 2;
  h.flags = 1;
  h.sequence = 77;
  h.metaLength = 128;
  h.bodyLength = 1000;
  h.rawLength = 4096;
  h.metaHash = 0x1234;
  h.bodyHash = 0x5678;
  uint8_t buf[kRecordHeaderSize];
  encodeRecordHeader(h, buf);
  auto back = decodeRecordHeader(buf);
  REQUIRE(back.header);
  CHECK(back.header->sequence == 77);
  CHECK(back.header->rawLength == 4096);
  CHECK(back.header->codec() == Codec::Zstd);
  for (size_t bit = 0; bit < kRecordHeaderSize * 8; ++bit) {
    uint8_t copy[kRecordHeaderSize];
    std::memcpy(copy, buf, sizeof copy);
    copy[bit / 8] ^= uint8_t(1u << (bit % 8));
    INFO("bit " << bit);
    CHECK_FALSE(decodeRecordHeader(copy).header);
  }
}

TEST_CASE("file header and footer reject damage with a message naming what failed", "[formats][layout]") {
  FileHeader h;
  h.createdNs = 42;
  uint8_t buf[kFileHeaderSize];
  encodeFileHeader(h, buf);
  CHECK(decodeFileHeader(buf).createdNs == 42);
  buf[20] ^= 4;
  CHECK_THROWS_WITH(decodeFileHeader(buf), Catch::Contains("file header checksum mismatch"));
  buf[20] ^= 4;
  buf[0] = 'X';
  try {
    decodeFileHeader(buf);
    FAIL();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::NotABundle);
  }

  Footer f;
  f.indexOffset = 999;
  f.recordCount = 3;
  uint8_t foot[kFooterSize];
  encodeFooter(f, foot);
  REQUIRE(decodeFooter(foot).footer);
  CHECK(decodeFooter(foot).footer->indexOffset == 999);
  for (size_t bit = 0; bit < kFooterSize * 8; ++bit) {
    uint8_t copy[kFooterSize];
    std::memcpy(copy, foot, sizeof copy);
    copy[bit / 8] ^= uint8_t(1u << (bit % 8));
    INFO("bit " << bit);
    CHECK_FALSE(decodeFooter(copy).footer);
  }
}
