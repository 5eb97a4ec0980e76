"""An unmodified training of a small attention classifier over padded token sequences: its padding
is masked with masked_fill(mask, -inf) before a softmax, as attention is written; a length prior
is added as log_() of the sequence's mean feature, in place. Knows nothing of crashcap.

--bad-label-index I gives dataset sample I the label 99, which cross_entropy refuses (an error
after the deliberate -inf of the mask); --zero-index I makes sample I's features all zero, so the
in-place log_ turns a legitimate edge case into -inf; --empty-index I gives sample I a length of 0,
so the mask covers its whole row and the softmax of nothing but -inf is NaN."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Padded(Dataset):
    def __init__(self, n, bad_label, zero, empty):
        g = torch.Generator().manual_seed(3)
        self.lengths = torch.randint(3, 12, (n,), generator=g)
        self.tokens = torch.rand(n, 12, 6, generator=g) + 0.05
        self.labels = torch.randint(0, 4, (n,), generator=g)
        if bad_label >= 0:
            self.labels[bad_label] = 99
        if zero >= 0:
            self.tokens[zero] = 0.0
        if empty >= 0:
            self.lengths[empty] = 0

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"tokens": self.tokens[i], "length": self.lengths[i], "label": self.labels[i]}


class Attend(nn.Module):
    def __init__(self):
        super().__init__()
        self.key = nn.Linear(6, 16)
        self.query = nn.Parameter(torch.randn(16) * 0.1)
        self.value = nn.Linear(6, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, tokens, length):
        scores = self.key(tokens) @ self.query                     # [batch, 12]
        pad = torch.arange(tokens.size(1)).unsqueeze(0) >= length.unsqueeze(1)
        scores = scores.masked_fill(pad, float("-inf"))            # deliberate: padding gets no weight
        weights = torch.softmax(scores, dim=1)
        pooled = (weights.unsqueeze(2) * self.value(tokens)).sum(1)
        prior = tokens.mean(dim=(1, 2)).clone().log_()             # in place: 0 features make -inf
        return self.head(torch.tanh(pooled)) + prior.unsqueeze(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bad-label-index", type=int, default=-1)
    p.add_argument("--zero-index", type=int, default=-1)
    p.add_argument("--empty-index", type=int, default=-1)
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args()
    torch.manual_seed(0)
    data = Padded(160, a.bad_label_index, a.zero_index, a.empty_index)
    loader = DataLoader(data, batch_size=16, shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(1))
    model = Attend()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step = 0
    for _ in range(a.epochs):
        for batch in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(batch["tokens"], batch["length"]), batch["label"])
            loss.backward()
            opt.step()
            print(f"step {step} loss {loss.item():.6f}", flush=True)
            step += 1


if __name__ == "__main__":
    main()
