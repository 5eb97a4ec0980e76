// Tests of the at::Tensor <-> bundle bridge: every dtype and shape bit-exactly, chunked
// tensors, NaN payloads, non-contiguous inputs and the refusals.

#include "crashcap/formats/torch/tensor_bridge.hpp"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "crashcap/formats/error.hpp"
#include "test_support.hpp"

namespace ft = crashcap::formats::torch;
using crashcap::Error;
using crashcap::ErrorCode;
using crashcap::formats::BundleReader;
using crashcap::formats::BundleWriter;
using crashcap::formats::DType;
using crashcap::formats::WriterOptions;
using crashcap::test::TempDir;

namespace {

std::vector<DType> allDTypes() {
  std::vector<DType> all;
  for (int i = 0; i < crashcap::formats::kDTypeCount; ++i) all.push_back(*crashcap::formats::dtypeFromNumber(i));
  return all;
}

// The bytes of `t`'s values in row-major order (resolving strides and the conjugate bit).
std::vector<uint8_t> valueBytes(const at::Tensor& t) {
  at::Tensor c = t.resolve_conj().resolve_neg().contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

std::string describe(const at::Tensor& t) {
  std::ostringstream s;
  s << t.scalar_type() << " " << t.sizes();
  return s.str();
}

// Same dtype, same shape, same bytes: NaNs compare equal here when their bits do.
void requireSameBits(const at::Tensor& actual, const at::Tensor& expected) {
  INFO("expected " << describe(expected) << ", got " << describe(actual));
  REQUIRE(actual.scalar_type() == expected.scalar_type());
  REQUIRE(actual.sizes() == expected.sizes());
  REQUIRE(actual.device().is_cpu());
  REQUIRE(actual.is_contiguous());
  REQUIRE(valueBytes(actual) == valueBytes(expected));
}

// A CPU tensor filled with pseudo-random bits (NaNs and infinities included for floats);
// bools get 0 or 1, the only values a bool may hold.
at::Tensor randomBits(DType dtype, const std::vector<int64_t>& shape, uint64_t seed) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(ft::toScalarType(dtype)));
  auto bytes = crashcap::test::randomBytes(t.nbytes(), seed);
  if (dtype == DType::Bool)
    for (auto& b : bytes) b &= 1;
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

// Writes `tensors` into a fresh bundle, seals it, and reads every one back by name.
std::vector<at::Tensor> roundTrip(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                  const WriterOptions& options = {}) {
  TempDir dir;
  std::string path = dir.file("t.bundle");
  {
    auto writer = BundleWriter::create(path, options);
    for (const auto& [name, t] : tensors) ft::writeTensor(*writer, name, t);
    writer->seal();
  }
  auto reader = BundleReader::open(path);
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : tensors) out.push_back(ft::readTensor(*reader, name));
  return out;
}

at::Tensor roundTripOne(const at::Tensor& t, const WriterOptions& options = {}) { return roundTrip({{"t", t}}, options)[0]; }

template <typename Bits, typename Float>
Float fromBits(Bits bits) {
  static_assert(sizeof(Bits) == sizeof(Float));
  Float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

TEST_CASE("toDType and toScalarType map every bundle dtype both ways", "[formats_torch][dtype]") {
  for (DType d : allDTypes()) {
    INFO(crashcap::formats::dtypeName(d));
    c10::ScalarType s = ft::toScalarType(d);
    REQUIRE(ft::toDType(s) == d);
    REQUIRE(c10::elementSize(s) == crashcap::formats::elementSize(d));
  }
  // The names differ where it is easy to slip: int8 is Char, uint8 is Byte.
  REQUIRE(ft::toScalarType(DType::Int8) == c10::ScalarType::Char);
  REQUIRE(ft::toScalarType(DType::UInt8) == c10::ScalarType::Byte);
  REQUIRE(ft::toScalarType(DType::Complex64) == c10::ScalarType::ComplexFloat);
}

TEST_CASE("toDType refuses the scalar types a bundle does not hold", "[formats_torch][dtype]") {
  for (auto s : {c10::ScalarType::ComplexHalf, c10::ScalarType::QInt8, c10::ScalarType::QUInt8, c10::ScalarType::QInt32,
                 c10::ScalarType::QUInt4x2, c10::ScalarType::Undefined}) {
    INFO(c10::toString(s));
    REQUIRE_FALSE(ft::toDType(s).has_value());
  }
}

TEST_CASE("every dtype round-trips bit-exactly in every shape", "[formats_torch][roundtrip]") {
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {3, 0, 2}, {1}, {7}, {2, 3, 4}, {1, 1, 1, 1, 5}};
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  uint64_t seed = 1;
  for (DType d : allDTypes())
    for (const auto& shape : shapes)
      tensors.emplace_back(std::string(crashcap::formats::dtypeName(d)) + "/" + crashcap::formats::formatShape(shape),
                           randomBits(d, shape, seed++));

  auto back = roundTrip(tensors);
  REQUIRE(back.size() == tensors.size());
  for (size_t i = 0; i < back.size(); ++i) {
    INFO(tensors[i].first);
    requireSameBits(back[i], tensors[i].second);
  }
}

