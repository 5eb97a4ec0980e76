#!/usr/bin/env python3
"""A plain PyTorch training that knows nothing of crashcap: a small conv net with batch norm and
dropout on 16x16 images whose dataset yields dicts (an image, a label, the sample's file name), a
DataLoader with two workers that augment (flips, noise), Adam and a cosine schedule stepped every
batch. --nan-index K: image K has a patch of NaN pixels (a corrupt file)."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __init__(self, n, nan_index):
        self.n, self.nan_index = n, nan_index

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        label = i % 4
        image = torch.zeros(1, 16, 16)
        r, c = torch.randint(2, 10, (2,), generator=g).tolist()
        image[:, r:r + 4 + label, c:c + 4] = 1.0
        if torch.rand(1).item() < 0.5:
            image = image.flip(-1)
        image = image + 0.1 * torch.randn_like(image)
        if i == self.nan_index:
            image[:, 4:8, 4:8] = float("nan")
        return {"image": image, "label": label, "name": f"img{i:04d}.png"}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.25), nn.Linear(16 * 4 * 4, 4))

    def forward(self, x):
        return self.head(self.body(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--nan-index", type=int, default=-1)
    a = p.parse_args()
    torch.manual_seed(1)
    loader = DataLoader(Images(320, a.nan_index), batch_size=16, shuffle=True, num_workers=2)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=a.epochs * len(loader))
    for epoch in range(a.epochs):
        for i, batch in enumerate(loader):
            logits = model(batch["image"])
            loss = F.cross_entropy(logits, batch["label"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            if i % 10 == 0:
                print(f"epoch {epoch} batch {i} ({batch['name'][0]}...): loss {loss.item():.5f}", flush=True)


if __name__ == "__main__":
    main()
