#include "crashcap/inspect/stats.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <complex>
#include <limits>
#include <nlohmann/json.hpp>

#include "crashcap/formats/error.hpp"
#include "inspect_fixtures.hpp"

using namespace crashcap;
using namespace crashcap::inspect;
using namespace crashcap::inspect::testing;
using formats::DType;

namespace {
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
}  // namespace

TEST_CASE("stats count NaN and Inf exactly and give their first row-major positions", "[inspect][stats]") {
  // [[1, -2, nan], [inf, nan, -inf]]
  auto t = floats({2, 3}, {1.f, -2.f, kNan, kInf, kNan, -kInf});
  TensorStats s = computeStats(t);
  CHECK(s.count == 6);
  CHECK(s.nanCount == 2);
  CHECK(s.posInfCount == 1);
  CHECK(s.negInfCount == 1);
  CHECK(s.zeroCount == 0);
  REQUIRE(s.firstNan);
  CHECK(*s.firstNan == std::vector<int64_t>{0, 2});
  REQUIRE(s.firstInf);
  CHECK(*s.firstInf == std::vector<int64_t>{1, 0});
  CHECK(*s.min == -2.0);
  CHECK(*s.max == 1.0);
  CHECK(*s.mean == -0.5);
  CHECK(*s.std == Approx(1.5));
}

TEST_CASE("stats of a finite tensor have no NaN or Inf positions", "[inspect][stats]") {
  auto s = computeStats(doubles({4}, {0.0, -0.0, 2.0, 4.0}));
  CHECK(s.nanCount == 0);
  CHECK(s.posInfCount + s.negInfCount == 0);
  CHECK(s.zeroCount == 2);
  CHECK_FALSE(s.firstNan);
  CHECK_FALSE(s.firstInf);
  CHECK(*s.mean == 1.5);
  CHECK(*s.std == Approx(std::sqrt(2.75)));
}

TEST_CASE("stats find the first NaN deep in a 4-d tensor", "[inspect][stats]") {
  std::vector<float> v(2 * 3 * 4 * 5, 1.f);
  // Flat 97 = [0*60 + 1*20 + ... ]: 97 = 1*60 + 37 = 1*60 + 1*20 + 17 = 1*60 + 1*20 + 3*5 + 2.
  v[97] = kNan;
  v[110] = kNan;
  v[40] = -kInf;
  auto s = computeStats(floats({2, 3, 4, 5}, v));
  CHECK(*s.firstNan == std::vector<int64_t>{1, 1, 3, 2});
  CHECK(*s.firstInf == std::vector<int64_t>{0, 2, 0, 0});
  CHECK(s.nanCount == 2);
  CHECK(s.negInfCount == 1);
}

TEST_CASE("mean and std stay accurate with a large offset and many elements", "[inspect][stats]") {
  // Naive sum-of-squares loses every digit here.
  const int64_t n = 1'000'000;
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = 1e9 + double(i);
  auto s = computeStats(doubles({n}, v));
  CHECK(*s.mean == Approx(1e9 + (n - 1) / 2.0).epsilon(1e-15));
  CHECK(*s.std == Approx(std::sqrt((double(n) * n - 1) / 12.0)).epsilon(1e-12));
  CHECK(*s.min == 1e9);
  CHECK(*s.max == 1e9 + double(n - 1));
}

TEST_CASE("stats of huge float64 values do not overflow", "[inspect][stats]") {
  auto s = computeStats(doubles({2}, {1e308, -1e308}));
  CHECK(*s.mean == 0.0);
  CHECK(*s.std == Approx(1e308));
  CHECK(std::isfinite(*s.std));
}

TEST_CASE("stats widen float16 and bfloat16 exactly, NaN and Inf included", "[inspect][stats]") {
  // float16: 1, -2, +inf, nan, smallest subnormal (2^-24), 65504 (max).
  auto half = makeTensor<uint16_t>(DType::Float16, {6}, {0x3c00, 0xc000, 0x7c00, 0x7e00, 0x0001, 0x7bff});
  auto s = computeStats(half);
  CHECK(s.nanCount == 1);
  CHECK(s.posInfCount == 1);
  CHECK(*s.firstNan == std::vector<int64_t>{3});
  CHECK(*s.firstInf == std::vector<int64_t>{2});
  CHECK(*s.min == -2.0);
  CHECK(*s.max == 65504.0);
  CHECK(half.at(4) == std::ldexp(1.0, -24));

  // bfloat16: 1, -inf, nan, -3.5
  auto bf = makeTensor<uint16_t>(DType::BFloat16, {2, 2}, {0x3f80, 0xff80, 0x7fc0, 0xc060});
  auto b = computeStats(bf);
  CHECK(b.negInfCount == 1);
  CHECK(b.nanCount == 1);
  CHECK(*b.firstInf == std::vector<int64_t>{0, 1});
  CHECK(*b.firstNan == std::vector<int64_t>{1, 0});
  CHECK(*b.min == -3.5);
  CHECK(*b.max == 1.0);
}

