// The benchmarks' interval for a median ratio (bench/ratios.hpp): the order statistics of the
// published tables for the distribution-free interval of a median, their confidence computed from
// the binomial, and the verdict a target gets from it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <vector>

#include "ratios.hpp"

using crashcap::bench::medianInterval;
using crashcap::bench::targetVerdict;

namespace {
std::vector<double> oneTo(int n) {
  std::vector<double> v(n);
  std::iota(v.begin(), v.end(), 1.0);
  return v;
}
}  // namespace

TEST_CASE("a median's 95% interval is the k-th smallest and largest of the ratios, as the tables give",
          "[bench]") {
  // n: (k-th smallest, k-th largest as a 1-based rank, confidence)
  struct Row { int n; double low, high, confidence; };
  for (auto row : {Row{6, 1, 6, 0.96875}, Row{10, 2, 9, 0.978515625}, Row{20, 6, 15, 0.958610535},
                   Row{30, 10, 21, 0.957226055}, Row{40, 14, 27, 0.961522692}, Row{100, 40, 61, 0.964799800}}) {
    INFO("n = " << row.n);
    auto values = oneTo(row.n);
    std::reverse(values.begin(), values.end());  // the order the rounds came in does not matter
    auto m = medianInterval(values);
    CHECK(m.low == row.low);
    CHECK(m.high == row.high);
    CHECK(m.confidence == Approx(row.confidence).epsilon(1e-6));
    CHECK(m.median == Approx((row.n + 1) / 2.0));
  }
}

TEST_CASE("too few rounds for 95% give the whole range with the confidence it has", "[bench]") {
  auto five = medianInterval(oneTo(5));
  CHECK(five.low == 1);
  CHECK(five.high == 5);
  CHECK(five.confidence == Approx(0.9375));
  auto one = medianInterval({1.07});
  CHECK(one.median == 1.07);
  CHECK(one.low == 1.07);
  CHECK(one.high == 1.07);
  CHECK(one.confidence == 0);
}

TEST_CASE("a target is met only when the whole interval is at or below it, missed only when above", "[bench]") {
  // 30 rounds whose interval is 0.987..1.020, 30 whose interval is 1.047..1.080, and 30 that straddle.
  std::vector<double> low, high, wide;
  for (int i = 0; i < 30; ++i) {
    low.push_back(0.96 + 0.003 * i);
    high.push_back(1.02 + 0.003 * i);
    wide.push_back(0.90 + 0.01 * i);
  }
  CHECK(targetVerdict(medianInterval(low), 1.03) == "met");
  CHECK(targetVerdict(medianInterval(high), 1.03) == "missed");
  CHECK(targetVerdict(medianInterval(wide), 1.03) == "undecided");
  // Five rounds, all above the target, reach 93.75% at most: not enough to call it missed.
  const std::vector<double> few = {1.10, 1.11, 1.12, 1.13, 1.14};
  CHECK(medianInterval(few).confidence < 0.95);
  CHECK(targetVerdict(medianInterval(few), 1.03) == "undecided");
  CHECK(targetVerdict(medianInterval(few), 1.03, 0.9) == "missed");
}
