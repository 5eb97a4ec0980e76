#include "crashcap/inspect/slice.hpp"

#include <catch2/catch.hpp>

#include <complex>
#include <cstring>
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
using Kind = SliceItem::Kind;

namespace {

HostTensor arange(std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = DType::Int32;
  t.shape = std::move(shape);
  std::vector<int32_t> v(t.numel());
  for (size_t i = 0; i < v.size(); ++i) v[i] = int32_t(i);
  return makeTensor(DType::Int32, t.shape, v);
}

std::vector<int32_t> values(const HostTensor& t) {
  REQUIRE(t.dtype == DType::Int32);
  std::vector<int32_t> v(t.bytes.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

HostTensor slice(const HostTensor& t, const std::string& text) { return applySlice(t, parseSlice(text)); }

// The message of the crashcap::Error `fn` throws, checking its code.
template <typename Fn>
std::string errorOf(Fn&& fn, ErrorCode code = ErrorCode::InvalidArgument) {
  try {
    fn();
  } catch (const Error& e) {
    CHECK(e.code() == code);
    return e.message();
  }
  FAIL("expected a crashcap::Error");
  return {};
}

}  // namespace

TEST_CASE("parseSlice reads indices, ranges and ellipsis", "[inspect][slice]") {
  auto one = parseSlice("0");
  REQUIRE(one.size() == 1);
  CHECK(one[0].kind == Kind::Index);
  CHECK(one[0].index == 0);

  CHECK(parseSlice("-1")[0].index == -1);

  auto range = parseSlice("1:3");
  REQUIRE(range.size() == 1);
  CHECK(range[0].kind == Kind::Range);
  CHECK(range[0].start == 1);
  CHECK(range[0].stop == 3);
  CHECK(range[0].step == 1);

  auto step = parseSlice("::2")[0];
  CHECK_FALSE(step.start);
  CHECK_FALSE(step.stop);
  CHECK(step.step == 2);

  auto reverse = parseSlice("::-1")[0];
  CHECK(reverse.step == -1);

  CHECK(parseSlice("...")[0].kind == Kind::Ellipsis);

  auto many = parseSlice(": , 0, 2:5");
  REQUIRE(many.size() == 3);
  CHECK(many[0].kind == Kind::Range);
  CHECK_FALSE(many[0].start);
  CHECK_FALSE(many[0].stop);
  CHECK(many[1].kind == Kind::Index);
  CHECK(many[2].start == 2);
  CHECK(many[2].stop == 5);

  auto bracketed = parseSlice("  [ -3: , ..., 1:-1:3 ] ");
  REQUIRE(bracketed.size() == 3);
  CHECK(bracketed[0].start == -3);
  CHECK_FALSE(bracketed[0].stop);
  CHECK(bracketed[1].kind == Kind::Ellipsis);
  CHECK(bracketed[2].start == 1);
  CHECK(bracketed[2].stop == -1);
  CHECK(bracketed[2].step == 3);

  CHECK(parseSlice("").empty());
  CHECK(parseSlice("[]").empty());
  CHECK(parseSlice("0,").size() == 1);   // numpy's a[0,]
}

TEST_CASE("parseSlice errors name the bad item and its position", "[inspect][slice]") {
  CHECK_THAT(errorOf([] { parseSlice("0, 1:x"); }), Catch::Contains("item 1 \"1:x\"") && Catch::Contains("\"x\""));
  CHECK_THAT(errorOf([] { parseSlice("a"); }), Catch::Contains("item 0 \"a\"") && Catch::Contains("integer"));
  CHECK_THAT(errorOf([] { parseSlice("1:2:3:4"); }), Catch::Contains("more than two ':'"));
  CHECK_THAT(errorOf([] { parseSlice(":, ::0"); }), Catch::Contains("item 1 \"::0\"") && Catch::Contains("zero"));
  CHECK_THAT(errorOf([] { parseSlice("0,,1"); }), Catch::Contains("item 1") && Catch::Contains("empty"));
  CHECK_THAT(errorOf([] { parseSlice("..., 0, ..."); }), Catch::Contains("item 2") && Catch::Contains("only one"));
  CHECK_THAT(errorOf([] { parseSlice("[0, 1"); }), Catch::Contains("does not end with ']'"));
  CHECK_THAT(errorOf([] { parseSlice("99999999999999999999"); }), Catch::Contains("does not fit in 64 bits"));
  CHECK_THAT(errorOf([] { parseSlice("1.5"); }), Catch::Contains("item 0 \"1.5\""));
  CHECK_THAT(errorOf([] { parseSlice("- 1"); }), Catch::Contains("item 0"));
  // The extreme values parse.
  CHECK(parseSlice("-9223372036854775808")[0].index == std::numeric_limits<int64_t>::min());
  CHECK(parseSlice("9223372036854775807")[0].index == std::numeric_limits<int64_t>::max());
}

TEST_CASE("applySlice follows numpy for indices, ranges and ellipsis", "[inspect][slice]") {
  auto t = arange({3, 4});   // [[0..3], [4..7], [8..11]]
  auto row = slice(t, "1");
  CHECK(row.shape == std::vector<int64_t>{4});
  CHECK(values(row) == std::vector<int32_t>{4, 5, 6, 7});

  CHECK(values(slice(t, "-1")) == std::vector<int32_t>{8, 9, 10, 11});

  auto col = slice(t, ":, 0");
  CHECK(col.shape == std::vector<int64_t>{3});
  CHECK(values(col) == std::vector<int32_t>{0, 4, 8});

  auto rev = slice(t, "::-1");
  CHECK(rev.shape == std::vector<int64_t>{3, 4});
  CHECK(values(rev) == std::vector<int32_t>{8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3});

  CHECK(values(slice(t, "..., 1")) == std::vector<int32_t>{1, 5, 9});
  CHECK(values(slice(t, "::2, ::-2")) == std::vector<int32_t>{3, 1, 11, 9});
  CHECK(values(slice(t, "1:3, 1:3")) == std::vector<int32_t>{5, 6, 9, 10});
  CHECK(values(slice(t, "-2:, :-2")) == std::vector<int32_t>{4, 5, 8, 9});
  CHECK(values(slice(t, "0, 3:0:-1")) == std::vector<int32_t>{3, 2, 1});

  auto scalar = slice(t, "2, 3");
  CHECK(scalar.shape.empty());
  CHECK(values(scalar) == std::vector<int32_t>{11});

  auto all = slice(t, "");
  CHECK(all.shape == t.shape);
  CHECK(all.bytes == t.bytes);
  CHECK(slice(t, "...").bytes == t.bytes);
}

TEST_CASE("ranges clamp to the dimension and may be empty", "[inspect][slice]") {
  auto t = arange({5});
  CHECK(values(slice(t, "3:100")) == std::vector<int32_t>{3, 4});
  CHECK(values(slice(t, "-100:2")) == std::vector<int32_t>{0, 1});
  CHECK(values(slice(t, "100:-100:-1")) == std::vector<int32_t>{4, 3, 2, 1, 0});
  CHECK(values(slice(t, "-100::-1")).empty());
  auto empty = slice(t, "4:1");
  CHECK(empty.shape == std::vector<int64_t>{0});
  CHECK(empty.bytes.empty());
  CHECK(values(slice(t, "::9223372036854775807")) == std::vector<int32_t>{0});
  CHECK(values(slice(t, "::-9223372036854775808")) == std::vector<int32_t>{4});
  CHECK(values(slice(t, "-9223372036854775808:9223372036854775807")) == std::vector<int32_t>{0, 1, 2, 3, 4});
}

TEST_CASE("applySlice on 0-d and empty tensors", "[inspect][slice]") {
  auto scalar = makeTensor<int32_t>(DType::Int32, {}, {42});
  CHECK(values(slice(scalar, "...")) == std::vector<int32_t>{42});
  CHECK(slice(scalar, "").shape.empty());
  CHECK_THAT(errorOf([&] { slice(scalar, "0"); }), Catch::Contains("too many indices"));

  auto empty = arange({2, 0, 3});
  auto s = slice(empty, "1, :, 1:");
  CHECK(s.shape == std::vector<int64_t>{0, 2});
  CHECK(s.bytes.empty());
  CHECK_THAT(errorOf([&] { slice(empty, ":, 0"); }),
             Catch::Contains("index 0 is out of bounds for dimension 1 with size 0"));
}

TEST_CASE("out-of-range indices and too many items are errors naming the dimension and its size",
          "[inspect][slice]") {
  auto t = arange({3, 4});
  CHECK_THAT(errorOf([&] { slice(t, ":, 4"); }), Catch::Contains("index 4 is out of bounds for dimension 1 with size 4"));
  CHECK_THAT(errorOf([&] { slice(t, "-4"); }), Catch::Contains("index -4 is out of bounds for dimension 0 with size 3"));
  CHECK_THAT(errorOf([&] { slice(t, "0, 0, 0"); }),
             Catch::Contains("2 dimension(s)") && Catch::Contains("3 item(s)"));
  CHECK_THAT(errorOf([&] { slice(t, "0, ..., 0, 0"); }), Catch::Contains("too many indices"));
  // A SliceItem built by hand is checked too.
  SliceItem zeroStep;
  zeroStep.step = 0;
  CHECK_THAT(errorOf([&] { applySlice(t, {zeroStep}); }), Catch::Contains("step"));
}

TEST_CASE("slicing keeps the dtype and copies whole elements", "[inspect][slice]") {
  auto t = makeTensor<std::complex<double>>(DType::Complex128, {2, 2}, {{1, 2}, {3, 4}, {5, 6}, {7, 8}});
  auto s = slice(t, ":, -1");
  CHECK(s.dtype == DType::Complex128);
  REQUIRE(s.shape == std::vector<int64_t>{2});
  CHECK(s.at(0) == 3);
  CHECK(s.imagAt(0) == 4);
  CHECK(s.at(1) == 7);
  CHECK(s.imagAt(1) == 8);
}

TEST_CASE("applySlice matches numpy basic indexing on random slices", "[inspect][slice][numpy]") {
  std::mt19937_64 rng(7);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  test::TempDir dir;
  HostTensor t = arange({4, 5, 3, 6});
  writeNpy(t, dir.file("a.npy"));
  std::vector<std::string> slices;
  for (int i = 0; i < 300; ++i) {
    int items = uniform(0, 4);
    int ellipsisAt = uniform(0, 1) ? uniform(0, items) : -1;
    std::string s;
    for (int k = 0; k <= items; ++k) {
      std::string item;
      if (k == ellipsisAt) {
        item = "...";
      } else if (k == items) {
        break;
      } else if (uniform(0, 3) == 0) {
        item = std::to_string(uniform(-3, 2));
      } else {
        auto bound = [&] { return uniform(0, 2) == 0 ? std::string() : std::to_string(uniform(-8, 8)); };
        item = bound() + ":" + bound();
        if (uniform(0, 1)) {
          int step = uniform(-3, 3);
          item += ":" + std::to_string(step == 0 ? 1 : step);
        }
      }
      s += (s.empty() ? "" : ", ") + item;
    }
    slices.push_back(s);
  }
  test::writeText(dir.file("slices.json"), nlohmann::json(slices).dump());
  std::string out = python(R"(
a = np.load(sys.argv[1])
res = []
for s in json.load(open(sys.argv[2])):
    try:
        b = eval("a[" + (s or "...") + "]", {"a": a})
        res.append({"shape": list(b.shape), "data": np.ascontiguousarray(b).ravel().tolist()})
    except IndexError as e:
        res.append({"error": str(e)})
print(json.dumps(res))
)",
                           {dir.file("a.npy"), dir.file("slices.json")});
  auto expected = nlohmann::json::parse(out);
  REQUIRE(expected.size() == slices.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    INFO("slice \"" << slices[i] << "\"");
    if (expected[i].contains("error")) {
      CHECK_THROWS_AS(slice(t, slices[i]), Error);
      continue;
    }
    HostTensor got = slice(t, slices[i]);
    CHECK(got.shape == expected[i]["shape"].get<std::vector<int64_t>>());
    CHECK(values(got) == expected[i]["data"].get<std::vector<int32_t>>());
  }
}