TEST_CASE("halfToFloat agrees with the IEEE formula for every bit pattern", "[inspect][stats]") {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    int exponent = int(bits >> 10) & 0x1f;
    int mantissa = int(bits & 0x3ff);
    double sign = (bits & 0x8000) ? -1.0 : 1.0;
    float got = halfToFloat(uint16_t(bits));
    if (exponent == 31) {
      if (mantissa) REQUIRE(std::isnan(got));
      else REQUIRE(got == float(sign * INFINITY));
    } else {
      double expected = exponent == 0 ? sign * std::ldexp(mantissa, -24)
                                      : sign * std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
      INFO("bits 0x" << std::hex << bits);
      REQUIRE(double(got) == expected);
      REQUIRE(std::signbit(got) == bool(bits & 0x8000));
    }
  }
}

TEST_CASE("integer and bool tensors have no NaN and count zeros exactly", "[inspect][stats]") {
  auto i64 = makeTensor<int64_t>(DType::Int64, {5},
                                 {0, std::numeric_limits<int64_t>::min(), 7, 0, std::numeric_limits<int64_t>::max()});
  auto s = computeStats(i64);
  CHECK(s.nanCount == 0);
  CHECK(s.posInfCount + s.negInfCount == 0);
  CHECK(s.zeroCount == 2);
  CHECK(*s.min == -9223372036854775808.0);
  CHECK(*s.max == 9223372036854775807.0);

  auto i8 = makeTensor<int8_t>(DType::Int8, {4}, {-128, 127, 0, 1});
  auto s8 = computeStats(i8);
  CHECK(*s8.min == -128);
  CHECK(*s8.max == 127);
  CHECK(*s8.mean == 0.0);
  CHECK(s8.zeroCount == 1);

  auto u8 = makeTensor<uint8_t>(DType::UInt8, {3}, {255, 0, 0});
  CHECK(*computeStats(u8).max == 255);
  CHECK(*computeStats(u8).mean == 85);

  auto i16 = makeTensor<int16_t>(DType::Int16, {2}, {-300, 300});
  CHECK(*computeStats(i16).std == 300);
  auto i32 = makeTensor<int32_t>(DType::Int32, {2}, {-7, 0});
  CHECK(*computeStats(i32).mean == -3.5);

  auto b = makeTensor<uint8_t>(DType::Bool, {4}, {1, 0, 1, 1});
  auto sb = computeStats(b);
  CHECK(sb.zeroCount == 1);
  CHECK(*sb.mean == 0.75);
  CHECK(*sb.min == 0);
  CHECK(*sb.max == 1);
}

TEST_CASE("complex stats are over the magnitude and NaN when either part is NaN", "[inspect][stats]") {
  using C = std::complex<float>;
  auto c = makeTensor<C>(DType::Complex64, {2, 3},
                         {C(3, 4), C(kNan, 1), C(1, kInf), C(0, 0), C(kInf, kNan), C(-6, -8)});
  auto s = computeStats(c);
  CHECK(s.count == 6);
  CHECK(s.nanCount == 2);
  CHECK(*s.firstNan == std::vector<int64_t>{0, 1});
  CHECK(s.posInfCount == 1);   // an infinite part makes an infinite magnitude
  CHECK(s.negInfCount == 0);
  CHECK(*s.firstInf == std::vector<int64_t>{0, 2});
  CHECK(s.zeroCount == 1);
  CHECK(*s.min == 0.0);
  CHECK(*s.max == 10.0);
  CHECK(*s.mean == 5.0);

  using Z = std::complex<double>;
  auto z = makeTensor<Z>(DType::Complex128, {2}, {Z(0, -2), Z(1e300, 1e300)});
  auto sz = computeStats(z);
  CHECK(*sz.min == 2.0);
  CHECK(*sz.max == Approx(std::sqrt(2.0) * 1e300));   // hypot does not overflow
}

