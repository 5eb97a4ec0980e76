"""A training whose computation reads numbers of its own loop: a step counter, an enumerate count,
the epoch, a weight annealed per step. A replay that starts at a keyframe must find them as the
recording had them (crashcap/_loop.py). Not crashcap-aware (except --case api).

    own_counters.py --case script|function|api|clock [--nan-step N] [--raise-at N]

--nan-step puts a NaN into row 3 of the batch at that step of the first epoch; --raise-at raises
when the program's own counter reaches N, so a replay that does not set the counter back does
not reach the error.
"""

import argparse
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--case", default="script")
parser.add_argument("--nan-step", type=int, default=70)
parser.add_argument("--raise-at", type=int, default=-1)
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(11)
BATCH, STEPS_PER_EPOCH = 16, 40
x = torch.randn(BATCH * STEPS_PER_EPOCH, 8)
y = x[:, :3].sum(1, keepdim=True)
if args.nan_step >= 0:
    x[(args.nan_step % STEPS_PER_EPOCH) * BATCH + 3, 5] = float("nan")  # row 3 of the step's batch
loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=False)
model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def warm(lr_at):
    for g in opt.param_groups:
        g["lr"] = lr_at


def prefetch(batches):
    for b in batches:  # a generator of the program's between the loader and the loop
        yield b


def train():
    beta = 0.0
    for epoch in range(args.epochs):
        for i, (xb, yb) in enumerate(prefetch(loader)):
            global_step = epoch * len(loader) + i
            if global_step == args.raise_at:
                raise RuntimeError(f"global step {global_step}: the schedule ran out")
            warm(0.05 * min(1.0, (global_step + 1) / 50))
            if global_step == 30:
                model[0].requires_grad_(False)
            beta = min(1.0, beta + 0.02)
            loss = nn.functional.mse_loss(model(xb), yb) + beta * model[2].weight.pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print("epoch", epoch, loss.item(), flush=True)


if args.case == "script":
    step, beta = 0, 0.0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            if step == args.raise_at:
                raise RuntimeError(f"step {step}: the schedule ran out")
            warm(0.05 * min(1.0, (step + 1) / 50))
            beta = min(1.0, beta + 0.02)
            loss = nn.functional.mse_loss(model(xb), yb) + beta * model[2].weight.pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
        print("epoch", epoch, loss.item(), flush=True)
elif args.case == "function":
    train()
elif args.case == "api":
    import crashcap
    with crashcap.Recorder("runs", model=model, optimizer=opt, keyframe_every=20) as rec:
        beta = 0.0
        for epoch in range(args.epochs):
            for step, (xb, yb) in rec.steps(loader):
                beta = min(1.0, beta + 0.02)
                loss = nn.functional.mse_loss(model(xb), yb) + beta * model[2].weight.pow(2).sum()
                opt.zero_grad()
                loss.backward()
                rec.end(loss)
                opt.step()
elif args.case == "clock":
    # A time budget: a clock reading set back in a replay would end the loop at once.
    t0, step = time.time(), 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            if time.time() - t0 > 3600:
                break
            warm(0.05 * min(1.0, (step + 1) / 50))
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
