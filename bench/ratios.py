"""How sure a benchmark's median ratio is: bench/ratios.hpp's interval for the Python benchmarks.

With n ratios sorted, the k-th smallest and the k-th largest enclose the true median with
probability 1 - 2 P(B < k), B ~ Binomial(n, 1/2), whatever the noise's distribution (only that the
rounds are independent); k is the largest for which that is at least the level asked. A machine
whose runs spread by 15% gives medians a few percent apart from one run to the next: the interval
says whether a target such as 1.03 is shown met, missed, or neither.
"""

import math
import statistics


def median_interval(values, level=0.95):
    """{"median", "low", "high", "confidence"} of `values` (not empty); n < 6 cannot reach 95%: the
    interval is then [min, max], with the confidence it has."""
    v = sorted(values)
    n = len(v)
    term = [math.comb(n, i) / 2 ** n for i in range(n + 1)]
    k, tail = 1, term[0]
    for nxt in range(2, (n + 1) // 2 + 1):
        wider = tail + term[nxt - 1]
        if 1 - 2 * wider < level:
            break
        k, tail = nxt, wider
    return {"median": statistics.median(v), "low": v[k - 1], "high": v[n - k], "confidence": 1 - 2 * tail}


def target_verdict(interval, target, level=0.95):
    """"met" when the interval's high end is at or below `target`, "missed" when its low end is
    above it, else "undecided"; "undecided" too for an interval below `level` (fewer than 6 rounds
    for 95%)."""
    if interval["confidence"] < level:
        return "undecided"
    if interval["high"] <= target:
        return "met"
    if interval["low"] > target:
        return "missed"
    return "undecided"
