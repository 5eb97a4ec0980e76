#include "crashcap/inspect/print.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <complex>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "crashcap/formats/error.hpp"
#include "crashcap/inspect/npy.hpp"
#include "inspect_fixtures.hpp"

using namespace crashcap;
using namespace crashcap::inspect;
using namespace crashcap::inspect::testing;
using formats::DType;

namespace {
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

template <typename T>
std::vector<T> iota(size_t n, T start = 0, T step = 1) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = T(start + T(i) * step);
  return v;
}

PrintOptions opts(int precision = 4, uint64_t threshold = 1000, int edgeItems = 3, int lineWidth = 100) {
  PrintOptions o;
  o.precision = precision;
  o.threshold = threshold;
  o.edgeItems = edgeItems;
  o.lineWidth = lineWidth;
  return o;
}
}  // namespace

// Expected strings below are numpy 1.24's
//   np.array2string(a, separator=", ", floatmode="fixed", precision=4, threshold=1000,
//                   edgeitems=3, max_line_width=100)

TEST_CASE("floats print with fixed precision and right-aligned nan", "[inspect][print]") {
  CHECK(formatTensor(doubles({3}, {1.0, -2.5, kNan})) == "[ 1.0000, -2.5000,     nan]");
  CHECK(formatTensor(doubles({2, 3}, {1.0, -2.5, kNan, 3, 4, 5})) ==
        "[[ 1.0000, -2.5000,     nan],\n"
        " [ 3.0000,  4.0000,  5.0000]]");
}

TEST_CASE("a tensor of only non-finite values prints nan, inf and -inf aligned", "[inspect][print]") {
  CHECK(formatTensor(doubles({3}, {kInf, -kInf, kNan})) == "[ inf, -inf,  nan]");
}

TEST_CASE("floats switch to scientific notation when magnitudes span too much", "[inspect][print]") {
  CHECK(formatTensor(doubles({3}, {1e-5, 1, kNan})) == "[1.0000e-05, 1.0000e+00,        nan]");
  CHECK(formatTensor(doubles({2}, {-1.5, 1e100})) == "[-1.5000e+000,  1.0000e+100]");
}

TEST_CASE("rounding is half-to-even on the exact binary value, as numpy's", "[inspect][print]") {
  CHECK(formatTensor(doubles({2}, {0.125, 0.375}), opts(2)) == "[0.12, 0.38]");
  CHECK(formatTensor(doubles({3}, {1.5, 2.5, -0.5}), opts(0)) == "[ 2.,  2., -0.]");
  CHECK(formatTensor(doubles({2}, {-0.0, 0.0})) == "[-0.0000,  0.0000]");
}

TEST_CASE("a 3-d tensor separates its blocks with a blank line", "[inspect][print]") {
  CHECK(formatTensor(doubles({2, 3, 4}, iota<double>(24))) ==
        "[[[ 0.0000,  1.0000,  2.0000,  3.0000],\n"
        "  [ 4.0000,  5.0000,  6.0000,  7.0000],\n"
        "  [ 8.0000,  9.0000, 10.0000, 11.0000]],\n"
        "\n"
        " [[12.0000, 13.0000, 14.0000, 15.0000],\n"
        "  [16.0000, 17.0000, 18.0000, 19.0000],\n"
        "  [20.0000, 21.0000, 22.0000, 23.0000]]]");
}

TEST_CASE("long rows wrap at the line width", "[inspect][print]") {
  auto t = floats({30}, iota<float>(30, 0.f, 1.5f));
  CHECK(formatTensor(t) ==
        "[ 0.0000,  1.5000,  3.0000,  4.5000,  6.0000,  7.5000,  9.0000, 10.5000, 12.0000, 13.5000, 15.0000,\n"
        " 16.5000, 18.0000, 19.5000, 21.0000, 22.5000, 24.0000, 25.5000, 27.0000, 28.5000, 30.0000, 31.5000,\n"
        " 33.0000, 34.5000, 36.0000, 37.5000, 39.0000, 40.5000, 42.0000, 43.5000]");
  CHECK(formatTensor(t, opts(4, 1000, 3, 75)) ==
        "[ 0.0000,  1.5000,  3.0000,  4.5000,  6.0000,  7.5000,  9.0000, 10.5000,\n"
        " 12.0000, 13.5000, 15.0000, 16.5000, 18.0000, 19.5000, 21.0000, 22.5000,\n"
        " 24.0000, 25.5000, 27.0000, 28.5000, 30.0000, 31.5000, 33.0000, 34.5000,\n"
        " 36.0000, 37.5000, 39.0000, 40.5000, 42.0000, 43.5000]");
}