TEST_CASE("readTensor by TensorInfo and by name return the same tensor", "[formats_torch][roundtrip]") {
  TempDir dir;
  at::Tensor t = at::arange(24, at::kLong).reshape({2, 3, 4});
  {
    auto writer = BundleWriter::create(dir.file("b.bundle"));
    uint64_t id = ft::writeTensor(*writer, "layer/w", t);
    REQUIRE(id > 0);
    writer->seal();
  }
  auto reader = BundleReader::open(dir.file("b.bundle"));
  const auto& info = reader->get("layer/w");
  REQUIRE(info.dtype == DType::Int64);
  REQUIRE(info.shape == std::vector<int64_t>{2, 3, 4});
  REQUIRE(info.totalBytes == 24 * 8);
  requireSameBits(ft::readTensor(*reader, info), t);
  requireSameBits(ft::readTensor(*reader, "layer/w"), t);
}

TEST_CASE("tensors spanning many chunks round-trip bit-exactly", "[formats_torch][chunks]") {
  WriterOptions options;
  options.chunkBytes = 4096;
  auto zstdLevel = GENERATE(0, 1);
  options.zstdLevel = zstdLevel;
  INFO("zstdLevel " << zstdLevel);

  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      // 10 000 floats: ~9.8 chunks of 4 KiB.
      {"f32", at::randn({100, 100}, at::kFloat)},
      // A length that is not a multiple of the chunk size.
      {"u8", randomBits(DType::UInt8, {3 * 4096 + 7}, 11)},
      // 16-byte elements across chunk boundaries.
      {"c128", randomBits(DType::Complex128, {1000}, 12)},
      {"bf16", randomBits(DType::BFloat16, {5000}, 13)},
      {"bool", randomBits(DType::Bool, {20000}, 14)},
  };
  TempDir dir;
  std::string path = dir.file("chunks.bundle");
  {
    auto writer = BundleWriter::create(path, options);
    for (const auto& [name, t] : tensors) ft::writeTensor(*writer, name, t);
    writer->seal();
  }
  auto reader = BundleReader::open(path);
  for (const auto& [name, t] : tensors) {
    INFO(name);
    const auto& info = reader->get(name);
    REQUIRE(info.chunkRecords.size() >= (t.nbytes() + 4095) / 4096);
    requireSameBits(ft::readTensor(*reader, info), t);
  }
}

TEST_CASE("NaNs with payloads, infinities, signed zeros and subnormals survive bit-exactly", "[formats_torch][nan]") {
  const std::vector<uint32_t> f32 = {0x7fc00000u, 0xffc00000u, 0x7f800001u /* signaling */, 0x7fa5a5a5u,
                                     0x7f800000u, 0xff800000u, 0x80000000u, 0x00000001u, 0x3f800000u, 0xbf800000u};
  const std::vector<uint64_t> f64 = {0x7ff8000000000000ull, 0xfff8000000000000ull, 0x7ff0000000000001ull,
                                     0x7ff8deadbeef0001ull, 0x7ff0000000000000ull, 0xfff0000000000000ull,
                                     0x8000000000000000ull, 0x0000000000000001ull};
  const std::vector<uint16_t> f16 = {0x7e00, 0xfe00, 0x7c01, 0x7d55, 0x7c00, 0xfc00, 0x8000, 0x0001};
  const std::vector<uint16_t> bf16 = {0x7fc0, 0xffc0, 0x7f81, 0x7fa5, 0x7f80, 0xff80, 0x8000, 0x0001};

  auto fromWords = [](const void* words, size_t bytes, c10::ScalarType s) {
    at::Tensor t = at::empty({int64_t(bytes / c10::elementSize(s))}, at::TensorOptions().dtype(s));
    std::memcpy(t.data_ptr(), words, bytes);
    return t;
  };
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"f32", fromWords(f32.data(), f32.size() * 4, at::kFloat)},
      {"f64", fromWords(f64.data(), f64.size() * 8, at::kDouble)},
      {"f16", fromWords(f16.data(), f16.size() * 2, at::kHalf)},
      {"bf16", fromWords(bf16.data(), bf16.size() * 2, at::kBFloat16)},
      // Complex parts are floats: pairs of the float32 patterns (the last one dropped).
      {"c64", fromWords(f32.data(), 8 * 4, at::kComplexFloat)},
      {"c128", fromWords(f64.data(), 8 * 8, at::kComplexDouble)},
  };
  // at::equal says false for NaNs; make sure the test really holds some.
  REQUIRE(tensors[0].second.isnan().any().item<bool>());
  REQUIRE(std::isnan(fromBits<uint32_t, float>(0x7f800001u)));

  auto back = roundTrip(tensors);
  for (size_t i = 0; i < back.size(); ++i) {
    INFO(tensors[i].first);
    requireSameBits(back[i], tensors[i].second);
  }

  SECTION("also when the input is non-contiguous and must be copied first") {
    std::vector<std::pair<std::string, at::Tensor>> strided;
    for (const auto& [name, t] : tensors) strided.emplace_back(name, t.flip({0}).reshape({2, -1}).t());
    for (const auto& [name, t] : strided) REQUIRE_FALSE(t.is_contiguous());
    auto stridedBack = roundTrip(strided);
    for (size_t i = 0; i < stridedBack.size(); ++i) {
      INFO(strided[i].first);
      requireSameBits(stridedBack[i], strided[i].second);
    }
  }
}

