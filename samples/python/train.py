#!/usr/bin/env python3
"""A PyTorch image classifier trained from a DataLoader, recorded by crashcap.

Synthetic shapes (discs, squares, crosses, rings, bars...) drawn per dataset index, augmented in
DataLoader worker processes (random flips, noise), classified by a small conv net with batch norm
and dropout, trained with cross-entropy plus a masked reconstruction loss (the valid-pixel mask
weights it), AdamW or SGD, and a warm-up + cosine schedule stepped every step.

The faults are the classic ways a training dies, each at one step and batch row:
  nan-sample   the sample's image has a patch of NaN pixels (a corrupt file)
  bad-label    the sample's label is out of range (a labelling bug): cross_entropy raises
  mask-eps0    the sample's valid-pixel mask is empty and the loss divides by its sum with no eps
  lr-blowup    the schedule runs away: the learning rate grows 1e8-fold each step from that step on

    /usr/bin/python3 samples/python/train.py --record runs --steps 40 --fault nan-sample --fault-step 19 --fault-row 3
    crashcap replay runs/crash-*.ccap
"""

import argparse
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

FAULTS = ("none", "nan-sample", "bad-label", "mask-eps0", "lr-blowup")
SIZE = 32


class Shapes(Dataset):
    """Sample i: a shape of class i % classes at a position and scale drawn from i, and a mask of
    the pixels that are valid (a border of padding is not). Items are (index, fault) pairs: the
    batch sampler marks the one sample the fault corrupts."""

    def __init__(self, length, classes, fault):
        self.length, self.classes, self.fault = length, classes, fault

    def __len__(self):
        return self.length

    def __getitem__(self, item):
        index, corrupt = item
        g = torch.Generator().manual_seed(1000 + index)
        label = index % self.classes
        y, x = torch.meshgrid(torch.arange(SIZE, dtype=torch.float32), torch.arange(SIZE, dtype=torch.float32),
                              indexing="ij")
        cy, cx = (8 + 16 * torch.rand(2, generator=g)).tolist()
        r = 4 + 6 * torch.rand(1, generator=g).item()
        d = ((y - cy) ** 2 + (x - cx) ** 2).sqrt()
        shapes = [d < r, ((y - cy).abs() < r) & ((x - cx).abs() < r), ((y - cy).abs() < 2) | ((x - cx).abs() < 2),
                  (d < r) & (d > r / 2), (y - cy).abs() < 2, (x - cx).abs() < 2, (y - cy - x + cx).abs() < 2,
                  (y - cy + x - cx).abs() < 2, ((y - cy).abs() < r) & ((x - cx).abs() < r / 3),
                  (d < r) & ((y - cy) > 0)]
        image = shapes[label % len(shapes)].float().unsqueeze(0)
        pad = int(torch.randint(0, 4, (1,), generator=g))
        mask = torch.zeros(1, SIZE, SIZE)
        mask[:, pad:SIZE - pad, pad:SIZE - pad] = 1
        # Augmentation, with the worker's own generator (seeded by the DataLoader).
        if torch.rand(1).item() < 0.5:
            image, mask = image.flip(-1), mask.flip(-1)
        image = image + 0.1 * torch.randn_like(image)
        if corrupt and self.fault == "nan-sample":
            image[:, 10:18, 10:18] = float("nan")
        if corrupt and self.fault == "bad-label":
            label = self.classes + 2
        if corrupt and self.fault == "mask-eps0":
            mask.zero_()
        return {"image": image, "label": torch.tensor(label), "mask": mask, "index": torch.tensor(index)}


class Batches(Sampler):
    """Shuffled batches from a seeded permutation per epoch; step `fault_step`'s row `fault_row`
    is the corrupt sample."""

    def __init__(self, length, batch, seed, fault_step, fault_row, start_step=0):
        self.length, self.batch, self.seed = length, batch, seed
        self.fault_step, self.fault_row = fault_step, fault_row
        self.per_epoch = length // batch
        self.step = start_step

    def __len__(self):
        return self.per_epoch

    def __iter__(self):
        epoch = self.step // self.per_epoch
        order = torch.randperm(self.length, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
        for k in range(self.per_epoch):
            rows = order[k * self.batch:(k + 1) * self.batch]
            yield [(i, self.step == self.fault_step and r == self.fault_row) for r, i in enumerate(rows)]
            self.step += 1


class Net(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Dropout(0.2),
                                  nn.Linear(64, classes))
        self.reconstruct = nn.Conv2d(32, 1, 1)

    def forward(self, image):
        f = self.features(image)
        return self.head(f), F.interpolate(self.reconstruct(f), scale_factor=4, mode="bilinear", align_corners=False)


def loss_of(model, batch, eps):
    logits, recon = model(batch["image"])
    ce = F.cross_entropy(logits, batch["label"])
    mask = batch["mask"]
    per_sample = ((recon - batch["image"]) ** 2 * mask).sum((1, 2, 3)) / (mask.sum((1, 2, 3)) + eps)
    return ce + 0.1 * per_sample.mean()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--record", metavar="DIR", help="record with crashcap into DIR")
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--fault-step", type=int, default=19)
    p.add_argument("--fault-row", type=int, default=3)
    p.add_argument("--keyframe-every", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dataset", type=int, default=512, help="samples per epoch (default 512: 16 steps of 32)")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    if a.fault != "none" and not 0 <= a.fault_row < a.batch:
        p.error(f"--fault-row {a.fault_row} is outside a batch of {a.batch}")

    torch.manual_seed(a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)
    model = Net(a.classes)
    if a.optimizer == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-2)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    warmup = 5

    def schedule(s):
        scale = (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / max(1, a.steps))))
        # lr-blowup: a runaway schedule, the rate multiplied by 1e8 more each step from fault_step on.
        return scale * (1e8 ** (s - a.fault_step + 1) if a.fault == "lr-blowup" and s >= a.fault_step else 1.0)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    dataset = Shapes(a.dataset, a.classes, a.fault)
    batches = Batches(a.dataset, a.batch, a.seed, a.fault_step if a.fault in ("nan-sample", "bad-label", "mask-eps0") else -1,
                      a.fault_row)
    loader = DataLoader(dataset, batch_sampler=batches, num_workers=a.workers,
                        persistent_workers=False)
    eps = 0.0 if a.fault == "mask-eps0" else 1e-6

    if a.record:
        import crashcap  # only to record: without --record this is a plain PyTorch training
    rec = crashcap.Recorder(a.record, model=model, optimizer=optimizer, scheduler=scheduler,
                            keyframe_every=a.keyframe_every, quiet=a.quiet) if a.record else None
    model.train()
    print(f"train.py: {a.steps} steps, fault {a.fault} at step {a.fault_step} row {a.fault_row}, "
          f"{a.workers} workers, {a.optimizer}", flush=True)
    step = 0
    while step < a.steps:
        for step, batch in (rec.steps(loader) if rec else enumerate(loader, start=step)):
            loss = loss_of(model, batch, eps)
            loss.backward()
            if rec:
                rec.end(loss)
            elif not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss at step {step}: {loss.item()}")
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            if not a.quiet and (step % 10 == 0 or step + 1 == a.steps):
                print(f"step {step:4d}  loss {loss.item():.5f}  lr {optimizer.param_groups[0]['lr']:.2e}", flush=True)
            if step + 1 >= a.steps:
                break
        step += 1
    if rec:
        rec.close()
    print(f"train.py: trained {a.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
