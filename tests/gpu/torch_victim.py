"""A PyTorch training on the GPU that fails the way real trainings do, for `./dev gpu-check`.

    python3 torch_victim.py [--fault none|assert|fork|oom] [--epochs N] [--workers N]

It needs only a python3 whose torch sees a GPU (not crashcap's Python package): `crashcap run`
supervises it and CUDA loads the kernel tracer into it, as for any other command. It is also an
unmodified training for `crashcap run --record`: a DataLoader over a map-style dataset, a model,
AdamW, a scheduler; on a machine without a GPU it trains on the CPU, so that a recording made on
a GPU replays there.

  none    a few epochs of a small classifier, clean.
  assert  dataset index 37 has label 10 of ten classes: on the GPU, cross_entropy's
          device-side assert, reported by CUDA at a later call, not at the launch that failed
          (on the CPU: "Target 10 is out of bounds").
  fork    CUDA is initialised, then a DataLoader forks workers whose dataset puts a tensor on
          the GPU: "Cannot re-initialize CUDA in forked subprocess".
  oom     an allocation larger than the GPU: "CUDA out of memory".
"""
import argparse
import sys

import torch
import torch.nn.functional as F

BAD_INDEX = 37


class Samples(torch.utils.data.Dataset):
    """256 samples of 16 features; the label is a function of the index, one of them wrong."""

    def __init__(self, bad_index):
        self.bad_index = bad_index

    def __len__(self):
        return 256

    def __getitem__(self, i):
        x = torch.randn(16, generator=torch.Generator().manual_seed(i))
        y = 10 if i == self.bad_index else (i * 7) % 10
        return x, torch.tensor(y)


class OnTheGpu(torch.utils.data.Dataset):
    """A dataset that builds its samples on the GPU, as a careless one would."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((16,), float(i), device="cuda")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=["none", "assert", "fork", "oom"], default="none")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and args.fault in ("fork", "oom"):
        print(f"torch_victim: --fault {args.fault} needs a GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if args.fault == "fork":
        loader = torch.utils.data.DataLoader(OnTheGpu(), batch_size=8, num_workers=max(args.workers, 1),
                                             multiprocessing_context="fork")
        for batch in loader:
            model(batch).sum().backward()
        return 0
    if args.fault == "oom":
        total = torch.cuda.mem_get_info()[1]
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    dataset = Samples(BAD_INDEX if args.fault == "assert" else -1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=True, num_workers=args.workers,
                                         generator=torch.Generator().manual_seed(0))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    step = 0
    for epoch in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
            step += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