TEST_CASE("non-contiguous tensors are written as their values in row-major order", "[formats_torch][strided]") {
  at::Tensor base = at::arange(60, at::kFloat).reshape({3, 4, 5});
  at::Tensor c = at::complex(at::arange(6, at::kFloat), at::arange(6, at::kFloat) + 10).reshape({2, 3});
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"transposed", base[0].t()},
      {"permuted", base.permute({2, 0, 1})},
      {"step", at::arange(100, at::kInt).slice(0, 3, 90, 7)},
      {"offset", base.narrow(1, 1, 2)},
      {"expanded", at::arange(4, at::kDouble).reshape({4, 1}).expand({4, 6})},
      {"broadcast_scalar", at::scalar_tensor(2.5, at::kHalf).expand({3, 3})},
      {"conj_view", c.conj()},
      {"conj_transposed", c.t().conj()},
      {"bool_step", (at::arange(20, at::kInt) % 3 == 0).slice(0, 0, 20, 2)},
      {"bf16_transposed", at::arange(12, at::kFloat).to(at::kBFloat16).reshape({3, 4}).t()},
  };
  REQUIRE(c.conj().is_conj());

  auto back = roundTrip(tensors);
  for (size_t i = 0; i < back.size(); ++i) {
    const auto& [name, t] = tensors[i];
    INFO(name);
    requireSameBits(back[i], t);
    REQUIRE(at::equal(back[i], t.resolve_conj().contiguous()));
  }
  // The conjugate really was applied, not just the raw storage copied.
  REQUIRE(at::imag(back[6]).select(1, 0).select(0, 0).item<float>() == -10.f);
}

TEST_CASE("a tensor that requires grad is written without touching autograd", "[formats_torch][strided]") {
  at::Tensor w = at::randn({8, 3}).set_requires_grad(true);
  at::Tensor back = roundTripOne(w.t());
  REQUIRE_FALSE(back.requires_grad());
  requireSameBits(back, w.detach().t());
}

TEST_CASE("writeTensor refuses dtypes a bundle does not hold, naming the dtype", "[formats_torch][errors]") {
  TempDir dir;
  auto writer = BundleWriter::create(dir.file("b.bundle"));
  std::vector<std::pair<at::Tensor, std::string>> refused = {
      {at::zeros({2}, at::TensorOptions().dtype(c10::ScalarType::ComplexHalf)), "ComplexHalf"},
      {at::quantize_per_tensor(at::ones({4}), 0.1, 0, at::kQInt8), "QInt8"},
      {at::quantize_per_tensor(at::ones({4}), 0.1, 3, at::kQUInt8), "QUInt8"},
  };
  for (const auto& [t, dtypeName] : refused) {
    INFO(dtypeName);
    try {
      ft::writeTensor(*writer, "q", t);
      FAIL("writeTensor accepted a " << dtypeName << " tensor");
    } catch (const Error& e) {
      REQUIRE(e.code() == ErrorCode::Unsupported);
      REQUIRE_THAT(e.message(), Catch::Contains(dtypeName) && Catch::Contains("'q'"));
      REQUIRE_THAT(e.hint(), Catch::Contains("bfloat16"));
    }
  }
  // Refusals leave the writer usable and the bundle without the tensor.
  ft::writeTensor(*writer, "ok", at::ones({2}));
  writer->seal();
  auto reader = BundleReader::open(dir.file("b.bundle"));
  REQUIRE(reader->find("q") == nullptr);
  REQUIRE(reader->tensors().size() == 1);
}

