#!/usr/bin/env python3
"""A plain PyTorch training that knows nothing of crashcap: an MLP on tabular data from a
DataLoader with worker processes that augment (noise), dropout, SGD with momentum and a StepLR
schedule, several epochs. Faults by dataset index, as a corrupt row of a real dataset would be:

  --nan-index K        row K's features are NaN (the loss goes NaN)
  --bad-label-index K  row K's label is out of range (cross_entropy raises)
  --fault-epoch E      the fault shows from epoch E on (a file rewritten while the run goes on)

--accumulate N: an optimizer step every N batches (gradient accumulation).
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Table(Dataset):
    def __init__(self, rows, features, classes, nan_index, bad_label_index, fault_epoch):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(rows, features, generator=g)
        w = torch.randn(features, classes, generator=g)
        self.y = (self.x @ w).argmax(1)
        self.classes = classes
        self.nan_index, self.bad_label_index = nan_index, bad_label_index
        self.fault_epoch, self.epoch = fault_epoch, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i] + 0.05 * torch.randn_like(self.x[i])  # augmentation in the worker
        y = self.y[i]
        faulty = self.epoch >= self.fault_epoch
        if faulty and i == self.nan_index:
            x = torch.full_like(x, float("nan"))
        if faulty and i == self.bad_label_index:
            y = torch.tensor(self.classes + 3)
        return x, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rows", type=int, default=384)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--nan-index", type=int, default=-1)
    p.add_argument("--bad-label-index", type=int, default=-1)
    p.add_argument("--fault-epoch", type=int, default=0)
    p.add_argument("--accumulate", type=int, default=1)
    a = p.parse_args()

    torch.manual_seed(0)
    data = Table(a.rows, 12, 5, a.nan_index, a.bad_label_index, a.fault_epoch)
    loader = DataLoader(data, batch_size=a.batch, shuffle=True, num_workers=a.workers, drop_last=True)
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 64), nn.ReLU(),
                          nn.Dropout(0.3), nn.Linear(64, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(a.epochs):
        data.set_epoch(epoch)
        model.train()
        total = 0.0
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y)
            (loss / a.accumulate).backward()
            if (i + 1) % a.accumulate == 0:
                optimizer.step()
                optimizer.zero_grad()
            total += loss.item()
        scheduler.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(data.x).argmax(1) == data.y).float().mean().item()
        print(f"epoch {epoch}: loss {total / len(loader):.4f} accuracy {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
