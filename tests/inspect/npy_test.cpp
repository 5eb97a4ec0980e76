#include "crashcap/inspect/npy.hpp"

#include <catch2/catch.hpp>

#include <complex>
#include <map>
#include <random>
#include <nlohmann/json.hpp>

#include "crashcap/formats/error.hpp"
#include "inspect_fixtures.hpp"

using namespace crashcap;
using namespace crashcap::inspect;
using namespace crashcap::inspect::testing;
using formats::DType;

namespace {

const DType kAllDTypes[] = {DType::Float64, DType::Float32, DType::Float16, DType::BFloat16,
                            DType::Int8,    DType::Int16,   DType::Int32,   DType::Int64,
                            DType::UInt8,   DType::Bool,    DType::Complex64, DType::Complex128};

// A tensor of `dtype` with deterministic contents (bools are 0/1, floats include NaN/Inf
// bit patterns from the random bytes).
HostTensor sample(DType dtype, std::vector<int64_t> shape, uint64_t seed) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes = test::randomBytes(t.numel() * formats::elementSize(dtype), seed);
  if (dtype == DType::Bool)
    for (auto& b : t.bytes) b &= 1;
  return t;
}

std::string hex(const std::vector<uint8_t>& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

std::vector<uint8_t> widenBFloat16(const std::vector<uint8_t>& bytes) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i < bytes.size(); i += 2) {
    out.insert(out.end(), {0, 0, bytes[i], bytes[i + 1]});
  }
  return out;
}

