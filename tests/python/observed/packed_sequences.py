#!/usr/bin/env python3
"""A plain PyTorch sequence classifier that knows nothing of crashcap: a GRU over sequences of 3
to 11 feature vectors, padded to the batch's longest and packed by their lengths (the batch is the
padded features, the lengths and the labels). SGD with Nesterov momentum and weight decay, a
step schedule, shuffled batches from DataLoader workers.

  --empty-index K  sample K is a sequence of length 0 (pack_padded_sequence raises)
  --bad-label K    sample K's label is 3 of 3 classes (cross_entropy raises "Target 3 is out of
                   bounds.")
  --nan-index K    sample K's features hold a NaN in one time step
  --packed-batch   the collate function packs the batch itself: a PackedSequence (its data holds
                   the samples concatenated, with no offsets per row) and the labels
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset

FEATURES, CLASSES = 5, 3


class Sequences(Dataset):
    def __init__(self, empty_index, bad_label, nan_index):
        self.empty_index, self.bad_label, self.nan_index = empty_index, bad_label, nan_index

    def __len__(self):
        return 400

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        length = 0 if i == self.empty_index else int(torch.randint(3, 12, (1,), generator=g))
        x = torch.randn(length, FEATURES, generator=g)
        if i == self.nan_index:
            x[length // 2, 1] = float("nan")
        return x, CLASSES if i == self.bad_label else i % CLASSES


def collate(items):
    sequences = [x for x, _ in items]
    return (pad_sequence(sequences, batch_first=True), torch.tensor([len(x) for x in sequences]),
            torch.tensor([y for _, y in items]))


def collate_packed(items):
    x, lengths, y = collate(items)
    return pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False), y


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(FEATURES, 24, batch_first=True)
        self.head = nn.Linear(24, CLASSES)

    def forward(self, x, lengths=None):
        _, h = self.rnn(x if lengths is None else pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        return self.head(h[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--empty-index", type=int, default=-1)
    p.add_argument("--bad-label", type=int, default=-1)
    p.add_argument("--nan-index", type=int, default=-1)
    p.add_argument("--packed-batch", action="store_true")
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args()
    torch.manual_seed(2)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, 5, 0.5)
    loader = DataLoader(Sequences(a.empty_index, a.bad_label, a.nan_index), batch_size=10, shuffle=True,
                        collate_fn=collate_packed if a.packed_batch else collate, num_workers=2,
                        generator=torch.Generator().manual_seed(5))
    for epoch in range(a.epochs):
        for *inputs, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(*inputs), y).backward()
            optimizer.step()
        schedule.step()
        print(f"epoch {epoch}: lr {schedule.get_last_lr()[0]:.4f}", flush=True)


if __name__ == "__main__":
    main()
