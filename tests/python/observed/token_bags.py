#!/usr/bin/env python3
"""A plain PyTorch text classifier that knows nothing of crashcap, over texts of 4 to 10 tokens:
by default the batch is ragged, as the EmbeddingBag tutorials make it (labels, the tokens of all
the batch's texts concatenated, and each text's offset into them), so the tokens tensor holds no
row per sample and its length changes from batch to batch. With --padded the texts are padded to
the batch's longest (tokens [batch, longest], position ids [1, longest]) and embedded instead.
With --segments the batch is ragged without offsets: each token carries the number of its text
(a graph batch's node-to-graph vector), and the embeddings are summed per text with index_add.
Adagrad, a warm-restart cosine schedule stepped by fractions of an epoch, DataLoader workers.

  --bad-index K  sample K holds a token id past the vocabulary (the embedding raises)
  --padded       padded batches instead of ragged ones
  --segments     ragged batches told by each token's text number instead of offsets
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

VOCAB, CLASSES, BATCH = 50, 3, 12


class Texts(Dataset):
    def __init__(self, bad_index):
        self.bad_index = bad_index

    def __len__(self):
        return 240

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        tokens = torch.randint(1, VOCAB, (4 + i % 7,), generator=g)
        if i == self.bad_index:
            tokens[2] = VOCAB + 3
        return i % CLASSES, tokens


def ragged(items):
    labels = torch.tensor([y for y, _ in items])
    offsets = torch.tensor([0] + [len(t) for _, t in items[:-1]]).cumsum(0)
    return labels, torch.cat([t for _, t in items]), offsets


def segments(items):
    labels = torch.tensor([y for y, _ in items])
    text = torch.cat([torch.full((len(t),), row, dtype=torch.long) for row, (_, t) in enumerate(items)])
    return labels, torch.cat([t for _, t in items]), text


def padded(items):
    longest = max(len(t) for _, t in items)
    tokens = torch.zeros(len(items), longest, dtype=torch.long)  # 0 pads
    for row, (_, t) in enumerate(items):
        tokens[row, :len(t)] = t
    return torch.tensor([y for y, _ in items]), tokens, torch.arange(longest).unsqueeze(0)


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(VOCAB, 16, mode="mean")
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, tokens, offsets):
        return self.fc(self.bag(tokens, offsets))


class Segments(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, tokens, text):
        sums = torch.zeros(int(text.max()) + 1, 16).index_add(0, text, self.embed(tokens))
        counts = torch.zeros(sums.shape[0]).index_add(0, text, torch.ones(len(text)))
        return self.fc(sums / counts.unsqueeze(1))


class Padded(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16, padding_idx=0)
        self.position = nn.Embedding(16, 16)
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, tokens, positions):
        mask = (tokens != 0).unsqueeze(-1).float()
        x = (self.embed(tokens) + self.position(positions)) * mask
        return self.fc(x.sum(1) / mask.sum(1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bad-index", type=int, default=-1)
    p.add_argument("--padded", action="store_true")
    p.add_argument("--segments", action="store_true")
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()
    torch.manual_seed(0)
    model = Padded() if a.padded else Segments() if a.segments else Bag()
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=5)
    loader = DataLoader(Texts(a.bad_index), batch_size=BATCH, shuffle=True, num_workers=2,
                        collate_fn=padded if a.padded else segments if a.segments else ragged)
    for epoch in range(a.epochs):
        for i, (labels, tokens, extra) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(tokens, extra), labels)
            loss.backward()
            optimizer.step()
            schedule.step(epoch + i / len(loader))
        print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
