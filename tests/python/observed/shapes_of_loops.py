#!/usr/bin/env python3
"""Plain PyTorch trainings that know nothing of crashcap, in the loop shapes real scripts have;
each trains a small MLP and meets a NaN row (dataset index --nan-index) in --case:

  spawn        DataLoader workers started with spawn, kept across epochs (persistent_workers)
  iterable     an IterableDataset that yields whole batches (batch_size=None): no sampler indices
  stats-first  a first pass over the data (gradients enabled) for normalisation statistics,
               before the model and optimizer exist
  kfold        two folds, each with its own model, optimizer and loader; the NaN is in fold 1
  warmup       one backward() on a dummy batch before the loop (a sanity check)
  per-epoch    a DataLoader made anew at every epoch over a new subset of the data (the NaN row
               joins from epoch 1), and a validation loop in eval mode with gradients enabled
  short        short epochs: the loop leaves the loader with `break` after 4 batches (the batch
               drawn last goes unused) and skips one batch in its first epoch with `continue`
  prefetch     a loop that draws each batch one ahead of the one it trains on
  replacement  a WeightedRandomSampler that draws with replacement, the NaN row weighted so that
               a batch holds it more than once
  lazy         a model of lazy modules, sized by the forward pass of the first batch, whose
               optimizer is made only then, inside the loop
  manual       no optimizer: the loop updates the weights itself, `p -= lr * p.grad` under no_grad,
               over a loader made anew in each epoch's for statement, the NaN row NaN only in
               epoch --nan-epoch
  cycle        a loop of steps over itertools.cycle(loader) (which hands out the first epoch's
               batches again and again), with --blow-up a learning rate that grows 40-fold every
               8 steps until the loss is no longer finite, some passes over the data in
  two-losses   a classifier with a reconstruction head, whose two losses are backpropagated one
               after the other (two backward() calls a step); the bad row's reconstruction target
               is Inf, so only the second loss is non-finite
"""

import argparse
from itertools import cycle, islice

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, IterableDataset


class Rows(Dataset):
    def __init__(self, n, nan_index):
        g = torch.Generator().manual_seed(2)
        self.x = torch.randn(n, 6, generator=g)
        self.y = (self.x.sum(1) > 0).long()
        self.nan_index = nan_index
        self.poisoned = True  # whether the NaN row is NaN now (--case manual: only in one epoch)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i] + 0.01 * torch.randn(6)
        return (torch.full_like(x, float("nan")) if i == self.nan_index and self.poisoned else x), self.y[i]


class WithTargets(Dataset):
    """Rows with a reconstruction target each (the row itself); the bad row's is Inf."""

    def __init__(self, n, bad_index):
        self.rows, self.bad_index = Rows(n, -1), bad_index

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        x, y = self.rows[i]
        return x, y, (torch.full_like(x, float("inf")) if i == self.bad_index else x.clone())


class Batches(IterableDataset):
    def __init__(self, rows, batch):
        self.rows, self.batch = rows, batch

    def __iter__(self):
        for start in range(0, len(self.rows) - self.batch + 1, self.batch):
            items = [self.rows[i] for i in range(start, start + self.batch)]
            yield torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


def train(loader, epochs, mean=0.0):
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(epochs):
        for x, y in loader:
            loss = F.cross_entropy(model(x - mean), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.6f}", flush=True)
    return model


def per_epoch(rows, nan_index, epochs=3):
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(epochs):
        keep = [i for i in range(len(rows)) if epoch > 0 or i != nan_index]
        model.train()
        for x, y in DataLoader(torch.utils.data.Subset(rows, keep), batch_size=16, shuffle=True):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        held_out = DataLoader(torch.utils.data.Subset(rows, range(32)), batch_size=16)
        validation = sum(F.cross_entropy(model(x), y).item() for x, y in held_out)
        print(f"epoch {epoch}: loss {loss.item():.6f} validation {validation:.6f}", flush=True)


def short_epochs(rows, epochs=4):
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(rows, batch_size=16, shuffle=True, num_workers=2)
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            if i == 4:
                break
            if epoch == 0 and i == 1:
                continue
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} batch {i}: loss {loss.item():.6f}", flush=True)


def prefetching(rows, epochs=2):
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(epochs):
        batches = iter(DataLoader(rows, batch_size=16, shuffle=True))
        ahead = next(batches)
        for following in batches:
            (x, y), ahead = ahead, following
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.6f}", flush=True)


