#!/usr/bin/env python3
"""A plain PyTorch detection-style training that knows nothing of crashcap: the batch is collated
the torchvision way, images stacked and a list of each image's own targets (a dict of its boxes
[objects, 4] and labels [objects], 1 to 4 objects), so the targets' tensors hold no batch row and
their sizes change from sample to sample. A small conv net regresses each object's box from the
pooled image feature and the object's label; smooth L1 plus a cross-entropy on the first label.
RMSprop, DataLoader workers; the loop raises on a non-finite loss.

  --nan-box K  one of sample K's boxes holds a NaN
  --tuples     collate as torchvision's detection references do, tuple(zip(*batch)): a tuple of the
               images, each its own tensor, and a tuple of their targets
  --sorted     with --tuples, the images with most objects first (the rows are not in the sampler's
               order, and no tensor of the batch has them as rows)
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

CLASSES = 5


class Shapes(Dataset):
    def __init__(self, nan_box):
        self.nan_box = nan_box

    def __len__(self):
        return 160

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        objects = 1 + i % 4
        boxes = torch.rand(objects, 4, generator=g)
        if i == self.nan_box:
            boxes[objects - 1, 2] = float("nan")
        target = {"boxes": boxes, "labels": torch.randint(0, CLASSES, (objects,), generator=g)}
        return torch.randn(3, 24, 24, generator=g), target


def collate(items):
    return torch.stack([image for image, _ in items]), [target for _, target in items]


def collate_tuples_sorted(items):
    return collate_tuples(sorted(items, key=lambda item: -len(item[1]["labels"])))


def collate_tuples(items):
    return tuple(zip(*items))


class Detector(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.label = nn.Embedding(CLASSES, 16)
        self.box = nn.Linear(16, 4)
        self.classes = nn.Linear(16, CLASSES)

    def forward(self, images, targets):
        pooled = self.features(torch.stack(list(images)) if isinstance(images, tuple) else images).mean((2, 3))
        loss = 0
        for feature, target in zip(pooled, targets):
            boxes = self.box(feature[None] + self.label(target["labels"]))
            loss = loss + F.smooth_l1_loss(boxes, target["boxes"])
            loss = loss + F.cross_entropy(self.classes(feature)[None], target["labels"][:1])
        return loss / len(targets)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nan-box", type=int, default=-1)
    p.add_argument("--tuples", action="store_true")
    p.add_argument("--sorted", action="store_true")
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args()
    torch.manual_seed(5)
    model = Detector()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    loader = DataLoader(Shapes(a.nan_box), batch_size=8, shuffle=True, num_workers=2,
                        collate_fn=(collate_tuples_sorted if a.sorted else collate_tuples) if a.tuples else collate)
    for epoch in range(a.epochs):
        for images, targets in loader:
            loss = model(images, targets)
            if not torch.isfinite(loss):
                raise RuntimeError(f"non-finite loss {loss.item()}")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
