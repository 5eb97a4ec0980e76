#!/usr/bin/env python3
"""What `crashcap run`'s kernel tracer (libcrashcap_inject.so: CUPTI activities and the launch
ring) costs a real PyTorch training on a GPU. Needs a GPU that python3's torch sees; without one it
says so and exits 2.

The training (`--child`): a small convolutional classifier on random CUDA data, many small kernels
a step (the tracer's worst case: its cost is per launch, not per FLOP), Adam, a cosine schedule.
It times its own loop (after warm-up steps, with a synchronize at both ends) and prints it as
JSON, so interpreter start-up and CUDA initialisation do not dilute the ratio.

The driver runs the training bare (`python3 gpu_tracer.py --child`) and under `crashcap run`
(`crashcap run --dir D -- python3 gpu_tracer.py --child`, the tracer on as `crashcap run` has it
by default), interleaved, in an order shuffled each round (seeded: the same each time). Each round's ratio is wrapped loop
time over bare loop time; the report is the median over rounds with its min, max and 95%
interval (bench/ratios.py). A wrapped run must also leave no bundle and exit 0.

    python3 bench/gpu_tracer.py --crashcap build/bin/crashcap [--rounds 8] [--steps 300] [--json]
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(steps, warmup, batch):
    import torch
    import torch.nn as nn

    if not torch.cuda.is_available():
        print("gpu_tracer: torch sees no GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.1), nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps + warmup)
    x = torch.randn(16, batch, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (16, batch), device=dev)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    start = None
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[i % 16]), y[i % 16])
        loss.backward()
        opt.step()
        sched.step()
    torch.cuda.synchronize()
    loop = time.perf_counter() - start
    print(json.dumps({"loop_s": loop, "steps": steps, "final_loss": float(loss)}), flush=True)
    return 0


def run_once(cmd, env):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("{")), None)
    if p.returncode != 0 or line is None:
        raise SystemExit(f"gpu_tracer: {' '.join(cmd)} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return json.loads(line)["loop_s"], wall


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help="run the training itself (what the driver times)")
    ap.add_argument("--crashcap", help="the crashcap binary (driver)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=PARTS",
                    help="also run under `crashcap run` with CRASHCAP_TRACE_LEAVE_OUT=PARTS (api-callbacks, "
                         "api-activity, kernel-activity, comma-separated), reported as NAME; `none` for --no-trace")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    train = [sys.executable, os.path.abspath(__file__), "--child", "--steps", str(a.steps), "--warmup",
             str(a.warmup), "--batch", str(a.batch)]
    if a.rounds < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("--rounds and --steps must be at least 1, --warmup at least 0")
    if a.child:
        return child(a.steps, a.warmup, a.batch)
    if not a.crashcap:
        ap.error("--crashcap PATH is needed (the driver runs the training under it)")
    probe = subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                           capture_output=True)
    if probe.returncode != 0:
        print("gpu_tracer: python3's torch sees no GPU here; nothing to measure", file=sys.stderr)
        return 2
    sys.path.insert(0, HERE)
    from ratios import median_interval

    configs = [("tracer", "")]
    for v in a.variant:
        name, sep, parts = v.partition("=")
        if not sep or not name:
            ap.error(f"--variant {v!r}: expected NAME=PARTS")
        if name in ("bare", "tracer") or name in (c[0] for c in configs):
            ap.error(f"--variant {v!r}: the name {name!r} is taken")
        configs.append((name, parts))
    rows = []
    shuffle = random.Random(1)
    with tempfile.TemporaryDirectory(prefix="crashcap-gpu-tracer-") as tmp:
        for r in range(a.rounds):
            order = [("bare", train, None)]
            for name, parts in configs:
                d = os.path.join(tmp, f"r{r}-{name}")
                flags = ["--no-trace"] if parts == "none" else []
                order.append((name, [a.crashcap, "run", "--dir", d] + flags + ["--"] + train, (d, parts)))
            shuffle.shuffle(order)  # no configuration always follows another
            got = {}
            for name, cmd, wrapped in order:
                env = dict(os.environ)
                env.pop("CRASHCAP_TRACE_LEAVE_OUT", None)
                if wrapped and wrapped[1] not in ("", "none"):
                    env["CRASHCAP_TRACE_LEAVE_OUT"] = wrapped[1]
                got[name] = run_once(cmd, env)
                if wrapped:
                    left = [f for f in os.listdir(wrapped[0]) if f.endswith(".ccap")] if os.path.isdir(wrapped[0]) else []
                    if left:
                        raise SystemExit(f"gpu_tracer: a clean wrapped run ({name}) left {left}")
            row = {"round": r, "order": [o[0] for o in order]}
            for name, (loop, wall) in got.items():
                row[name] = {"loop_s": loop, "wall_s": wall}
                if name != "bare":
                    row[name]["loop_ratio"] = loop / got["bare"][0]
                    row[name]["wall_ratio"] = wall / got["bare"][1]
            rows.append(row)
            if not a.json:
                print(f"round {r}: bare {got['bare'][0]:.3f} s; " + ", ".join(
                    f"{n} {row[n]['loop_ratio']:.3f}" for n, _ in configs), flush=True)
    out = {"steps": a.steps, "rounds": a.rounds, "batch": a.batch,
           "bare_step_ms": 1e3 * statistics.median(x["bare"]["loop_s"] for x in rows) / a.steps, "configs": {}, "rows": rows}
    for name, parts in configs:
        loop = [x[name]["loop_ratio"] for x in rows]
        wall = [x[name]["wall_ratio"] for x in rows]
        out["configs"][name] = {
            "leave_out": parts, "step_ms": 1e3 * statistics.median(x[name]["loop_s"] for x in rows) / a.steps,
            "loop_ratio": median_interval(loop), "loop_ratio_min": min(loop), "loop_ratio_max": max(loop),
            "wall_ratio": median_interval(wall)}
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"bare: {out['bare_step_ms']:.3f} ms a step")
        for name, c in out["configs"].items():
            print(f"{name}: {c['step_ms']:.3f} ms a step, loop ratio {c['loop_ratio']['median']:.3f} "
                  f"({c['loop_ratio_min']:.3f}-{c['loop_ratio_max']:.3f}), wall ratio {c['wall_ratio']['median']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
