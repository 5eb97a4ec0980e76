#!/usr/bin/env python3
"""A plain PyTorch training that knows nothing of crashcap, on partly labelled data: samples
without a label carry -1 and count for nothing in the loss. The loader reads the data in its
stored order (no shuffle), where the unlabelled samples lie together, so one batch may hold
no labelled sample at all and its mean loss is 0/0, NaN.

  --unlabelled-from K   samples K..K+15 (one whole batch of 16) are unlabelled
  --loss tagging        cross_entropy(..., ignore_index=-1) over class labels (the default)
  --loss masked         mse_loss over the rows whose target is not -1, selected by a mask
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class PartlyLabelled(Dataset):
    def __init__(self, rows, unlabelled_from, classes):
        g = torch.Generator().manual_seed(11)
        self.x = torch.randn(rows, 12, generator=g)
        self.y = torch.randint(0, classes, (rows,), generator=g)
        self.y[unlabelled_from:unlabelled_from + 16] = -1

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.05 * torch.randn(12), self.y[i]  # noise drawn in the worker


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--unlabelled-from", type=int, default=96)
    p.add_argument("--loss", choices=["tagging", "masked"], default="tagging")
    a = p.parse_args()
    torch.manual_seed(0)
    classes = 5 if a.loss == "tagging" else 1
    data = PartlyLabelled(320, a.unlabelled_from, classes)
    loader = DataLoader(data, batch_size=16, shuffle=False, num_workers=2)
    model = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 5, 0.5)
    for epoch in range(2):
        for x, y in loader:
            out = model(x)
            if a.loss == "tagging":
                loss = F.cross_entropy(out, y, ignore_index=-1)
            else:
                kept = y != -1
                loss = F.mse_loss(out[kept].squeeze(1), y[kept].float())
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