TEST_CASE("large tensors are summarized with ... keeping the edge items of every dimension", "[inspect][print]") {
  CHECK(formatTensor(makeTensor(DType::Int32, {40, 50}, iota<int32_t>(2000))) ==
        "[[   0,    1,    2, ...,   47,   48,   49],\n"
        " [  50,   51,   52, ...,   97,   98,   99],\n"
        " [ 100,  101,  102, ...,  147,  148,  149],\n"
        " ...,\n"
        " [1850, 1851, 1852, ..., 1897, 1898, 1899],\n"
        " [1900, 1901, 1902, ..., 1947, 1948, 1949],\n"
        " [1950, 1951, 1952, ..., 1997, 1998, 1999]]");
  CHECK(formatTensor(makeTensor(DType::Int16, {10, 10, 10}, iota<int16_t>(1000, -500)), opts(4, 100, 2)) ==
        "[[[-500, -499, ..., -492, -491],\n"
        "  [-490, -489, ..., -482, -481],\n"
        "  ...,\n"
        "  [-420, -419, ..., -412, -411],\n"
        "  [-410, -409, ..., -402, -401]],\n"
        "\n"
        " [[-400, -399, ..., -392, -391],\n"
        "  [-390, -389, ..., -382, -381],\n"
        "  ...,\n"
        "  [-320, -319, ..., -312, -311],\n"
        "  [-310, -309, ..., -302, -301]],\n"
        "\n"
        " ...,\n"
        "\n"
        " [[ 300,  301, ...,  308,  309],\n"
        "  [ 310,  311, ...,  318,  319],\n"
        "  ...,\n"
        "  [ 380,  381, ...,  388,  389],\n"
        "  [ 390,  391, ...,  398,  399]],\n"
        "\n"
        " [[ 400,  401, ...,  408,  409],\n"
        "  [ 410,  411, ...,  418,  419],\n"
        "  ...,\n"
        "  [ 480,  481, ...,  488,  489],\n"
        "  [ 490,  491, ...,  498,  499]]]");
}

TEST_CASE("the format of a summarized tensor depends only on the printed elements", "[inspect][print]") {
  // The hidden middle holds a huge value and a NaN; numpy ignores them too.
  std::vector<double> v(2000, 1.0);
  v[1000] = 1e30;
  v[1001] = kNan;
  CHECK(formatTensor(doubles({2000}, v)) == "[1.0000, 1.0000, 1.0000, ..., 1.0000, 1.0000, 1.0000]");
}

TEST_CASE("printing a huge tensor is fast because only the printed elements are visited", "[inspect][print]") {
  HostTensor t;
  t.dtype = DType::UInt8;
  t.shape = {2048, 2048, 8};
  t.bytes.assign(2048ull * 2048 * 8, 7);
  t.bytes.back() = 9;
  std::string s = formatTensor(t);
  CHECK(s.substr(0, 12) == "[[[7, 7, 7, ");
  CHECK(s.substr(s.size() - 10) == "7, 7, 9]]]");
  CHECK(s.size() < 2000);
}

TEST_CASE("0-d tensors print as a bare scalar", "[inspect][print]") {
  CHECK(formatTensor(doubles({}, {1.5})) == "1.5000");
  CHECK(formatTensor(doubles({}, {-1.5})) == "-1.5000");
  CHECK(formatTensor(doubles({}, {kNan})) == "nan");
  CHECK(formatTensor(makeTensor<uint8_t>(DType::UInt8, {}, {7})) == "7");
  CHECK(formatTensor(makeTensor<uint8_t>(DType::Bool, {}, {1})) == "True");
  CHECK(formatTensor(makeTensor<std::complex<double>>(DType::Complex128, {}, {{1, 2}})) == "1.0000+2.0000j");
}

TEST_CASE("empty tensors print as []", "[inspect][print]") {
  CHECK(formatTensor(floats({0}, {})) == "[]");
  CHECK(formatTensor(floats({2, 0, 3}, {})) == "[]");
}

TEST_CASE("bool, integer and complex tensors print like numpy", "[inspect][print]") {
  CHECK(formatTensor(makeTensor<uint8_t>(DType::Bool, {2, 2}, {1, 0, 0, 1})) ==
        "[[ True, False],\n"
        " [False,  True]]");
  CHECK(formatTensor(makeTensor<int8_t>(DType::Int8, {2}, {-128, 127})) == "[-128,  127]");
  CHECK(formatTensor(makeTensor<int64_t>(DType::Int64, {2}, {std::numeric_limits<int64_t>::min(), 5})) ==
        "[-9223372036854775808,                    5]");
  using C = std::complex<float>;
  CHECK(formatTensor(makeTensor<C>(DType::Complex64, {3}, {C(1, 2), C(NAN, -3), C(1, INFINITY)})) ==
        "[1.0000+2.0000j,    nan-3.0000j, 1.0000   +infj]");
}

TEST_CASE("float16 and bfloat16 print their exact values", "[inspect][print]") {
  CHECK(formatTensor(makeTensor<uint16_t>(DType::Float16, {4}, {0x3c00, 0xc000, 0x7c00, 0x3555})) ==
        "[ 1.0000, -2.0000,     inf,  0.3333]");
  CHECK(formatTensor(makeTensor<uint16_t>(DType::BFloat16, {3}, {0x3f80, 0xff80, 0x7fc0})) ==
        "[1.0000,   -inf,    nan]");
}

