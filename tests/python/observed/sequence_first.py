#!/usr/bin/env python3
"""A plain PyTorch text classifier that knows nothing of crashcap, with its batches sequence
first, as torch.nn.utils.rnn.pad_sequence and an LSTM without batch_first make them: tokens of
shape (time, batch), labels of shape (batch,). Sequences of 20 to 40 tokens, embedding, LSTM,
linear head, Adam, DataLoader workers, shuffled.

  --bad-label-index K  sample K's label is out of range (cross_entropy raises)
  --square             batches in dataset order, and the bad sample's batch of 16 holds sequences
                       of 16 tokens: its tokens are [16, 16], as many time steps as samples
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

VOCAB, CLASSES, BATCH = 50, 3, 16


class Texts(Dataset):
    def __init__(self, length, bad_label_index, square):
        self.length, self.bad_label_index, self.square = length, bad_label_index, square

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        length = 20 + int(torch.randint(0, 21, (1,), generator=g))
        if self.square and i // BATCH == self.bad_label_index // BATCH:
            length = BATCH
        tokens = torch.randint(1, VOCAB, (length,), generator=g)
        label = int(tokens[:5].sum()) % CLASSES
        if i == self.bad_label_index:
            label = CLASSES + 4
        return tokens, label


def collate(items):
    return pad_sequence([tokens for tokens, _ in items]), torch.tensor([label for _, label in items])


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16, padding_idx=0)
        self.rnn = nn.LSTM(16, 24)
        self.head = nn.Linear(24, CLASSES)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out.mean(0))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bad-label-index", type=int, default=-1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--square", action="store_true")
    a = p.parse_args()
    torch.manual_seed(3)
    model = Classifier()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loader = DataLoader(Texts(192, a.bad_label_index, a.square), batch_size=BATCH, shuffle=not a.square, num_workers=2,
                        collate_fn=collate)
    for epoch in range(a.epochs):
        for tokens, labels in loader:
            loss = F.cross_entropy(model(tokens), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
