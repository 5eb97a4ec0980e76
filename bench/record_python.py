#!/usr/bin/env python3
"""What the Python recorder costs a training step: the Python sample's model, optimizer, schedule
and loss (samples/python/train.py), trained twice per round, interleaved, the order rotated each
round so machine noise hits both alike:
  baseline  no recorder
  recorded  crashcap.Recorder with its default policy (keyframes every 50 steps, op ring,
            fingerprints, Python generators)
The batches come from the sample's DataLoader once, before the rounds, so that neither run waits
on worker processes: what is timed is the step and the recorder. A run's step time is its median
step (the first steps, warm-up, excluded); each ratio is per round; the reported ratio is the
median over rounds, with its min and max and its 95% interval (bench/ratios.py).

    ./dev bench record --python [--json] [--rounds N] [--steps N] [--threads T]
"""

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

import crashcap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ratios import median_interval  # noqa: E402  (bench/ratios.py)

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("sample", os.path.join(HERE, "..", "samples", "python", "train.py"))
sample = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sample)

WARMUP = 3


def run(batches, record_dir, threads):
    """One training over `batches`: (median step ms, median recorder ms per step, dropped records)."""
    torch.manual_seed(0)
    model = sample.Net(10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    rec, inside = None, []
    if record_dir:
        rec = crashcap.Recorder(record_dir, model=model, optimizer=optimizer, scheduler=scheduler, quiet=True)
        begin, end = rec.begin, rec.end

        def timed_begin(*a):
            t = time.perf_counter()
            begin(*a)
            inside.append(time.perf_counter() - t)

        def timed_end(*a):
            t = time.perf_counter()
            end(*a)
            inside[-1] += time.perf_counter() - t

        rec.begin, rec.end = timed_begin, timed_end
    model.train()
    steps = rec.steps(batches) if rec else enumerate(batches)
    times, last = [], time.perf_counter()
    for step, batch in steps:
        loss = sample.loss_of(model, batch, 1e-6)
        loss.backward()
        if rec:
            rec.end(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    dropped = 0
    if rec:
        dropped = rec.stats()["dropped_records"]
        rec.close()
    ms = 1000 * statistics.median(times[WARMUP:])
    rec_ms = 1000 * statistics.median(inside[WARMUP:]) if inside else 0.0
    return ms, rec_ms, dropped


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    loader = sample.DataLoader(sample.Shapes(32 * a.steps, 10, "none"),
                               batch_sampler=sample.Batches(32 * a.steps, 32, 0, -1, 0), num_workers=2)
    batches = list(loader)
    scratch = tempfile.mkdtemp(prefix="crashcap-bench-record-python-")
    base, recd, ratios, calls, dropped = [], [], [], [], 0
    try:
        for r in range(a.rounds):
            results = {}
            for which in ([0, 1] if r % 2 == 0 else [1, 0]):
                results[which] = run(batches, os.path.join(scratch, str(r)) if which else None, a.threads)
            b, (c, call, d) = results[0][0], results[1]
            base.append(b)
            recd.append(c)
            ratios.append(c / b)
            calls.append(call)
            dropped += d
            if not a.json:
                print(f"round {r + 1}: baseline {b:.2f} ms  recorded {c:.2f} ms (x{c / b:.3f})  recorder {call:.3f} ms",
                      file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = {
        "task": "python-sample",
        "steps_per_run": a.steps,
        "rounds": a.rounds,
        "warmup_steps_excluded": WARMUP,
        "baseline_step_ms": statistics.median(base),
        "recorded_step_ms": statistics.median(recd),
        "overhead_ratio": statistics.median(ratios),
        "overhead_ratio_spread": {"min": min(ratios), "max": max(ratios)},
        "overhead_ratio_interval": {k: v for k, v in median_interval(ratios).items() if k != "median"},
        "torch_threads": torch.get_num_threads(),
        "recorded_dropped_records": dropped,
        # The training thread's own time in the recorder per step (rec.steps' begin + rec.end).
        "recorder_call_ms": statistics.median(calls),
        "recorder_call_fraction": statistics.median(calls) / statistics.median(recd),
    }
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        i = out["overhead_ratio_interval"]
        print(f"overhead x{out['overhead_ratio']:.3f} (x{min(ratios):.3f}..x{max(ratios):.3f}; "
              f"{i['confidence'] * 100:.0f}% interval x{i['low']:.3f}..x{i['high']:.3f}); recorder "
              f"{out['recorder_call_ms']:.3f} ms of a {out['recorded_step_ms']:.2f} ms step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
