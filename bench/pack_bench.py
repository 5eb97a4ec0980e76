#!/usr/bin/env python3
"""What `crashcap pack` costs against `crashcap replay` of the same bundle, and how much smaller
the attachment is. Pack replays the crash first (to check it and to write the keyframe at the
failing step), so its time is a replay plus the copy: the ratio says what the copy adds.

Bundles, recorded once before the rounds:
  seg-far       the segmentation sample, a keyframe every 50 steps, NaN sample at step 49: the
                replay runs 50 steps, the pack keeps one
  cls-near      the classifier sample, a keyframe every 4 steps, NaN sample at step 9
  python        the Python sample (DataLoader with workers, AdamW, schedule), NaN sample at step 19,
                a keyframe every 10 steps: replay and pack start the Python program
Each round runs `crashcap replay B --json` and `crashcap pack B -o P --force --json` as child
processes, the order alternating from round to round; times are wall clock (process start and
bundle reading included, as a user sees them). The ratio is per round; the reported ratio is the
median over rounds, with its min and max.

    ./dev bench pack [--json] [--rounds N] [--only NAME]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def crashcap(bin_dir, *args):
    start = time.perf_counter()
    r = subprocess.run([os.path.join(bin_dir, "crashcap"), *map(str, args)], capture_output=True, text=True)
    ms = 1000 * (time.perf_counter() - start)
    if r.returncode not in (0, 1):
        sys.exit(f"crashcap {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr}")
    return json.loads(r.stdout), ms


def only_bundle(directory):
    found = [os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".ccap")]
    if len(found) != 1:
        sys.exit(f"expected one bundle in {directory}, found {found}")
    return found[0]


def record(bin_dir, build_python, scratch):
    """{name: bundle path} of the benchmark's crashes."""
    bundles = {}
    cases = {
        "seg-far": [os.path.join(bin_dir, "crashcap-sample-seg"), "--steps", "60", "--fault", "nan-sample",
                    "--fault-step", "49", "--keyframe-every", "50"],
        "cls-near": [os.path.join(bin_dir, "crashcap-sample-cls"), "--steps", "14", "--fault", "nan-sample",
                     "--fault-step", "9", "--keyframe-every", "4"],
        "python": ["/usr/bin/python3", os.path.join(ROOT, "samples", "python", "train.py"), "--steps", "30", "--fault",
                   "nan-sample", "--fault-step", "19", "--keyframe-every", "10", "--workers", "2", "--quiet"],
    }
    for name, argv in cases.items():
        directory = os.path.join(scratch, name)
        os.makedirs(directory)
        env = dict(os.environ, PYTHONPATH=build_python)
        r = subprocess.run(argv + ["--record", directory], capture_output=True, text=True, env=env, cwd=directory)
        if r.returncode == 0:
            sys.exit(f"{name}: the training did not fail: {r.stdout}{r.stderr}")
        bundles[name] = only_bundle(directory)
    return bundles


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--only", help="one bundle: seg-far, cls-near or python")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = p.parse_args()
    bin_dir = os.path.join(a.build, "bin")
    scratch = tempfile.mkdtemp(prefix="crashcap-bench-pack-")
    results = []
    try:
        bundles = record(bin_dir, os.path.join(a.build, "python"), scratch)
        for name, bundle in bundles.items():
            if a.only and name != a.only:
                continue
            packed = os.path.join(scratch, name + "-packed.ccap")
            replay_ms, pack_ms, ratios, last = [], [], [], None
            for r in range(a.rounds):
                timings = {}
                for which in (["replay", "pack"] if r % 2 == 0 else ["pack", "replay"]):
                    if which == "replay":
                        out, timings[which] = crashcap(bin_dir, "replay", bundle, "--json")
                        if out["verdict"] != "reproduced-bitwise":
                            sys.exit(f"{name}: replay verdict {out['verdict']}")
                    else:
                        last, timings[which] = crashcap(bin_dir, "pack", bundle, "-o", packed, "--force", "--json")
                replay_ms.append(timings["replay"])
                pack_ms.append(timings["pack"])
                ratios.append(timings["pack"] / timings["replay"])
                if not a.json:
                    print(f"{name} round {r + 1}: replay {timings['replay']:.0f} ms  pack {timings['pack']:.0f} ms "
                          f"(x{ratios[-1]:.2f})", file=sys.stderr)
            again, _ = crashcap(bin_dir, "replay", packed, "--json")
            results.append({
                "bundle": name,
                "replay_ms": statistics.median(replay_ms),
                "pack_ms": statistics.median(pack_ms),
                "pack_over_replay": statistics.median(ratios),
                "pack_over_replay_spread": {"min": min(ratios), "max": max(ratios)},
                "original_bytes": last["original_bytes"],
                "packed_bytes": last["packed_bytes"],
                "size_ratio": last["packed_bytes"] / last["original_bytes"],
                "keyframe_materialised": last["replay"]["keyframe_materialised"],
                "replay_from_keyframe": last["replay"]["from_keyframe"],
                "steps_kept": last["steps"],
                "packed_verdict": again["verdict"],
            })
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = {"rounds": a.rounds, "cpus": os.cpu_count(), "bundles": results}
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for b in results:
            print(f"{b['bundle']:9} replay {b['replay_ms']:7.0f} ms  pack {b['pack_ms']:7.0f} ms  "
                  f"x{b['pack_over_replay']:.2f} ({b['pack_over_replay_spread']['min']:.2f}..{b['pack_over_replay_spread']['max']:.2f})  "
                  f"{b['original_bytes'] / 2**20:.1f} MiB -> {b['packed_bytes'] / 2**20:.2f} MiB  packed replays {b['packed_verdict']}")


if __name__ == "__main__":
    main()