// A .npy file from raw header text (padded like numpy) and data bytes.
std::vector<uint8_t> npyBytes(const std::string& dict, const std::vector<uint8_t>& data, int major = 1) {
  std::string header = dict;
  size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', uint8_t(major), 0};
  for (size_t i = 0; i < prefix - 8; ++i) out.push_back(uint8_t(header.size() >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// The crashcap::Error that reading `bytes` as a .npy throws.
Error readError(const std::vector<uint8_t>& bytes, uint64_t maxBytes = 16ull << 30) {
  test::TempDir dir;
  test::writeFile(dir.file("bad.npy"), bytes);
  try {
    readNpy(dir.file("bad.npy"), maxBytes);
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected readNpy to throw");
  throw;
}

}  // namespace

TEST_CASE("writeNpy then readNpy round-trips every dtype", "[inspect][npy]") {
  test::TempDir dir;
  uint64_t seed = 1;
  for (DType dtype : kAllDTypes) {
    for (const auto& shape : std::vector<std::vector<int64_t>>{{}, {0}, {7}, {3, 5}, {2, 0, 4}, {2, 3, 4, 5}}) {
      INFO(formats::dtypeName(dtype) << " shape " << nlohmann::json(shape).dump());
      HostTensor t = sample(dtype, shape, seed++);
      std::string path = dir.file("t.npy");
      bool widened = writeNpy(t, path);
      CHECK(widened == (dtype == DType::BFloat16));
      HostTensor back = readNpy(path);
      CHECK(back.shape == t.shape);
      if (dtype == DType::BFloat16) {
        CHECK(back.dtype == DType::Float32);
        CHECK(back.bytes == widenBFloat16(t.bytes));
      } else {
        CHECK(back.dtype == t.dtype);
        CHECK(back.bytes == t.bytes);
      }
    }
  }
}

TEST_CASE("writeNpy writes a version 1.0 header aligned to 64 bytes like np.save", "[inspect][npy]") {
  test::TempDir dir;
  writeNpy(sample(DType::Float32, {2, 3}, 5), dir.file("a.npy"));
  auto bytes = test::readFile(dir.file("a.npy"));
  REQUIRE(bytes.size() == 128 + 24);
  CHECK(std::string(bytes.begin() + 1, bytes.begin() + 6) == "NUMPY");
  CHECK(bytes[0] == 0x93);
  CHECK(bytes[6] == 1);
  CHECK(bytes[7] == 0);
  CHECK(bytes[8] + 256 * bytes[9] == 118);
  std::string header(bytes.begin() + 10, bytes.begin() + 128);
  CHECK(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0) == 0);
  CHECK(header.back() == '\n');
}

TEST_CASE("writeNpy switches to version 2.0 only when the header exceeds 65535 bytes", "[inspect][npy]") {
  test::TempDir dir;
  HostTensor t = sample(DType::Int16, std::vector<int64_t>(22000, 1), 3);   // "1, " x 22000
  writeNpy(t, dir.file("wide.npy"));
  auto bytes = test::readFile(dir.file("wide.npy"));
  CHECK(bytes[6] == 2);
  uint32_t headerLen = bytes[8] | bytes[9] << 8 | bytes[10] << 16 | uint32_t(bytes[11]) << 24;
  CHECK(headerLen > 65535);
  CHECK((12 + headerLen) % 64 == 0);
  HostTensor back = readNpy(dir.file("wide.npy"));
  CHECK(back.shape == t.shape);
  CHECK(back.bytes == t.bytes);

  writeNpy(sample(DType::Int16, std::vector<int64_t>(100, 1), 3), dir.file("narrow.npy"));
  CHECK(test::readFile(dir.file("narrow.npy"))[6] == 1);
}

TEST_CASE("numpy loads what writeNpy writes, for every dtype", "[inspect][npy][numpy]") {
  test::TempDir dir;
  nlohmann::json files = nlohmann::json::array();
  std::vector<HostTensor> tensors;
  uint64_t seed = 100;
  for (DType dtype : kAllDTypes) {
    for (const auto& shape : std::vector<std::vector<int64_t>>{{}, {0, 3}, {5}, {2, 3, 4}}) {
      tensors.push_back(sample(dtype, shape, seed++));
      std::string path = dir.file("t" + std::to_string(tensors.size()) + ".npy");
      writeNpy(tensors.back(), path);
      files.push_back(path);
    }
  }
  test::writeText(dir.file("files.json"), files.dump());
  std::string out = python(R"(
res = []
for f in json.load(open(sys.argv[1])):
    a = np.load(f, allow_pickle=False)
    res.append({"descr": a.dtype.str, "shape": list(a.shape), "fortran": bool(a.flags.f_contiguous and a.ndim > 1),
                "hex": a.tobytes().hex()})
print(json.dumps(res))
)",
                           {dir.file("files.json")});
  auto loaded = nlohmann::json::parse(out);
  REQUIRE(loaded.size() == tensors.size());
  const std::map<DType, std::string> descr = {
      {DType::Float64, "<f8"}, {DType::Float32, "<f4"}, {DType::Float16, "<f2"},  {DType::BFloat16, "<f4"},
      {DType::Int8, "|i1"},    {DType::Int16, "<i2"},   {DType::Int32, "<i4"},    {DType::Int64, "<i8"},
      {DType::UInt8, "|u1"},   {DType::Bool, "|b1"},    {DType::Complex64, "<c8"}, {DType::Complex128, "<c16"}};
  for (size_t i = 0; i < tensors.size(); ++i) {
    const HostTensor& t = tensors[i];
    INFO(formats::dtypeName(t.dtype) << " shape " << nlohmann::json(t.shape).dump());
    CHECK(loaded[i]["descr"] == descr.at(t.dtype));
    CHECK(loaded[i]["shape"].get<std::vector<int64_t>>() == t.shape);
    CHECK(loaded[i]["hex"] == hex(t.dtype == DType::BFloat16 ? widenBFloat16(t.bytes) : t.bytes));
  }
}

TEST_CASE("readNpy loads what numpy writes, Fortran order and big-endian included", "[inspect][npy][numpy]") {
  test::TempDir dir;
  // Each case: a file numpy saved, and the expected C-order little-endian bytes.
  std::string out = python(R"(
d = sys.argv[1]
rng = np.random.default_rng(3)
cases = {
  "c_f4": rng.standard_normal((2, 3, 4)).astype(np.float32),
  "fortran_f8": np.asfortranarray(rng.standard_normal((3, 5))),
  "fortran_3d_i4": np.asfortranarray(np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4)),
  "fortran_empty": np.asfortranarray(np.zeros((3, 0), dtype=np.float32)),
  "be_f8": rng.standard_normal((4,)).astype(">f8"),
  "be_f4_nan": np.array([1.5, np.nan, -np.inf, 0.0], dtype=">f4"),
  "be_f2": np.array([1.0, -2.0, 65504.0], dtype=">f2"),
  "be_i2": np.arange(-3, 3, dtype=">i2"),
  "be_i4": np.arange(-3, 3, dtype=">i4").reshape(2, 3),
  "be_i8": np.array([-2**63, 2**63 - 1, 5], dtype=">i8"),
  "be_c8": np.array([1 + 2j, -3.5 - 0.25j], dtype=">c8"),
  "be_c16": np.array([[1 + 2j, np.nan + 1j]], dtype=">c16"),
  "fortran_be_c16": np.asfortranarray((np.arange(6) + 1j * np.arange(6)).reshape(2, 3).astype(">c16")),
  "bool": np.array([[True, False, True]]),
  "i1": np.array([-128, 0, 127], dtype=np.int8),
  "u1": np.array([0, 255], dtype=np.uint8),
  "scalar": np.array(3.25),
  "empty": np.zeros((0,), dtype=np.int64),
}
res = {}
for name, a in cases.items():
    path = f"{d}/{name}.npy"
    np.save(path, a)
    c = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"))
    res[name] = {"shape": list(a.shape), "hex": c.tobytes(order="C").hex(), "dtype": c.dtype.name}
for version in [(2, 0), (3, 0)]:
    name = f"v{version[0]}"
    a = np.arange(10, dtype=np.float32).reshape(2, 5)
    with open(f"{d}/{name}.npy", "wb") as f:
        np.lib.format.write_array(f, a, version=version)
    res[name] = {"shape": list(a.shape), "hex": a.tobytes().hex(), "dtype": a.dtype.name}
print(json.dumps(res))
)",
                           {dir.path()});
  auto cases = nlohmann::json::parse(out);
  REQUIRE(cases.size() == 20);
  for (auto& [name, expected] : cases.items()) {
    INFO("case " << name);
    HostTensor t = readNpy(dir.file(name + ".npy"));
    CHECK(formats::dtypeName(t.dtype) == expected["dtype"].get<std::string>());
    CHECK(t.shape == expected["shape"].get<std::vector<int64_t>>());
    CHECK(hex(t.bytes) == expected["hex"].get<std::string>());
  }
}

