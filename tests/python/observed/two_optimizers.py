#!/usr/bin/env python3
"""A plain PyTorch training that knows nothing of crashcap: a small GAN on 2-D points, its
generator and discriminator each with an optimizer of its own (Adam and SGD), two backward()
calls per batch, from a DataLoader. --nan-index K: point K is NaN."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--nan-index", type=int, default=-1)
    a = p.parse_args()
    torch.manual_seed(3)
    points = torch.randn(256, 2) * torch.tensor([1.0, 0.3]) + torch.tensor([2.0, -1.0])
    if a.nan_index >= 0:
        points[a.nan_index] = float("nan")
    loader = DataLoader(TensorDataset(points), batch_size=32, shuffle=True)
    generator = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    discriminator = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Dropout(0.1), nn.Linear(32, 1))
    g_opt = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.5, 0.999))
    d_opt = torch.optim.SGD(discriminator.parameters(), lr=1e-2, momentum=0.5)
    for epoch in range(a.epochs):
        for (real,) in loader:
            fake = generator(torch.randn(real.size(0), 4))
            d_loss = (F.binary_cross_entropy_with_logits(discriminator(real), torch.ones(real.size(0), 1)) +
                      F.binary_cross_entropy_with_logits(discriminator(fake.detach()), torch.zeros(real.size(0), 1)))
            d_opt.zero_grad()
            d_loss.backward()
            d_opt.step()
            g_loss = F.binary_cross_entropy_with_logits(discriminator(fake), torch.ones(real.size(0), 1))
            g_opt.zero_grad()
            g_loss.backward()
            g_opt.step()
            if not torch.isfinite(d_loss):
                raise FloatingPointError(f"discriminator loss {d_loss.item()}")
        print(f"epoch {epoch}: d {d_loss.item():.6f} g {g_loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
