"""What keeping the loop's own numbers costs a step (crashcap/_loop.py): a loop over a generator
that arms the capture at each item, as the observer does when the loader hands over a batch,
against the same loop unarmed; interleaved rounds, the median of each and their difference.

    PYTHONPATH=build/python /usr/bin/python3 bench/loop_numbers.py [--rounds 7] [--steps 20000]
"""

import argparse
import json
import statistics
import sys
import time

from crashcap import _loop


class _Native:
    """Takes the records the recorder would write."""

    def __init__(self):
        self.kept = 0

    def loop_state(self, step, frame, values):
        self.kept += 1


def _batches(n, native):
    for k in range(n):
        if native is not None:
            _loop.keep_at_body(native, k, sys._getframe())
        yield k


def _loop_us(n, native):
    step, epoch, lr, beta, best, name = 0, 0, 0.1, 0.0, 1e9, "run"  # a training loop's usual locals
    start = time.perf_counter()
    for i, _ in enumerate(_batches(n, native)):
        step += 1
        beta = min(1.0, beta + 0.001)
    return (time.perf_counter() - start) / n * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    bare, armed = [], []
    native = _Native()
    for _ in range(args.rounds):
        bare.append(_loop_us(args.steps, None))
        armed.append(_loop_us(args.steps, native))
    assert native.kept == args.rounds * args.steps, native.kept  # every step was captured
    result = {"bare_us": statistics.median(bare), "armed_us": statistics.median(armed),
              "cost_us": statistics.median(a - b for a, b in zip(armed, bare)),
              "cost_us_min": min(a - b for a, b in zip(armed, bare)),
              "cost_us_max": max(a - b for a, b in zip(armed, bare)), "rounds": args.rounds, "steps": args.steps}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"a step's loop numbers cost {result['cost_us']:.2f} us (min {result['cost_us_min']:.2f}, "
              f"max {result['cost_us_max']:.2f}; bare loop {result['bare_us']:.2f} us an iteration)")


if __name__ == "__main__":
    main()
