#!/usr/bin/env python3
"""Where the training thread's time goes in a recorded run: the Python sample
(samples/python/train.py) run as `crashcap run --record` runs it, with each of the recorder's calls
on the training thread timed by the thread's own processor time (time.thread_time_ns), per call.
The first call of each is the first step's (the model found, the first keyframe), except the
generator states', whose first is the observer's before the DataLoader forks its workers
(crashcap._state.prepare_before_fork): the medians are the steady state, the totals include it.

    PYTHONPATH=build/python build/bin/crashcap run --record -- \\
        /usr/bin/python3 bench/recorder_calls.py [--steps N] [--json]

Run it under crashcap run --record: the observer that bootstrap installs is what is timed. Alone
(no observer), it says so and times nothing.
"""

import argparse
import atexit
import importlib.util
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    importlib.import_module("torch")  # the bootstrap loads the observer when torch is imported
    if "crashcap._observe" not in sys.modules:
        sys.exit("recorder_calls.py: no crashcap observer in this process: run it under "
                 "`crashcap run --record -- /usr/bin/python3 bench/recorder_calls.py`")
    import crashcap._native as native
    import crashcap._observe as observe
    import crashcap._recorder as recorder
    import crashcap._state as state

    times = {}

    def timed(cls, name, label):
        fn = getattr(cls, name)
        times[label] = []

        def run(*args, **kwargs):
            t0 = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                times[label].append((time.thread_time_ns() - t0) / 1e3)
        setattr(cls, name, run)

    # Outermost first: each line includes the ones below it that it calls.
    timed(observe.Observer, "on_batch", "on_batch (observer, a batch taken)")
    timed(recorder.Recorder, "begin", "  Recorder.begin")
    timed(native.Recorder, "begin_step", "    native begin_step (copies the batch)")
    timed(state._Generators, "__call__", "      Python generator states")
    timed(observe.Observer, "on_backward", "on_backward (observer, after backward())")
    timed(native.Step, "end", "  native end (fingerprints)")
    timed(observe.Observer, "on_optimizer_step", "on_optimizer_step (observer)")
    timed(native.Step, "finish", "  native finish")

    def report():
        rows = [{"call": k, "calls": len(v), "median_us": statistics.median(v), "total_ms": sum(v) / 1e3,
                 "first_us": v[0]} for k, v in times.items() if v]
        if a.json:
            print(json.dumps({"steps": a.steps, "calls": rows}, indent=1))
            return
        print(f"{'call':44} {'calls':>5} {'median us':>10} {'first us':>10} {'total ms':>9}")
        for r in rows:
            print(f"{r['call']:44} {r['calls']:>5} {r['median_us']:>10.0f} {r['first_us']:>10.0f} {r['total_ms']:>9.1f}")
    atexit.register(report)

    spec = importlib.util.spec_from_file_location("sample", os.path.join(HERE, "..", "samples", "python", "train.py"))
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)
    sample.main(["--steps", str(a.steps), "--quiet"])


if __name__ == "__main__":
    main()