TEST_CASE("stats of a 0-d tensor describe its one element", "[inspect][stats]") {
  auto s = computeStats(floats({}, {2.5f}));
  CHECK(s.count == 1);
  CHECK(*s.mean == 2.5);
  CHECK(*s.std == 0.0);

  auto n = computeStats(floats({}, {kNan}));
  CHECK(n.nanCount == 1);
  REQUIRE(n.firstNan);
  CHECK(n.firstNan->empty());   // the index of a 0-d element is ()
  CHECK_FALSE(n.mean);
}

TEST_CASE("stats of an empty tensor have a zero count and no values", "[inspect][stats]") {
  auto s = computeStats(floats({3, 0, 2}, {}));
  CHECK(s.count == 0);
  CHECK_FALSE(s.min);
  CHECK_FALSE(s.max);
  CHECK_FALSE(s.mean);
  CHECK_FALSE(s.std);
  CHECK_FALSE(s.firstNan);
  CHECK(formatStats(s).find("no finite elements") != std::string::npos);
}

TEST_CASE("stats of an all-NaN tensor leave min, max, mean and std absent", "[inspect][stats]") {
  auto s = computeStats(floats({3}, {kNan, kInf, kNan}));
  CHECK(s.nanCount == 2);
  CHECK(s.posInfCount == 1);
  CHECK_FALSE(s.min);
  CHECK_FALSE(s.std);
}

TEST_CASE("statsToJson uses the documented keys and null for absent values", "[inspect][stats]") {
  auto j = statsToJson(computeStats(floats({2, 2}, {1.f, kNan, -kInf, 3.f})));
  CHECK(j.at("count") == 4);
  CHECK(j.at("nan_count") == 1);
  CHECK(j.at("inf_count") == 1);
  CHECK(j.at("pos_inf_count") == 0);
  CHECK(j.at("neg_inf_count") == 1);
  CHECK(j.at("zero_count") == 0);
  CHECK(j.at("min") == 1.0);
  CHECK(j.at("max") == 3.0);
  CHECK(j.at("mean") == 2.0);
  CHECK(j.at("std") == 1.0);
  CHECK(j.at("first_nan") == nlohmann::json::array({0, 1}));
  CHECK(j.at("first_inf") == nlohmann::json::array({1, 0}));

  auto e = statsToJson(computeStats(floats({0}, {})));
  CHECK(e.at("min").is_null());
  CHECK(e.at("std").is_null());
  CHECK(e.at("first_nan").is_null());
  CHECK(e.at("first_inf").is_null());
}

TEST_CASE("formatStats names the counts and the first non-finite positions", "[inspect][stats]") {
  std::string text = formatStats(computeStats(floats({2, 3}, {-1.5f, 3.25f, kNan, 0.f, kInf, kNan})));
  CHECK(text ==
        "min -1.5  max 3.25  mean 0.583333  std 1.98256\n"
        "count 6  zeros 1\n"
        "NaN 2 (first at [0, 2])\n"
        "Inf 1 (+inf 1, -inf 0, first at [1, 1])");
  CHECK(formatStats(computeStats(floats({1}, {1.f}))).find("NaN 0\nInf 0") != std::string::npos);
}

TEST_CASE("stats refuse a tensor whose bytes do not match its shape", "[inspect][stats]") {
  HostTensor t;
  t.dtype = DType::Float32;
  t.shape = {2, 3};
  t.bytes.resize(20);
  try {
    computeStats(t);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK_THAT(e.message(), Catch::Contains("needs 6 x 4 bytes, found 20"));
  }
  t.shape = {-1};
  CHECK_THROWS_AS(computeStats(t), Error);
}

TEST_CASE("a shape whose element count overflows is refused unless a dimension is zero", "[inspect][stats]") {
  HostTensor huge;
  huge.shape = {int64_t(1) << 32, int64_t(1) << 32};
  try {
    computeStats(huge);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK_THAT(e.message(), Catch::Contains("more than 2^64 elements"));
  }
  HostTensor empty;
  empty.shape = {int64_t(1) << 40, 0, int64_t(1) << 40};
  CHECK(empty.numel() == 0);
  CHECK(computeStats(empty).count == 0);
}