TEST_CASE("readNpy refuses object arrays, structured dtypes and pickles as unsupported", "[inspect][npy][numpy]") {
  test::TempDir dir;
  python(R"(
import pickle
d = sys.argv[1]
np.save(f"{d}/object.npy", np.array([1, "a", None], dtype=object), allow_pickle=True)
np.save(f"{d}/structured.npy", np.zeros(3, dtype=[("x", "<i4"), ("y", "<f8")]))
np.save(f"{d}/utf8.npy", np.zeros(2, dtype=[("\u4e2d", "<i4")]))   # numpy writes version 3.0
np.save(f"{d}/u4.npy", np.arange(3, dtype=np.uint32))
np.save(f"{d}/str.npy", np.array(["ab", "c"]))
with open(f"{d}/plain.pickle", "wb") as f:
    pickle.dump({"a": 1}, f, protocol=2)
np.savez(f"{d}/arch.npz", a=np.arange(3))
)",
         {dir.path()});
  auto refuse = [&](const std::string& file, const std::string& expected) {
    INFO(file);
    try {
      readNpy(dir.file(file));
      FAIL("expected Error{Unsupported}");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::Unsupported);
      CHECK_THAT(e.message(), Catch::Contains(expected));
    }
  };
  refuse("object.npy", "object array (descr \"|O\")");
  refuse("structured.npy", "structured dtype");
  refuse("structured.npy", "'x'");
  refuse("utf8.npy", "structured dtype");
  CHECK(test::readFile(dir.file("utf8.npy"))[6] == 3);
  refuse("u4.npy", "descr \"<u4\"");
  refuse("str.npy", "descr \"<U2\"");
  refuse("plain.pickle", "Python pickle");
  refuse("arch.npz", "zip archive");
}

