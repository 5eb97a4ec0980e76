#pragma once
// Helpers for the inspect tests: building HostTensors, and running /usr/bin/python3 + numpy.

#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "crashcap/inspect/host_tensor.hpp"
#include "test_support.hpp"

namespace crashcap::inspect::testing {

/// A tensor of `dtype` holding `values` (raw element type T, row-major).
template <typename T>
HostTensor makeTensor(formats::DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  REQUIRE(t.bytes.size() == t.numel() * formats::elementSize(dtype));
  return t;
}

inline HostTensor floats(std::vector<int64_t> shape, const std::vector<float>& v) {
  return makeTensor(formats::DType::Float32, std::move(shape), v);
}

inline HostTensor doubles(std::vector<int64_t> shape, const std::vector<double>& v) {
  return makeTensor(formats::DType::Float64, std::move(shape), v);
}

/// The numpy interpreter the tests use; numpy comes from Debian's python3-numpy.
inline const char* const kPython = "/usr/bin/python3";

/// Fails the test loudly (never skips) when /usr/bin/python3 cannot import numpy.
inline void requireNumpy() {
  static int state = -1;   // -1 unknown, 0 missing, 1 present
  if (state < 0) {
    auto r = crashcap::test::run({kPython, "-c", "import numpy"}, 60);
    state = r.exitCode == 0 ? 1 : 0;
    if (!state) FAIL("these tests need numpy for /usr/bin/python3 (apt-get install python3-numpy): " << r.err);
  }
  if (!state) FAIL("numpy is not importable by /usr/bin/python3 (apt-get install python3-numpy)");
}

/// Runs a Python script (after `import numpy as np`) with arguments; returns its stdout and
/// fails the test with its stderr when it exits non-zero.
inline std::string python(const std::string& script, const std::vector<std::string>& args = {}) {
  requireNumpy();
  std::vector<std::string> argv = {kPython, "-c", "import sys, json\nimport numpy as np\n" + script};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = crashcap::test::run(argv, 300);
  INFO("python stderr:\n" << r.err);
  REQUIRE(r.exitCode == 0);
  return r.out;
}

}  // namespace crashcap::inspect::testing
