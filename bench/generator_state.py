#!/usr/bin/env python3
"""What reading Python's generator states costs a step (crashcap._state._Generators, called by
every begin()): random's Mersenne Twister read in place against the fallback that builds and
compares random.getstate()'s 625 ints, which is what every step paid before the in-place read and
what a Python whose layout does not match still pays. The two are interleaved in one process, 9
pairs of rounds of 20,000 calls; the thread's CPU time per call, the median of each and of the
pairs' ratios (docs/PERFORMANCE.md, "A fourteenth look"):

    PYTHONPATH=build/python /usr/bin/python3 bench/generator_state.py [--numpy]

--numpy imports numpy first, so that its global generator is read as well (in place too).
"""
import argparse
import importlib
import statistics
import time

from crashcap import _state


def per_call(generators, calls):
    generators()
    start = time.thread_time_ns()
    for _ in range(calls):
        generators()
    return (time.thread_time_ns() - start) / calls / 1000.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numpy", action="store_true", help="read numpy's global generator too")
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    if args.numpy:
        importlib.import_module("numpy")  # imported, so that _Generators reads it
    in_place = _state._Generators()
    fallback = _state._Generators()
    fallback._python_words = False  # as where the layout does not match: getstate() every call
    in_place(), fallback()
    if not in_place._python_words:
        raise SystemExit("random's state cannot be read in place on this Python: nothing to compare")
    a, b = [], []
    for _ in range(args.pairs):
        a.append(per_call(in_place, args.calls))
        b.append(per_call(fallback, args.calls))
    ratios = [x / y for x, y in zip(a, b)]
    print(f"in place  {statistics.median(a):7.2f} us a call  ({min(a):.2f}..{max(a):.2f})")
    print(f"getstate  {statistics.median(b):7.2f} us a call  ({min(b):.2f}..{max(b):.2f})")
    print(f"ratio     {statistics.median(ratios):7.3f}  ({min(ratios):.3f}..{max(ratios):.3f}), "
          f"{args.pairs} interleaved pairs of {args.calls} calls")


if __name__ == "__main__":
    main()
