// The gradient norm of a step's fingerprint (formats/torch/fingerprint.hpp).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "crashcap/formats/torch/fingerprint.hpp"

using crashcap::formats::GradNormMethod;
using crashcap::formats::torch::gradientNorm;

namespace {

std::vector<at::Tensor> someGradients() {
  at::manual_seed(7);
  // Sizes that do not divide into blocks or lanes; 36 blocks in all, enough for the sum to be
  // split across threads (a task takes at least 16 blocks).
  return {at::randn({1000, 333}) * 1e-3, at::randn({70001}), at::randn({5}), at::randn({3, 65536 + 17}) * 10,
          at::randn({1500, 1001})};
}

bool sameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("float32 CPU gradients get the blocked norm, within float rounding of LibTorch's") {
  auto grads = someGradients();
  auto norm = gradientNorm(grads);
  CHECK(norm.method == GradNormMethod::Blocked);
  const double reference = gradientNorm(grads, GradNormMethod::ForeachNorm);
  CHECK(norm.value == Approx(reference).epsilon(1e-5));
  CHECK_FALSE(sameBits(norm.value, 0.0));
}

TEST_CASE("the blocked norm has the same bits on any thread count and when recomputed") {
  auto grads = someGradients();
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  const double one = gradientNorm(grads).value;
  at::set_num_threads(std::max(2, before));
  const double many = gradientNorm(grads).value;
  at::set_num_threads(before);
  CHECK(sameBits(one, many));
  CHECK(sameBits(one, gradientNorm(grads, GradNormMethod::Blocked)));
}

TEST_CASE("a replay in another dtype recomputes a blocked norm as LibTorch's, in that dtype") {
  // A float64 reference replay of a float32 recording: 1e30 squares overflow float32, not float64.
  std::vector<at::Tensor> wide = {at::full({100}, 1e30, at::kDouble)};
  const double norm = gradientNorm(wide, GradNormMethod::Blocked);
  CHECK(std::isfinite(norm));
  CHECK(sameBits(norm, at::stack(at::_foreach_norm(wide, 2)).norm().item<double>()));
}

TEST_CASE("gradients the blocked norm cannot read get LibTorch's norm, and say so") {
  SECTION("double") {
    std::vector<at::Tensor> grads = {at::randn({100}, at::kDouble)};
    auto norm = gradientNorm(grads);
    CHECK(norm.method == GradNormMethod::ForeachNorm);
    CHECK(sameBits(norm.value, at::stack(at::_foreach_norm(grads, 2)).norm().item<double>()));
  }
  SECTION("not contiguous") {
    std::vector<at::Tensor> grads = {at::randn({40, 30}).t()};
    CHECK(gradientNorm(grads).method == GradNormMethod::ForeachNorm);
  }
}

TEST_CASE("a non-finite blocked norm is LibTorch's verdict: overflow falls back, NaN and Inf stay") {
  SECTION("finite gradients whose squares overflow float32") {
    std::vector<at::Tensor> grads = {at::full({1000}, 1e20f)};
    auto norm = gradientNorm(grads);
    CHECK(norm.method == GradNormMethod::ForeachNorm);
    CHECK(sameBits(norm.value, at::stack(at::_foreach_norm(grads, 2)).norm().item<double>()));
  }
  SECTION("a NaN") {
    auto g = at::randn({200000});
    g[123456] = std::numeric_limits<float>::quiet_NaN();
    auto norm = gradientNorm({g});
    CHECK(std::isnan(norm.value));
    CHECK(norm.method == GradNormMethod::Blocked);
  }
  SECTION("an Inf") {
    auto g = at::randn({100});
    g[3] = std::numeric_limits<float>::infinity();
    CHECK_FALSE(std::isfinite(gradientNorm({g}).value));
  }
}

TEST_CASE("a sparse gradient counts as its coalesced values, by either method") {
  // An embedding's sparse gradient: one entry per looked-up row, the same row twice (summed).
  at::manual_seed(3);
  auto indices = at::tensor({4, 1, 4, 7}, at::kLong).unsqueeze(0);
  auto values = at::randn({4, 6});
  auto sparse = at::sparse_coo_tensor(indices, values, {10, 6});
  auto dense = sparse.to_dense();
  auto other = at::randn({6, 3});
  const auto norm = gradientNorm({sparse, other});
  CHECK(norm.method == GradNormMethod::Blocked);
  CHECK(norm.value == Approx(gradientNorm({dense, other}).value).epsilon(1e-6));
  CHECK(sameBits(norm.value, gradientNorm({sparse, other}, GradNormMethod::Blocked)));
  CHECK(gradientNorm({sparse, other}, GradNormMethod::ForeachNorm) == Approx(norm.value).epsilon(1e-6));
}

TEST_CASE("a norm that overflows float32 over finite gradients says so; one over a NaN does not") {
  std::vector<at::Tensor> huge = {at::full({64}, 1e25f)};
  auto norm = gradientNorm(huge);
  CHECK_FALSE(std::isfinite(norm.value));
  CHECK(norm.overflowed);
  std::vector<at::Tensor> strided = {at::full({64, 2}, 1e25f).t()};  // LibTorch's norm from the start
  CHECK(gradientNorm(strided).overflowed);
  std::vector<at::Tensor> nan = {at::full({64}, 1e25f), at::full({4}, NAN)};
  CHECK_FALSE(gradientNorm(nan).overflowed);
  CHECK_FALSE(gradientNorm(someGradients()).overflowed);
}