TEST_CASE("writeTensor refuses sparse and undefined tensors", "[formats_torch][errors]") {
  TempDir dir;
  auto writer = BundleWriter::create(dir.file("b.bundle"));
  try {
    ft::writeTensor(*writer, "sparse", at::eye(3).to_sparse());
    FAIL("writeTensor accepted a sparse tensor");
  } catch (const Error& e) {
    REQUIRE(e.code() == ErrorCode::Unsupported);
    REQUIRE_THAT(e.message(), Catch::Contains("'sparse'") && Catch::Contains("Sparse"));
  }
  try {
    ft::writeTensor(*writer, "undef", at::Tensor());
    FAIL("writeTensor accepted an undefined tensor");
  } catch (const Error& e) {
    REQUIRE(e.code() == ErrorCode::InvalidArgument);
    REQUIRE_THAT(e.message(), Catch::Contains("'undef'"));
  }
}

TEST_CASE("writeTensor turns a failed device-to-host copy into Unsupported", "[formats_torch][errors]") {
  // The meta device has shapes but no data, so the copy to the host fails: this drives the
  // device path of writeTensor on a machine without a GPU.
  TempDir dir;
  auto writer = BundleWriter::create(dir.file("b.bundle"));
  at::Tensor meta = at::empty({4, 4}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
  try {
    ft::writeTensor(*writer, "m", meta);
    FAIL("writeTensor accepted a meta tensor");
  } catch (const Error& e) {
    REQUIRE(e.code() == ErrorCode::Unsupported);
    REQUIRE_THAT(e.message(), Catch::Contains("'m'") && Catch::Contains("meta") && Catch::Contains("[4, 4]"));
  }
}

TEST_CASE("device tensors are copied to the host before writing", "[formats_torch][cuda]") {
  if (!at::hasCUDA()) {
    WARN("skipped: this LibTorch has no CUDA device");
    return;
  }
  at::Tensor host = randomBits(DType::Float32, {33, 17}, 5);
  at::Tensor back = roundTripOne(host.to(at::kCUDA).t());
  requireSameBits(back, host.t());
}

TEST_CASE("readTensor by a missing name throws NotFound", "[formats_torch][errors]") {
  TempDir dir;
  {
    auto writer = BundleWriter::create(dir.file("b.bundle"));
    ft::writeTensor(*writer, "present", at::ones({1}));
    writer->seal();
  }
  auto reader = BundleReader::open(dir.file("b.bundle"));
  try {
    ft::readTensor(*reader, "absent");
    FAIL("readTensor found a tensor that was never written");
  } catch (const Error& e) {
    REQUIRE(e.code() == ErrorCode::NotFound);
    REQUIRE_THAT(e.message(), Catch::Contains("absent"));
  }
}

TEST_CASE("tensorFromBytes copies the bytes instead of aliasing them", "[formats_torch][bytes]") {
  std::vector<float> values = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  at::Tensor t = ft::tensorFromBytes(DType::Float32, {2, 3}, values.data(), values.size() * sizeof(float));
  REQUIRE(t.data_ptr() != static_cast<void*>(values.data()));
  values[0] = 100.f;
  REQUIRE(t.scalar_type() == at::kFloat);
  REQUIRE(t.sizes() == at::IntArrayRef({2, 3}));
  REQUIRE(at::equal(t, at::arange(1, 7, at::kFloat).reshape({2, 3})));
}

TEST_CASE("tensorFromBytes builds 0-d and empty tensors of every dtype", "[formats_torch][bytes]") {
  for (DType d : allDTypes()) {
    INFO(crashcap::formats::dtypeName(d));
    at::Tensor scalarSrc = randomBits(d, {}, 3);
    at::Tensor scalar = ft::tensorFromBytes(d, {}, scalarSrc.data_ptr(), scalarSrc.nbytes());
    REQUIRE(scalar.dim() == 0);
    requireSameBits(scalar, scalarSrc);

    at::Tensor empty = ft::tensorFromBytes(d, {4, 0}, nullptr, 0);
    REQUIRE(empty.sizes() == at::IntArrayRef({4, 0}));
    REQUIRE(empty.scalar_type() == ft::toScalarType(d));
  }
}

TEST_CASE("tensorFromBytes refuses a size that does not match dtype and shape", "[formats_torch][bytes]") {
  std::vector<uint8_t> bytes(10);
  try {
    ft::tensorFromBytes(DType::Int32, {3}, bytes.data(), bytes.size());
    FAIL("tensorFromBytes accepted 10 bytes for 3 int32");
  } catch (const Error& e) {
    REQUIRE(e.code() == ErrorCode::InvalidArgument);
    REQUIRE_THAT(e.message(), Catch::Contains("12") && Catch::Contains("10") && Catch::Contains("int32"));
  }
  REQUIRE_THROWS_AS(ft::tensorFromBytes(DType::Int32, {-1}, bytes.data(), 0), Error);
}
