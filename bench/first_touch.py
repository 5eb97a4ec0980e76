#!/usr/bin/env python3
"""What copying a batch costs before and after the training has read it: the Python sample's
batches (samples/python/train.py) from its DataLoader with two workers, which hand each batch over
in shared memory this process has not read yet. Alternate batches are copied (clone of every
tensor) before the forward pass (as the recorder's beginStep does) or after it; both are timed,
and the forward pass too, by this process's processor time (every thread of it, not the workers).

    /usr/bin/python3 bench/first_touch.py [--epochs N] [--threads T] [--json]

The difference between the two copies is what the first read of the batch costs in this
process; the difference between the two forward passes, how much of it the forward no longer
pays when the copy came first.
"""

import argparse
import importlib.util
import json
import os
import statistics
import time

import torch
from torch.utils.data import DataLoader

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=8, help="epochs of 16 batches (default 8)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    spec = importlib.util.spec_from_file_location("sample", os.path.join(HERE, "..", "samples", "python", "train.py"))
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    loader = DataLoader(sample.Shapes(512, 10, "none"), batch_sampler=sample.Batches(512, 32, 0, -1, 3), num_workers=2)
    model = sample.Net(10)
    clock = time.process_time_ns
    us = {"copy, before the forward": [], "forward, after a copy": [], "forward, batch unread": [],
          "copy, after the forward": []}
    for _ in range(a.epochs):
        for k, batch in enumerate(loader):
            if k % 2 == 0:
                t0 = clock()
                copies = {n: t.clone() for n, t in batch.items()}
                t1 = clock()
                with torch.no_grad():
                    sample.loss_of(model, batch, 1e-6)
                t2 = clock()
                us["copy, before the forward"].append((t1 - t0) / 1e3)
                us["forward, after a copy"].append((t2 - t1) / 1e3)
            else:
                t0 = clock()
                with torch.no_grad():
                    sample.loss_of(model, batch, 1e-6)
                t1 = clock()
                copies = {n: t.clone() for n, t in batch.items()}
                t2 = clock()
                us["forward, batch unread"].append((t1 - t0) / 1e3)
                us["copy, after the forward"].append((t2 - t1) / 1e3)
            del copies
    medians = {k: statistics.median(v) for k, v in us.items()}
    if a.json:
        print(json.dumps({"batches": sum(len(v) for v in us.values()) // 2, "median_us": medians}, indent=1))
    else:
        for k, v in medians.items():
            print(f"{k:28} median {v:9.0f} us  ({len(us[k])} batches)")


if __name__ == "__main__":
    main()
