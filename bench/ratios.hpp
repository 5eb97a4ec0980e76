// How sure a benchmark's median ratio is. A machine whose runs spread by ±15% gives medians that
// land anywhere within a few percent of each other from one run of the command to the next, so a
// median alone cannot say whether a target like 1.03 is met. The interval below is the
// distribution-free one for a median: with n ratios sorted, the k-th smallest and the k-th
// largest enclose the true median with probability 1 - 2 P(B < k), B ~ Binomial(n, 1/2), whatever
// the noise's distribution (only that the rounds are independent), with k the largest for which
// that is at least the level asked. bench/ratios.py is the same for the Python benchmarks.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace crashcap::bench {

struct MedianInterval {
  double median = 0, low = 0, high = 0;
  double confidence = 0;  ///< the probability the interval holds the true median (>= the level asked when n allows)
};

/// The median of `values` and its distribution-free interval at `level` (n < 6 cannot reach 95%:
/// the interval is then [min, max], with the confidence it has). `values` must not be empty.
inline MedianInterval medianInterval(std::vector<double> values, double level = 0.95) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  MedianInterval m;
  m.median = n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
  // below[k] = P(B < k) = P(B <= k - 1), summed in logs: C(n, i) / 2^n overflows nothing for any n.
  auto term = [&](size_t i) {
    return std::exp(std::lgamma(double(n) + 1) - std::lgamma(double(i) + 1) - std::lgamma(double(n - i) + 1) -
                    double(n) * std::log(2.0));
  };
  size_t k = 1;
  double tail = term(0);  // P(B < 1)
  for (size_t next = 2; next <= (n + 1) / 2; ++next) {
    double wider = tail + term(next - 1);  // P(B < next)
    if (1 - 2 * wider < level) break;
    k = next;
    tail = wider;
  }
  m.low = values[k - 1];
  m.high = values[n - k];
  m.confidence = 1 - 2 * tail;
  return m;
}

/// Whether the interval shows a ratio target met: "met" (its high end is at or below it),
/// "missed" (its low end is above it), else "undecided" (more rounds, or a quieter machine). An
/// interval below `level` (fewer than 6 rounds for 95%) decides nothing: two rounds above a
/// target say little about the median.
inline std::string targetVerdict(const MedianInterval& m, double target, double level = 0.95) {
  if (m.confidence < level) return "undecided";
  if (m.high <= target) return "met";
  if (m.low > target) return "missed";
  return "undecided";
}

}  // namespace crashcap::bench