def lazy_optimizer(loader, epochs=3):
    model = nn.Sequential(nn.LazyLinear(32), nn.ReLU(), nn.Dropout(0.2), nn.LazyLinear(2))
    optimizer = None
    for epoch in range(epochs):
        for x, y in loader:
            out = model(x)
            if optimizer is None:
                optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
            loss = F.cross_entropy(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.6f}", flush=True)


def manual_updates(rows, epochs, nan_epoch, lr=0.05):
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))
    criterion = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        rows.poisoned = epoch == nan_epoch
        for x, y in DataLoader(rows, batch_size=16, shuffle=True):  # a loader made in the for statement
            model.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
        print(f"epoch {epoch}: loss {loss.item():.6f}", flush=True)


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2))
        self.classify, self.reconstruct = nn.Linear(32, 2), nn.Linear(32, 6)

    def forward(self, x):
        h = self.trunk(x)
        return self.classify(h), self.reconstruct(h)


def two_losses(loader, epochs=3):
    model = TwoHeads()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for epoch in range(epochs):
        for x, y, target in loader:
            optimizer.zero_grad()
            logits, reconstruction = model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward(retain_graph=True)
            F.mse_loss(reconstruction, target).backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.6f}", flush=True)


def cycled(loader, steps, blow_up):
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, 8, gamma=40.0 if blow_up else 1.0)
    for step, (x, y) in enumerate(islice(cycle(loader), steps)):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 10 == 9:
            print(f"step {step}: loss {loss.item():.6f}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--case", required=True, choices=["spawn", "iterable", "stats-first", "kfold", "warmup", "per-epoch",
                                                      "short", "prefetch", "replacement", "lazy",
                                                      "two-losses", "manual", "cycle"])
    p.add_argument("--blow-up", action="store_true")
    p.add_argument("--nan-index", type=int, default=-1)
    p.add_argument("--nan-epoch", type=int, default=0)
    a = p.parse_args()
    torch.manual_seed(0)
    rows = Rows(160, a.nan_index)
    if a.case == "spawn":
        train(DataLoader(rows, batch_size=16, shuffle=True, num_workers=2, multiprocessing_context="spawn",
                         persistent_workers=True), 3)
    elif a.case == "iterable":
        train(DataLoader(Batches(rows, 16), batch_size=None), 3)
    elif a.case == "stats-first":
        total = sum(x.nan_to_num().sum(0) for x, _ in DataLoader(rows, batch_size=32))
        train(DataLoader(rows, batch_size=16, shuffle=True), 3, mean=total / len(rows))
    elif a.case == "kfold":
        for fold in range(2):
            part = torch.utils.data.Subset(rows, list(range(fold * 80, fold * 80 + 80)))
            print(f"fold {fold}", flush=True)
            train(DataLoader(part, batch_size=16, shuffle=True), 3)
    elif a.case == "warmup":
        probe = nn.Linear(6, 2)
        F.cross_entropy(probe(torch.randn(4, 6)), torch.zeros(4, dtype=torch.long)).backward()
        train(DataLoader(rows, batch_size=16, shuffle=True), 3)
    elif a.case == "per-epoch":
        per_epoch(rows, a.nan_index)
    elif a.case == "replacement":
        weights = torch.ones(len(rows))
        if a.nan_index >= 0:
            weights[a.nan_index] = 8.0  # drawn about 0.75 times in a batch of 16, twice in some
        sampler = torch.utils.data.WeightedRandomSampler(weights, num_samples=96, replacement=True,
                                                         generator=torch.Generator().manual_seed(5))
        train(DataLoader(rows, batch_size=16, sampler=sampler), 3)
    elif a.case == "short":
        short_epochs(rows)
    elif a.case == "prefetch":
        prefetching(rows)
    elif a.case == "lazy":
        lazy_optimizer(DataLoader(rows, batch_size=16, shuffle=True, num_workers=2))
    elif a.case == "manual":
        manual_updates(rows, 4, a.nan_epoch)
    elif a.case == "cycle":
        cycled(DataLoader(rows, batch_size=16, shuffle=True, num_workers=2), 60, a.blow_up)
    elif a.case == "two-losses":
        two_losses(DataLoader(WithTargets(160, a.nan_index), batch_size=16, shuffle=True, num_workers=2))


if __name__ == "__main__":
    main()
