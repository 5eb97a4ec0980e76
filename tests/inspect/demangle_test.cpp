// The demangler: kernel symbols made readable, and untrusted names that would demangle to
// gigabytes or never finish, which must stay mangled at a bounded cost.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "crashcap/inspect/demangle.hpp"
#include "trace_fixtures.hpp"

using namespace crashcap;
using inspect::testing::templatedKernelName;

namespace {

/// A mangled name whose demangled form doubles with each level: `f(a, p<a, a>, p<p<a, a>,
/// p<a, a> >, ...)`, 2^levels characters from 11 bytes a level.
std::string exponentialName(int levels) {
  auto substitution = [](int i) {
    if (i == 0) return std::string("S_");
    const char* digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    std::string seq;
    for (int n = i - 1;; n /= 36) {
      seq.insert(seq.begin(), digits[n % 36]);
      if (n < 36) break;
    }
    return "S" + seq + "_";
  };
  std::string s = "_Z1f1a1pIS_S_E";  // candidates: S_ = a, S0_ = p, S1_ = p<a, a>
  for (int k = 0; k < levels; ++k) s += "S0_I" + substitution(k + 2) + substitution(k + 2) + "E";
  return s;
}

}  // namespace

TEST_CASE("kernel symbols are demangled, and names that would take unbounded memory or time stay mangled",
          "[inspect][trace][demangle]") {
  CHECK(inspect::demangleSymbol("_Z11relu_kernelPfi") == "relu_kernel(float*, int)");
  CHECK(inspect::demangleSymbol("relu_kernel") == "relu_kernel");
  CHECK(inspect::demangleSymbol("_Znot a mangled name") == "_Znot a mangled name");
  CHECK(inspect::demangleSymbol("") == "");
  // PyTorch-style template kernels demangle; libstdc++ refuses names over 1024 characters (a
  // stack guard), and those come back whole, never cut.
  const auto name1000 = templatedKernelName(1000), name3000 = templatedKernelName(3000);
  REQUIRE(name1000.size() == 1000);
  REQUIRE(name3000.size() == 3000);
  CHECK_THAT(inspect::demangleSymbol(name1000),
             Catch::StartsWith("void at::native::kernel<at::native::ElementwiseFunctor_000, "
                               "at::native::ElementwiseFunctor_001, ") &&
                 Catch::EndsWith(">(float*, int)"));
  const auto long3000 = inspect::demangleSymbol(name3000);
  CHECK((long3000 == name3000 || Catch::endsWith(long3000, ">(float*, int)")));

  // Untrusted names: a small exponential one demangles; one of 100 MB stays mangled; one that
  // would never finish is given up on, and the names after it in the batch still demangle.
  auto small = inspect::demangleSymbol(exponentialName(8));
  CHECK_THAT(small, Catch::StartsWith("f(a, p<a, a>, p<p<a, a>, p<a, a> >, "));
  CHECK(small.size() > 5000);
  CHECK(inspect::demangleSymbol(exponentialName(22)) == exponentialName(22));
  const auto start = std::chrono::steady_clock::now();
  auto batch = inspect::demangleSymbols({"_Z11relu_kernelPfi", exponentialName(80), "relu", "_Z10add_kernelPfS_i"});
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  CHECK(batch == std::vector<std::string>{"relu_kernel(float*, int)", exponentialName(80), "relu",
                                          "add_kernel(float*, float*, int)"});
}
