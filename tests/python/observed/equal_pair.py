#!/usr/bin/env python3
"""A plain PyTorch training that knows nothing of crashcap: metric learning that pulls each
anchor's embedding toward its positive's by their Euclidean distance, taken by hand as the
square root of the summed squares. One pair's positive is the anchor itself, so its distance is
sqrt(0): finite, while its derivative 1/(2*sqrt(0)) is not. The forward runs clean and the
backward() of the batch holding that pair makes the gradients NaN. (No dropout: the anchor and
its positive would be embedded through different masks and never meet.)

  --equal K        the pair whose positive equals its anchor (dataset index)
  --root sqrt      .sqrt() of the summed squares (the default)
  --root pow       ** 0.5 of the summed squares
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Pairs(Dataset):
    def __init__(self, rows, equal):
        g = torch.Generator().manual_seed(7)
        self.anchor = torch.randn(rows, 20, generator=g)
        self.positive = self.anchor + 0.3 * torch.randn(rows, 20, generator=g)
        self.positive[equal] = self.anchor[equal]

    def __len__(self):
        return len(self.anchor)

    def __getitem__(self, i):
        return self.anchor[i], self.positive[i]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--equal", type=int, default=211)
    p.add_argument("--root", choices=["sqrt", "pow"], default="sqrt")
    a = p.parse_args()
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.LayerNorm(32), nn.Linear(32, 8))
    opt = torch.optim.Adam(encoder.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 4, 0.5)
    loader = DataLoader(Pairs(300, a.equal), batch_size=25, shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(1))
    for epoch in range(2):
        for anchor, positive in loader:
            squares = (encoder(anchor) - encoder(positive)).pow(2).sum(1)
            distance = squares.sqrt() if a.root == "sqrt" else squares ** 0.5
            loss = distance.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
