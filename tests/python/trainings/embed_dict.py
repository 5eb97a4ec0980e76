"""A training that is not the sample: a token classifier (embedding, GRU, attention pooling)
over dict batches with a nested dict, Adam with a OneCycle schedule and label smoothing, no
DataLoader (a generator of batches). At --fault-step, row --fault-row carries a token id past
the vocabulary: the embedding raises."""

import argparse
import sys

import torch
import torch.nn as nn

import crashcap

p = argparse.ArgumentParser()
p.add_argument("--record", required=True)
p.add_argument("--steps", type=int, default=24)
p.add_argument("--fault-step", type=int, default=-1)
p.add_argument("--fault-row", type=int, default=1)
a = p.parse_args()

VOCAB, LEN, B = 50, 12, 8


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.rnn = nn.GRU(16, 24, batch_first=True)
        self.score = nn.Linear(24, 1)
        self.out = nn.Linear(24, 3)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long), persistent=False)

    def forward(self, tokens):
        self.calls += 1
        h, _ = self.rnn(self.embed(tokens))
        w = torch.softmax(self.score(h).squeeze(-1), dim=1)
        return self.out((w.unsqueeze(-1) * h).sum(1))


def batches():
    g = torch.Generator().manual_seed(7)
    step = 0
    while True:
        tokens = torch.randint(0, VOCAB, (B, LEN), generator=g)
        if step == a.fault_step:
            tokens[a.fault_row, 3] = VOCAB + 5
        yield {"inputs": {"tokens": tokens, "lengths": torch.full((B,), LEN)}, "label": tokens[:, 0] % 3,
               "index": torch.arange(step * B, step * B + B)}
        step += 1


torch.manual_seed(0)
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=a.steps + 1)
rec = crashcap.Recorder(a.record, model=model, optimizer=opt, scheduler=sched, keyframe_every=5, quiet=True)
loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
for step, batch in rec.steps(batches()):
    loss = loss_fn(model(batch["inputs"]["tokens"]), batch["label"])
    loss.backward()
    rec.end(loss)
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()
    if step + 1 >= a.steps:
        break
rec.close()
print("trained", a.steps)
sys.exit(0)
