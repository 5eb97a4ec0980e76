"""The Python benchmarks' interval for a median ratio (bench/ratios.py) gives what bench/ratios.hpp
gives the C++ ones: the order statistics of the published tables, their binomial confidence, and
the verdict a target gets."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from ratios import median_interval, target_verdict  # noqa: E402


@pytest.mark.parametrize("n,low,high,confidence", [(6, 1, 6, 0.96875), (10, 2, 9, 0.978515625),
                                                   (20, 6, 15, 0.958610535), (30, 10, 21, 0.957226055),
                                                   (40, 14, 27, 0.961522692), (100, 40, 61, 0.964799800)])
def test_a_median_s_95_percent_interval_is_the_k_th_smallest_and_largest_as_the_tables_give(n, low, high, confidence):
    m = median_interval(list(range(n, 0, -1)))  # the order the rounds came in does not matter
    assert (m["low"], m["high"]) == (low, high)
    assert m["confidence"] == pytest.approx(confidence, abs=1e-6)
    assert m["median"] == (n + 1) / 2


def test_too_few_rounds_give_the_whole_range_with_the_confidence_it_has():
    assert median_interval([1, 2, 3, 4, 5]) == {"median": 3, "low": 1, "high": 5, "confidence": 0.9375}
    assert median_interval([1.07]) == {"median": 1.07, "low": 1.07, "high": 1.07, "confidence": 0}


def test_a_target_is_met_only_when_the_whole_interval_is_at_or_below_it():
    low = [0.96 + 0.003 * i for i in range(30)]
    high = [1.02 + 0.003 * i for i in range(30)]
    wide = [0.90 + 0.01 * i for i in range(30)]
    assert target_verdict(median_interval(low), 1.03) == "met"
    assert target_verdict(median_interval(high), 1.03) == "missed"
    assert target_verdict(median_interval(wide), 1.03) == "undecided"
    # Five rounds, all above the target, reach 93.75% at most: not enough to call it missed.
    few = [1.10, 1.11, 1.12, 1.13, 1.14]
    assert target_verdict(median_interval(few), 1.03) == "undecided"
    assert target_verdict(median_interval(few), 1.03, 0.9) == "missed"
