"""A training that gives its step to crashcap as TorchScript (the opt-in): the loss comes from a
scripted module wrapping an MLP with LayerNorm and dropout, AdamW with a cosine schedule, batches
as (x, y) tuples from a DataLoader with workers. At --fault-step a NaN reaches row --fault-row.
The recording replays in crashcap without Python."""

import argparse
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import crashcap


class Step(torch.nn.Module):
    """The step's forward and loss: the batch's tensors in, the loss out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.model(x), y)


p = argparse.ArgumentParser()
p.add_argument("--record", required=True)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--fault-step", type=int, default=-1)
p.add_argument("--fault-row", type=int, default=2)
p.add_argument("--workers", type=int, default=0)
p.add_argument("--optimizer", default="adamw")
a = p.parse_args()

torch.manual_seed(5)
n, batch = 480, 12  # 40 steps an epoch
x = torch.randn(n, 10)
y = x[:, :4].tanh() * 2
if a.fault_step >= 0:
    x[(a.fault_step % (n // batch)) * batch + a.fault_row, 7] = float("nan")
loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=False, num_workers=a.workers, drop_last=True)
model = torch.nn.Sequential(torch.nn.Linear(10, 24), torch.nn.LayerNorm(24), torch.nn.GELU(), torch.nn.Dropout(0.2),
                            torch.nn.Linear(24, 4))
optimizers = {"adamw": lambda ps: torch.optim.AdamW(ps, lr=3e-3, weight_decay=0.05),
              "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
              "adamax": lambda ps: torch.optim.Adamax(ps, lr=1e-3)}
opt = optimizers[a.optimizer](model.parameters())
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.steps)
program = torch.jit.script(Step(model))
rec = crashcap.Recorder(a.record, model=model, optimizer=opt, scheduler=sched, program=program, keyframe_every=6,
                        quiet=True)
step = 0
while step < a.steps:
    for step, (xb, yb) in rec.steps(loader):
        loss = program(xb, yb)
        loss.backward()
        rec.end(loss)
        opt.step()
        opt.zero_grad()
        sched.step()
        if step + 1 >= a.steps:
            break
    step += 1
rec.close()
print("trained", a.steps)
sys.exit(0)
