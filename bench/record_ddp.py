#!/usr/bin/env python3
"""What the Python recorder costs a 2-rank DDP training step: the Python sample's model, optimizer
and loss (samples/python/train.py) wrapped in DistributedDataParallel on the Gloo backend, two
ranks on this machine (one thread each), trained twice per round, interleaved, the order rotated
each round, as `./dev bench record --python` does for one process:
  baseline  no recorder
  recorded  crashcap.Recorder on every rank with its default policy (keyframes, op ring and
            collectives, fingerprints, generators)
Each rank trains on its own half of batches taken from the sample's DataLoader once, before the
rounds. A run's step time is rank 0's median step (the first steps, warm-up, excluded; the ranks
move in lockstep through their all-reduces); each ratio is per round; the reported ratio is the
median over rounds, with its min and max, its 95% interval (bench/ratios.py) and whether that
interval shows the target met.

    ./dev bench record --ddp [--json] [--rounds N] [--steps N]
"""

import argparse
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import crashcap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ratios import median_interval, target_verdict  # noqa: E402  (bench/ratios.py)

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("sample", os.path.join(HERE, "..", "samples", "python", "train.py"))
sample = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sample)

WARMUP = 3
WORLD = 2


def run(batches, record_dir):
    """One training of this rank over `batches`: its median step in ms."""
    torch.manual_seed(0)
    model = DistributedDataParallel(sample.Net(10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-2)
    rec = crashcap.Recorder(record_dir, model=model, optimizer=optimizer, quiet=True) if record_dir else None
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
        now = time.perf_counter()
        times.append(now - last)
        last = now
    if rec:
        rec.close()
    return 1000 * statistics.median(times[WARMUP:])


def cpu_model():
    """The processor's model name: the same code gives different ratios on different processors."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return "unknown"


def rank_main(a):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = sample.DataLoader(sample.Shapes(32 * a.steps * WORLD, 10, "none"),
                               batch_sampler=sample.Batches(32 * a.steps * WORLD, 32, 0, -1, 0), num_workers=0)
    batches = list(loader)[rank::WORLD]
    scratch = tempfile.mkdtemp(prefix=f"crashcap-bench-record-ddp-{rank}-")
    base, recd, ratios = [], [], []
    try:
        for r in range(a.rounds):
            results = {}
            for which in ([0, 1] if r % 2 == 0 else [1, 0]):
                dist.barrier()
                results[which] = run(batches, os.path.join(scratch, str(r)) if which else None)
            b, c = results[0], results[1]
            base.append(b)
            recd.append(c)
            ratios.append(c / b)
            if rank == 0 and not a.json:
                print(f"round {r + 1}: baseline {b:.2f} ms  recorded {c:.2f} ms (x{c / b:.3f})", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    dist.destroy_process_group()
    if rank != 0:
        return 0
    out = {
        "task": "python-sample-ddp",
        "ranks": WORLD,
        "backend": "gloo",
        "steps_per_run": a.steps,
        "rounds": a.rounds,
        "warmup_steps_excluded": WARMUP,
        "baseline_step_ms": statistics.median(base),
        "recorded_step_ms": statistics.median(recd),
        "overhead_ratio": statistics.median(ratios),
        "overhead_ratio_spread": {"min": min(ratios), "max": max(ratios)},
        "overhead_ratio_interval": {k: v for k, v in median_interval(ratios).items() if k != "median"},
        "target": 1.03,
        "target_verdict": target_verdict(median_interval(ratios), 1.03),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
    }
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        i = out["overhead_ratio_interval"]
        print(f"overhead x{out['overhead_ratio']:.3f} (x{min(ratios):.3f}..x{max(ratios):.3f}; "
              f"{i['confidence'] * 100:.0f}% interval x{i['low']:.3f}..x{i['high']:.3f}: target x{out['target']} "
              f"{out['target_verdict']}) of a {out['recorded_step_ms']:.2f} ms step, {WORLD} ranks")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--steps", type=int, default=60)
    a = p.parse_args()
    if "RANK" in os.environ:
        return rank_main(a)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = [subprocess.Popen([sys.executable, *sys.argv],
                              env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(WORLD),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for r in range(WORLD)]
    codes = [r.wait() for r in ranks]
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
