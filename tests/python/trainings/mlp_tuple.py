"""A training that is not the sample: an MLP regressor over a TensorDataset, batches as (x, y)
tuples, SGD with Nesterov momentum, StepLR, gradient clipping, and numpy and Python random
noise drawn in the loop after the batch arrives. At --fault-step a NaN reaches row --fault-row
through the dataset."""

import argparse
import random
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

import crashcap

p = argparse.ArgumentParser()
p.add_argument("--record", required=True)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--fault-step", type=int, default=-1)
p.add_argument("--fault-row", type=int, default=2)
p.add_argument("--workers", type=int, default=0)
a = p.parse_args()

torch.manual_seed(1)
np.random.seed(2)
random.seed(3)
n, batch = 256, 16
x = torch.randn(n, 12)
y = (x[:, :3].sum(1, keepdim=True) > 0).float()
generator = torch.Generator().manual_seed(4)
order = torch.randperm(n, generator=generator)
if a.fault_step >= 0:
    # The sample that lands at row fault_row of step fault_step (shuffle=False: order is fixed).
    x[(a.fault_step % (n // batch)) * batch + a.fault_row, 5] = float("nan")
loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=False, num_workers=a.workers, drop_last=True)
model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
rec = crashcap.Recorder(a.record, model=model, optimizer=opt, scheduler=sched, keyframe_every=8, quiet=True)
step = 0
while step < a.steps:
    for step, (xb, yb) in rec.steps(loader):
        xb = xb + torch.from_numpy(np.random.normal(0, 0.01, xb.shape).astype(np.float32))
        scale = 1.0 + 0.01 * random.random()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(xb) * scale, yb)
        loss.backward()
        rec.end(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        sched.step()
        if step + 1 >= a.steps:
            break
    step += 1
rec.close()
print("trained", a.steps)
sys.exit(0)