TEST_CASE("readNpy reports a data size that does not match the file with expected and found bytes",
          "[inspect][npy]") {
  std::vector<uint8_t> data(24, 0);
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  auto good = npyBytes(dict, data);

  auto truncated = good;
  truncated.resize(truncated.size() - 4);
  Error e = readError(truncated);
  CHECK(e.code() == ErrorCode::Corrupt);
  CHECK_THAT(e.message(), Catch::Contains("needs 24 bytes of data after the 128-byte header, found 20") &&
                              Catch::Contains("truncated"));

  auto longer = good;
  longer.push_back(0);
  e = readError(longer);
  CHECK(e.code() == ErrorCode::Corrupt);
  CHECK_THAT(e.message(), Catch::Contains("needs 24 bytes") && Catch::Contains("found 25"));
}

TEST_CASE("readNpy rejects malformed headers as corrupt without evaluating them", "[inspect][npy]") {
  auto corrupt = [](const std::string& dict, const std::string& expected, std::vector<uint8_t> data = {}) {
    INFO(dict);
    Error e = readError(npyBytes(dict, data));
    CHECK(e.code() == ErrorCode::Corrupt);
    CHECK_THAT(e.message(), Catch::Contains(expected));
  };
  corrupt("{'descr': '<f4', 'fortran_order': False}", "lacks the key shape");
  corrupt("{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}", "unexpected header key \"extra\"");
  corrupt("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}", "appears twice");
  corrupt("{'descr': '<f4', 'fortran_order': False, 'shape': __import__('os').system('false')}", "malformed header");
  corrupt("{'descr': '<f4', 'fortran_order': 0, 'shape': ()}", "fortran_order");
  corrupt("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", "non-negative");
  corrupt("{'descr': '<f4', 'fortran_order': False, 'shape': (3)}", "one-element tuple");
  corrupt("{'descr': '<f4', 'fortran_order': False, 'shape': [3]}", "expected a tuple");
  corrupt("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", "expected ',' or '}'");
  corrupt("{'descr': '<f4' 'fortran_order': False, 'shape': ()}", "malformed header");
  corrupt("{'descr': '<f4\\n', 'fortran_order': False, 'shape': ()}", "without escapes");
  corrupt("['descr', '<f4']", "dict literal");
  corrupt("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", "below 2^64");
  corrupt("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", "more than 2^64 bytes");
  corrupt("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } junk", "only padding");
  // Deep nesting is refused, not recursed into.
  corrupt("{'descr': " + std::string(10000, '[') + std::string(10000, ']') + "}", "levels of nesting");
}

TEST_CASE("readNpy accepts headers numpy and its older versions write", "[inspect][npy]") {
  test::TempDir dir;
  // Python 2 era shapes with an 'L' suffix, double quotes, no trailing comma.
  std::vector<uint8_t> data = {1, 0, 2, 0, 3, 0, 4, 0};
  test::writeFile(dir.file("old.npy"),
                  npyBytes("{\"descr\": \"<i2\", \"fortran_order\": False, \"shape\": (2L, 2L)}", data));
  HostTensor t = readNpy(dir.file("old.npy"));
  CHECK(t.dtype == DType::Int16);
  CHECK(t.shape == std::vector<int64_t>{2, 2});
  CHECK(t.bytes == data);

  // Non-zero bool bytes read as True (1), as numpy does.
  test::writeFile(dir.file("bool.npy"),
                  npyBytes("{'descr': '|b1', 'fortran_order': True, 'shape': (3,), }", {0, 1, 7}));
  CHECK(readNpy(dir.file("bool.npy")).bytes == std::vector<uint8_t>{0, 1, 1});
}

