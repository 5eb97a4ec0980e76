"""A DDP training whose ranks torch.multiprocessing.spawn starts, as tutorials write it: the script
is its own launcher, and each rank is a function run in a spawned process (Gloo, CPU). Each rank's
DataLoader has a worker of its own, started with spawn too. Knows nothing of crashcap.

--nan-step N puts a NaN into one sample of rank 1's batch at step N (the one its sampler puts in
row 5 there); --bad-label-step N gives that sample the label 99, which cross_entropy refuses, so
rank 1 raises in its forward while rank 0 waits for it in the step's all-reduce. --report-queue passes the ranks a multiprocessing queue for their last loss, as
scripts that collect results do. --api-token is a secret on the command line, as scripts that log
to a tracking service take one; nothing uses it."""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def train(rank, world_size, port, steps, nan_step, queue=None, bad_label_step=-1):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = torch.randint(0, 3, (256,))
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, shuffle=True, seed=2)
    if rank == 1 and nan_step >= 0:
        x[list(sampler)[nan_step * 8 + 5], 3] = float("nan")
    if rank == 1 and bad_label_step >= 0:
        y[list(sampler)[bad_label_step * 8 + 5]] = 99
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=1, multiprocessing_context="spawn")
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step, (xb, yb) in enumerate(loader):
        if step == steps:
            break
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
    if queue is not None:
        queue.put((rank, loss.item()))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--nan-step", type=int, default=-1)
    p.add_argument("--bad-label-step", type=int, default=-1)
    p.add_argument("--report-queue", action="store_true")
    p.add_argument("--api-token", default="")
    a = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue() if a.report_queue else None
    mp.spawn(train, args=(a.nproc, port, a.steps, a.nan_step, queue, a.bad_label_step), nprocs=a.nproc, join=True)
    print("trained")


if __name__ == "__main__":
    main()
