"""A plain DDP training on the CPU with the Gloo backend: a small MLP, a DistributedSampler, SGD
with momentum. Knows nothing of crashcap.

Started without RANK in its environment, it is its own launcher, as torchrun would be (torchrun
itself fails at start-up with Debian's torch 1.13 on Python 3.11): it starts --nproc copies of
itself with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set, and exits with the
first failing rank's status. Under `crashcap run --nproc N` (or any launcher) RANK is set and it
is one rank.

Faults, at --fail-step on --fail-rank: raise (a Python exception), kill (SIGKILL to itself, as the
kernel's OOM killer would), nan (a NaN in one sample of the rank's batch). --hang-rank hangs at
--fail-step before its collective, as a rank stuck in a data loader or a deadlock does.
DDP_TEST_HANG_AT_STEP=N in the environment makes every rank hang so at step N (a job none of whose
ranks ends; the tests set it for a replay only)."""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--fail-rank", type=int, default=-1, help="this rank fails at --fail-step")
    p.add_argument("--fail-step", type=int, default=3)
    p.add_argument("--fail-how", choices=("raise", "kill", "nan"), default="raise")
    p.add_argument("--hang-rank", type=int, default=-1, help="this rank hangs at --fail-step")
    args = p.parse_args()
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ranks = [subprocess.Popen([sys.executable, *sys.argv],
                                  env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.nproc),
                                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
                 for r in range(args.nproc)]
        codes = [r.wait() for r in ranks]
        sys.exit(next((c for c in codes if c != 0), 0))
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = (x.sum(1, keepdim=True) > 0).float()
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, shuffle=True, seed=1)
    rank = dist.get_rank()
    if rank == args.fail_rank and args.fail_how == "nan":
        # A corrupt sample in the data: the one this rank's sampler puts in row 5 at --fail-step.
        x[list(sampler)[args.fail_step * 16 + 5], 2] = float("nan")
    loader = DataLoader(data, batch_size=16, sampler=sampler, num_workers=0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    hang_all = int(os.environ.get("DDP_TEST_HANG_AT_STEP", -1))
    for xb, yb in loader:
        failing = rank == args.fail_rank and step == args.fail_step
        if (rank == args.hang_rank and step == args.fail_step) or step == hang_all:
            time.sleep(3600)
        loss = nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
        if failing and args.fail_how == "raise":
            raise RuntimeError(f"rank {args.fail_rank} gives up at step {step}")
        if failing and args.fail_how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step == args.steps:
            break
    dist.destroy_process_group()
    print(f"trained {step} steps")


if __name__ == "__main__":
    main()