TEST_CASE("readNpy bounds the header, the version and the data size", "[inspect][npy]") {
  // Not a .npy at all.
  Error e = readError({'h', 'e', 'l', 'l', 'o', '!', 1, 0, 0, 0});
  CHECK(e.code() == ErrorCode::Corrupt);
  CHECK_THAT(e.message(), Catch::Contains("expected the magic"));
  CHECK(readError({}).code() == ErrorCode::Corrupt);
  CHECK(readError({0x93, 'N', 'U', 'M'}).code() == ErrorCode::Corrupt);

  // An unknown version.
  e = readError({0x93, 'N', 'U', 'M', 'P', 'Y', 4, 0, 10, 0, '{', '}'});
  CHECK(e.code() == ErrorCode::Unsupported);
  CHECK_THAT(e.message(), Catch::Contains("version 4.0"));

  // A header longer than the file.
  e = readError({0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0xff, 0x00, '{', '}'});
  CHECK(e.code() == ErrorCode::Corrupt);
  CHECK_THAT(e.message(), Catch::Contains("header of 255 bytes") && Catch::Contains("12-byte file"));

  // A version 2.0 header length far beyond any real header is refused before allocating.
  e = readError({0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0xff, 0xff, 0xff, 0xff, '{', '}'});
  CHECK(e.code() == ErrorCode::LimitExceeded);
  CHECK_THAT(e.message(), Catch::Contains("4294967295-byte header"));

  // Data above the caller's limit.
  e = readError(npyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1000,), }", std::vector<uint8_t>(8000)),
                4096);
  CHECK(e.code() == ErrorCode::LimitExceeded);
  CHECK_THAT(e.message(), Catch::Contains("8000 bytes") && Catch::Contains("limit is 4096"));

  // A huge declared shape fails on the size check, not on allocation.
  e = readError(npyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000, 1000000), }", {}));
  CHECK(e.code() == ErrorCode::LimitExceeded);
}

TEST_CASE("readNpy refuses a descr with the wrong byte-order character", "[inspect][npy]") {
  Error e = readError(npyBytes("{'descr': '|f4', 'fortran_order': False, 'shape': (), }", {0, 0, 0, 0}));
  CHECK(e.code() == ErrorCode::Unsupported);
  CHECK_THAT(e.message(), Catch::Contains("\"|f4\""));
}

TEST_CASE("readNpy and writeNpy report missing files and unwritable paths", "[inspect][npy]") {
  test::TempDir dir;
  try {
    readNpy(dir.file("missing.npy"));
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::NotFound);
    CHECK_THAT(e.message(), Catch::Contains("missing.npy"));
  }
  CHECK_THROWS_AS(writeNpy(sample(DType::Float32, {2}, 1), dir.file("no/such/dir/a.npy")), Error);
  try {
    readNpy(dir.path());
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
  }
}

TEST_CASE("readNpy either loads or throws crashcap::Error on mutated and truncated files", "[inspect][npy]") {
  test::TempDir dir;
  std::vector<std::vector<uint8_t>> seeds;
  for (DType dtype : {DType::Float32, DType::Complex128, DType::Bool}) {
    writeNpy(sample(dtype, {3, 4}, 9), dir.file("seed.npy"));
    seeds.push_back(test::readFile(dir.file("seed.npy")));
  }
  std::mt19937_64 rng(11);
  const std::string path = dir.file("mutant.npy");
  int loaded = 0, refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint8_t> bytes = seeds[rng() % seeds.size()];
    switch (rng() % 3) {
      case 0:   // flip bytes, mostly in the header
        for (int k = 0, n = int(rng() % 4) + 1; k < n; ++k) bytes[rng() % std::min<size_t>(bytes.size(), 140)] = uint8_t(rng());
        break;
      case 1:   // truncate
        bytes.resize(rng() % bytes.size());
        break;
      default:  // overwrite a header character with one that matters to the parser
        bytes[10 + rng() % 118] = uint8_t("{}()[],:'\"0123456789-L \n"[rng() % 24]);
        break;
    }
    test::writeFile(path, bytes);
    try {
      HostTensor t = readNpy(path, 1 << 20);
      CHECK(t.bytes.size() == t.numel() * formats::elementSize(t.dtype));
      ++loaded;
    } catch (const Error&) {
      ++refused;
    }
  }
  CHECK(refused > 0);
  CHECK(loaded + refused == 3000);
}
