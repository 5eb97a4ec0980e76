#!/usr/bin/env python3
"""A plain PyTorch training that knows nothing of crashcap and uses no DataLoader: it draws its
batches itself, fits a linear model with AdamW, and raises at --fail-step (a bug of its own)."""

import argparse

import torch
import torch.nn as nn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--fail-step", type=int, default=-1)
    a = p.parse_args()
    torch.manual_seed(5)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    w = torch.randn(8, 1)
    for step in range(a.steps):
        x = torch.randn(64, 8)
        loss = ((model(x) - x @ w) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == a.fail_step:
            raise RuntimeError(f"lost track of the data at step {step}")
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.6f}", flush=True)
    print(f"final loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
