#!/usr/bin/env python3
"""What holding the last freed graph costs a backward(): the observer keeps the roots of each
backward() that frees its graph, so that a later one failing with "Trying to backward through the
graph a second time" can be told whose graph it reached (docs/PYTHON.md). That is one list and one
tuple per call, inside the seam crashcap already runs after every backward().

A tiny graph (a 64x64 linear layer's sum, ~0.1 ms a backward on one CPU thread) makes the seam's
share as large as it gets: rounds alternate the real hold (A) and a no-op in its place (B), each
timing the same number of backward() calls, and the median ratio A/B with its interval is printed.

    PYTHONPATH=build/python /usr/bin/python3 bench/backward_seam.py [--rounds 15] [--calls 3000] [--json]
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ratios import median_interval  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()

    from crashcap import _observe
    _observe.install()
    _observe._observer.quiet = True  # a graph with no DataLoader: its warnings are not the point here
    torch.set_num_threads(1)
    layer, x = torch.nn.Linear(64, 64), torch.randn(32, 64)
    hold = _observe.Observer.on_graph_freed

    def timed():
        start = time.perf_counter()
        for _ in range(a.calls):
            layer(x).sum().backward()
        return time.perf_counter() - start

    ratios, per_call = [], []
    for _ in range(a.rounds):
        _observe.Observer.on_graph_freed = hold
        with_hold = timed()
        _observe.Observer.on_graph_freed = lambda *args, **kwargs: None
        without = timed()
        ratios.append(with_hold / without)
        per_call.append((with_hold - without) / a.calls * 1e6)
    _observe.Observer.on_graph_freed = hold
    result = {"rounds": a.rounds, "calls": a.calls, "ratio": median_interval(ratios),
              "extra_us_per_backward": median_interval(per_call)}
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        r, us = result["ratio"], result["extra_us_per_backward"]
        print(f"holding the freed graph: {r['median']:.4f} of a tiny backward() ({r['low']:.4f}..{r['high']:.4f}, "
              f"{r['confidence']:.0%}); {us['median']:.2f} us a call ({us['low']:.2f}..{us['high']:.2f})")


if __name__ == "__main__":
    main()