TEST_CASE("printing refuses a tensor whose bytes are shorter than its shape", "[inspect][print]") {
  HostTensor t = floats({2, 2}, {1, 2, 3, 4});
  t.bytes.resize(12);
  CHECK_THROWS_AS(formatTensor(t), Error);
}

TEST_CASE("printing matches numpy's array2string on random tensors of every dtype", "[inspect][print][numpy]") {
  test::TempDir dir;
  std::mt19937_64 rng(20240601);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<HostTensor> tensors;
  std::vector<PrintOptions> options;
  nlohmann::json manifest = nlohmann::json::array();
  const DType dtypes[] = {DType::Float64, DType::Float32, DType::Float16, DType::BFloat16, DType::Int8,
                          DType::Int16,   DType::Int32,   DType::Int64,   DType::UInt8,    DType::Bool,
                          DType::Complex64, DType::Complex128};
  for (int round = 0; round < 25; ++round) {
    for (DType dtype : dtypes) {
      HostTensor t;
      t.dtype = dtype;
      int ndim = uniform(0, 4);
      for (int d = 0; d < ndim; ++d) t.shape.push_back(uniform(0, 9) == 0 ? 0 : uniform(1, ndim <= 2 ? 40 : 9));
      uint64_t n = t.numel();
      t.bytes = test::randomBytes(n * formats::elementSize(dtype), rng());
      // Floating values from several regimes: plain, integral, huge, tiny, with NaN/Inf.
      int regime = uniform(0, 5);
      auto value = [&]() -> double {
        std::normal_distribution<double> g(0, 1);
        int pick = uniform(0, 99);
        if (pick < 3) return kNan;
        if (pick < 5) return pick == 3 ? kInf : -kInf;
        switch (regime) {
          case 0: return g(rng);
          case 1: return std::round(g(rng) * 100);
          case 2: return g(rng) * 1e9;
          case 3: return g(rng) * 1e-6;
          case 4: return uniform(0, 3) == 0 ? 0.0 : g(rng) * 300;
          default: return std::ldexp(g(rng), uniform(-30, 30));
        }
      };
      for (uint64_t i = 0; i < n; ++i) {
        uint8_t* p = t.bytes.data() + i * formats::elementSize(dtype);
        auto put = [&](auto v) { std::memcpy(p, &v, sizeof v); };
        switch (dtype) {
          case DType::Float64: put(value()); break;
          case DType::Float32: put(float(value())); break;
          case DType::Complex64: {
            float parts[2] = {float(value()), float(value())};
            std::memcpy(p, parts, sizeof parts);
            break;
          }
          case DType::Complex128: {
            double parts[2] = {value(), value()};
            std::memcpy(p, parts, sizeof parts);
            break;
          }
          case DType::Float16: {
            // Random finite halves plus the special patterns.
            uint16_t bits = uint16_t(rng());
            if (regime != 5) bits = uint16_t((bits & 0x83ff) | (uint16_t(uniform(8, 22)) << 10));
            if (uniform(0, 40) == 0) bits = 0x7e00;
            put(bits);
            break;
          }
          case DType::BFloat16: {
            float f = float(value());
            uint32_t u;
            std::memcpy(&u, &f, 4);
            put(uint16_t(u >> 16));
            break;
          }
          case DType::Bool: *p &= 1; break;
          default: break;   // integers keep their random bytes
        }
      }
      PrintOptions o = opts(uniform(0, 6), uint64_t(uniform(0, 3) == 0 ? 20 : 1000), uniform(1, 4),
                            uniform(0, 4) == 0 ? uniform(10, 60) : 100);
      std::string file = dir.file("t" + std::to_string(tensors.size()) + ".npy");
      writeNpy(t, file);
      manifest.push_back({{"file", file}, {"precision", o.precision}, {"threshold", o.threshold},
                          {"edgeitems", o.edgeItems}, {"linewidth", o.lineWidth}});
      tensors.push_back(std::move(t));
      options.push_back(o);
    }
  }
  test::writeText(dir.file("manifest.json"), manifest.dump());
  std::string out = python(R"(
out = []
for m in json.load(open(sys.argv[1])):
    a = np.load(m["file"])
    out.append(np.array2string(a, separator=", ", floatmode="fixed", precision=m["precision"],
        threshold=m["threshold"], edgeitems=m["edgeitems"], max_line_width=m["linewidth"]))
print(json.dumps(out))
)",
                           {dir.file("manifest.json")});
  auto expected = nlohmann::json::parse(out);
  REQUIRE(expected.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    INFO("tensor " << i << " dtype " << formats::dtypeName(tensors[i].dtype) << " shape "
                   << nlohmann::json(tensors[i].shape).dump() << " precision " << options[i].precision
                   << " threshold " << options[i].threshold << " edgeitems " << options[i].edgeItems
                   << " linewidth " << options[i].lineWidth);
    CHECK(formatTensor(tensors[i], options[i]) == expected[i].get<std::string>());
  }
}
