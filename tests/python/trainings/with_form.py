"""A training whose loop makes its own batches and records each step with `with rec.step(...)`:
a linear model on synthetic data drawn from torch's generator inside the loop, RMSprop. At
--fault-step the loss is computed with a log of zero (a numerics bug in a hand-written loss)."""

import argparse
import sys

import torch

import crashcap

p = argparse.ArgumentParser()
p.add_argument("--record", required=True)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--fault-step", type=int, default=-1)
a = p.parse_args()

# In a replay the steps before the keyframe start from another seed, so they compute other
# weights and other batches: only the keyframe's restore and the recorded batches copied into the
# loop's tensors can make the replayed steps equal the recording.
torch.manual_seed(123 if crashcap.replaying() else 0)
model = torch.nn.Linear(6, 4)
opt = torch.optim.RMSprop(model.parameters(), lr=1e-2)
rec = crashcap.Recorder(a.record, model=model, optimizer=opt, keyframe_every=4, quiet=True)
x, y = torch.empty(10, 6), torch.empty(10, dtype=torch.long)
for i in range(a.steps):
    x.normal_()
    y.random_(0, 4)
    with rec.step(i, x=x, y=y):
        p_ = torch.softmax(model(x), dim=1)
        if i == a.fault_step:
            p_ = p_ * (torch.arange(10) != 3).float().unsqueeze(1)  # row 3's probabilities become 0
        loss = -torch.log(p_.gather(1, y.unsqueeze(1))).mean()
        loss.backward()
        rec.end(loss)
        opt.step()
        opt.zero_grad()
rec.close()
print("trained", a.steps)
sys.exit(0)
