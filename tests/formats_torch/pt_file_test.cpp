// Tests of .pt files: what savePt writes, Python's torch.load must read (checked in a child
// Python process, byte for byte), and loadPt must read what Python's torch.save writes.

#include "crashcap/formats/torch/pt_file.hpp"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "crashcap/formats/error.hpp"
#include "test_support.hpp"

namespace ft = crashcap::formats::torch;
using crashcap::Error;
using crashcap::ErrorCode;
using crashcap::test::TempDir;

namespace {

// Debian's python3-torch goes with Debian's libtorch; a python3 elsewhere on PATH may lack torch.
const char* const kPython = "/usr/bin/python3";

// For each file: "<dtype> <shape> <sum>" (the sum as float64, real part only) and then the
// hex of its values' bytes in row-major order.
const char* const kDescribe = R"(
import sys, torch
for path in sys.argv[1:]:
    t = torch.load(path)
    assert type(t) is torch.Tensor, f"{path}: torch.load returned {type(t)}"
    print(t.dtype, list(t.shape), float(t.detach().real.double().sum() if t.is_complex() else t.double().sum()))
    print(bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist()).hex())
)";

std::string hexOf(const at::Tensor& t) {
  at::Tensor c = t.resolve_conj().contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  std::string out;
  static const char* kDigits = "0123456789abcdef";
  for (size_t i = 0; i < c.nbytes(); ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 15];
  }
  return out;
}

// Runs Python on `paths` and returns its stdout lines; fails the test (never skips) when
// Python cannot load any of them.
std::vector<std::string> describeInPython(const std::vector<std::string>& paths) {
  std::vector<std::string> argv = {kPython, "-c", kDescribe};
  argv.insert(argv.end(), paths.begin(), paths.end());
  auto r = crashcap::test::run(argv);
  INFO("python stdout:\n" << r.out << "\npython stderr:\n" << r.err);
  REQUIRE(r.exitCode == 0);
  std::vector<std::string> lines;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 2 * paths.size());
  return lines;
}

void runPython(const std::string& code) {
  auto r = crashcap::test::run({kPython, "-c", code});
  INFO("python code:\n" << code << "\npython stderr:\n" << r.err);
  REQUIRE(r.exitCode == 0);
}

std::string pyQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\\' || c == '\'') out += '\\';
    out += c;
  }
  return out + "'";
}

struct Case {
  std::string file;
  at::Tensor tensor;
  std::string summary;  ///< the first line Python prints
};

}  // namespace

TEST_CASE("Python's torch.load reads what savePt writes, dtype, shape and bytes", "[formats_torch][pt][python]") {
  TempDir dir;
  at::Tensor c64 = at::complex(at::arange(4, at::kFloat), at::full({4}, -1.f)).reshape({2, 2});
  std::vector<Case> cases = {
      {"f32.pt", at::arange(6, at::kFloat).reshape({2, 3}), "torch.float32 [2, 3] 15.0"},
      {"f64_0d.pt", at::scalar_tensor(-2.25, at::kDouble), "torch.float64 [] -2.25"},
      {"f16.pt", at::arange(4, at::kFloat).to(at::kHalf), "torch.float16 [4] 6.0"},
      {"bf16.pt", at::arange(8, at::kFloat).reshape({2, 2, 2}).to(at::kBFloat16), "torch.bfloat16 [2, 2, 2] 28.0"},
      {"bool.pt", at::arange(7, at::kInt) % 2 == 0, "torch.bool [7] 4.0"},
      {"c64.pt", c64, "torch.complex64 [2, 2] 6.0"},
      {"c128_conj.pt", c64.to(at::kComplexDouble).conj(), "torch.complex128 [2, 2] 6.0"},
      {"i8.pt", at::arange(-3, 3, at::kChar), "torch.int8 [6] -3.0"},
      {"i64_empty.pt", at::empty({0, 3}, at::kLong), "torch.int64 [0, 3] 0.0"},
      {"u8.pt", at::arange(250, 256, at::kInt).to(at::kByte), "torch.uint8 [6] 1515.0"},
      {"transposed.pt", at::arange(12, at::kInt).reshape({3, 4}).t(), "torch.int32 [4, 3] 66.0"},
      {"step.pt", at::arange(1000, at::kShort).slice(0, 0, 1000, 100), "torch.int16 [10] 4500.0"},
  };
  std::vector<std::string> paths;
  for (const auto& c : cases) {
    paths.push_back(dir.file(c.file));
    ft::savePt(c.tensor, paths.back());
  }

  auto lines = describeInPython(paths);
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO(cases[i].file);
    REQUIRE(lines[2 * i] == cases[i].summary);
    REQUIRE(lines[2 * i + 1] == hexOf(cases[i].tensor));
  }
}

TEST_CASE("savePt of a small slice of a large tensor stores only the slice", "[formats_torch][pt]") {
  TempDir dir;
  at::Tensor big = at::zeros({1 << 20}, at::kFloat);  // 4 MiB
  ft::savePt(big.slice(0, 1000, 1010), dir.file("slice.pt"));
  REQUIRE(crashcap::test::readFile(dir.file("slice.pt")).size() < 8192);
  at::Tensor back = ft::loadPt(dir.file("slice.pt"));
  REQUIRE(back.sizes() == at::IntArrayRef({10}));
}

