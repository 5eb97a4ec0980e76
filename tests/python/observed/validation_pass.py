#!/usr/bin/env python3
"""A plain PyTorch training that knows nothing of crashcap, with a validation pass every 2 steps:
model.eval(), torch.no_grad() and a DataLoader of its own, between one step's optimizer.step()
and the next batch. The classifier's first Linear keeps its bias before a BatchNorm1d, so that
bias's gradient is 0 in exact arithmetic (rounding noise in float32 and float64 alike). SGD with
momentum, shuffled training batches.

  --bad-val-index K  validation sample K holds a NaN: the program's own check of the validation
                     logits fails, after a step, not in one
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bad-val-index", type=int, default=-1)
    p.add_argument("--epochs", type=int, default=1)
    a = p.parse_args()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(320, 8, generator=g), torch.randint(0, 3, (320,), generator=g)
    vx, vy = torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g)
    if a.bad_val_index >= 0:
        vx[a.bad_val_index, 2] = float("nan")
    train = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(2))
    val = DataLoader(TensorDataset(vx, vy), batch_size=48)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = 0
    for epoch in range(a.epochs):
        for inputs, labels in train:
            model.train()
            optimizer.zero_grad()
            F.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
            step += 1
            if step % 2 == 0:
                model.eval()
                with torch.no_grad():
                    for vi, vl in val:
                        logits = model(vi)
                        if not torch.isfinite(logits).all():
                            raise ValueError(f"non-finite validation logits after step {step - 1}")
        print(f"epoch {epoch} done", flush=True)


if __name__ == "__main__":
    main()