TEST_CASE("loadPt reads a tensor Python saved with torch.save", "[formats_torch][pt][python]") {
  TempDir dir;
  std::string plain = dir.file("plain.pt"), view = dir.file("view.pt"), bf16 = dir.file("bf16.pt");
  runPython("import torch\n"
            "torch.save(torch.arange(6.).reshape(2,3), " + pyQuote(plain) + ")\n"
            "torch.save(torch.arange(20, dtype=torch.int64)[3:15:4], " + pyQuote(view) + ")\n"
            "torch.save(torch.tensor([1.5, -2.0, float('inf')], dtype=torch.bfloat16), " + pyQuote(bf16) + ")\n");

  at::Tensor t = ft::loadPt(plain);
  REQUIRE(t.scalar_type() == at::kFloat);
  REQUIRE(t.sizes() == at::IntArrayRef({2, 3}));
  REQUIRE(at::equal(t, at::arange(6, at::kFloat).reshape({2, 3})));

  at::Tensor v = ft::loadPt(view);
  REQUIRE(v.scalar_type() == at::kLong);
  REQUIRE(at::equal(v, at::tensor({3, 7, 11}, at::kLong)));

  at::Tensor b = ft::loadPt(bf16);
  REQUIRE(b.scalar_type() == at::kBFloat16);
  REQUIRE(hexOf(b) == "c03f00c0807f");
}

TEST_CASE("savePt then loadPt round-trips every dtype bit-exactly", "[formats_torch][pt]") {
  TempDir dir;
  std::vector<at::Tensor> tensors = {
      at::randn({3, 5}, at::kDouble),
      at::randn({4}, at::kFloat),
      at::tensor({std::nanf(""), -0.f, INFINITY}, at::kFloat),
      at::randn({2, 2}).to(at::kHalf),
      at::randn({2, 2}).to(at::kBFloat16),
      at::arange(-5, 5, at::kChar),
      at::arange(-5, 5, at::kShort),
      at::arange(-5, 5, at::kInt),
      at::arange(-5, 5, at::kLong).reshape({2, 5}).t(),
      at::arange(0, 10, at::kByte),
      at::arange(10, at::kInt) > 4,
      at::randn({3}, at::kComplexFloat),
      at::randn({3}, at::kComplexDouble),
      at::scalar_tensor(7, at::kLong),
      at::empty({2, 0}, at::kFloat),
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    std::string path = dir.file(std::to_string(i) + ".pt");
    INFO(path << " " << t.scalar_type() << " " << t.sizes());
    ft::savePt(t, path);
    at::Tensor back = ft::loadPt(path);
    REQUIRE(back.scalar_type() == t.scalar_type());
    REQUIRE(back.sizes() == t.sizes());
    REQUIRE(hexOf(back) == hexOf(t));
  }
}

TEST_CASE("savePt to an unwritable path throws Io naming the path", "[formats_torch][pt][errors]") {
  TempDir dir;
  std::string path = dir.file("no/such/dir/t.pt");
  try {
    ft::savePt(at::ones({2}), path);
    FAIL("savePt wrote into a directory that does not exist");
  } catch (const Error& e) {
    REQUIRE(e.code() == ErrorCode::Io);
    REQUIRE_THAT(e.message(), Catch::Contains(path));
  }
}

TEST_CASE("loadPt refuses missing, corrupt and non-tensor files with distinct codes", "[formats_torch][pt][errors]") {
  TempDir dir;
  SECTION("a missing file is NotFound") {
    std::string path = dir.file("missing.pt");
    try {
      ft::loadPt(path);
      FAIL("loadPt read a file that does not exist");
    } catch (const Error& e) {
      REQUIRE(e.code() == ErrorCode::NotFound);
      REQUIRE_THAT(e.message(), Catch::Contains(path));
    }
  }
  SECTION("a file that is not a .pt archive is Corrupt") {
    std::string path = dir.file("garbage.pt");
    crashcap::test::writeText(path, "this is not a zip archive");
    try {
      ft::loadPt(path);
      FAIL("loadPt read garbage");
    } catch (const Error& e) {
      REQUIRE(e.code() == ErrorCode::Corrupt);
      REQUIRE_THAT(e.message(), Catch::Contains(path) && Catch::Contains("zip archive") && Catch::Contains("74 68 69 73"));
    }
  }
  SECTION("an empty file is Corrupt") {
    std::string path = dir.file("empty.pt");
    crashcap::test::writeText(path, "");
    REQUIRE_THROWS_MATCHES(ft::loadPt(path), Error, Catch::Predicate<Error>([](const Error& e) {
                             return e.code() == ErrorCode::Corrupt;
                           }));
  }
  SECTION("a truncated savePt file is Corrupt") {
    std::string path = dir.file("cut.pt");
    ft::savePt(at::arange(100, at::kFloat), path);
    auto bytes = crashcap::test::readFile(path);
    bytes.resize(bytes.size() / 2);
    crashcap::test::writeFile(path, bytes);
    try {
      ft::loadPt(path);
      FAIL("loadPt read a truncated file");
    } catch (const Error& e) {
      REQUIRE(e.code() == ErrorCode::Corrupt);
    }
  }
  SECTION("a file holding a dict of tensors is Unsupported") {
    // Two items: LibTorch 1.13's unpickler cannot read the SETITEM opcode of a one-item dict.
    std::string path = dir.file("dict.pt");
    runPython("import torch\ntorch.save({'a': torch.ones(2), 'b': torch.zeros(1)}, " + pyQuote(path) + ")\n");
    try {
      ft::loadPt(path);
      FAIL("loadPt returned a tensor from a dict");
    } catch (const Error& e) {
      REQUIRE(e.code() == ErrorCode::Unsupported);
      REQUIRE_THAT(e.message(), Catch::Contains("GenericDict") && Catch::Contains("not a single tensor"));
    }
  }
}
