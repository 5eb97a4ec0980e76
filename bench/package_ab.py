#!/usr/bin/env python3
"""Whether a change to crashcap's Python package costs a recorded training anything: the same
training recorded by `crashcap run --record` with two packages (CRASHCAP_PYTHON_PACKAGE picks
each), in pairs that alternate which runs first. Prints the median ratio new/old of the wall time
and of the processor time (the children's user + system) with their intervals.

The old package is made from the new one's directory (its native module included) with the
Python files of a commit put back:

    git worktree add /tmp/old <commit>   # or any checkout of it
    mkdir /tmp/pkg-old && cp -r build/python/crashcap /tmp/pkg-old/ && cp /tmp/old/python/crashcap/*.py /tmp/pkg-old/crashcap/
    /usr/bin/python3 bench/package_ab.py --old /tmp/pkg-old/crashcap --new build/python/crashcap [--rounds 24]

The first pair runs each package once before it counts (the bytecode of a package is compiled by
its first run). The training runs from the repository root: samples/python/train.py by default,
any command after `--` otherwise.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ratios import median_interval  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(crashcap, package, command, directory):
    """(wall seconds, processor seconds) of one recorded run of `command` with `package`."""
    shutil.rmtree(directory, ignore_errors=True)
    env = dict(os.environ, CRASHCAP_PYTHON_PACKAGE=os.path.abspath(package))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run([crashcap, "run", "--record", "--dir", directory, "--"] + command, cwd=ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"package_ab: the run with {package} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", required=True, help="the crashcap package directory to compare against")
    p.add_argument("--new", required=True, help="the crashcap package directory under test")
    p.add_argument("--rounds", type=int, default=24, help="pairs that count (default 24)")
    p.add_argument("--crashcap", default=os.path.join(ROOT, "build", "bin", "crashcap"))
    p.add_argument("--json", action="store_true")
    p.add_argument("command", nargs="*", help="the training (default: /usr/bin/python3 samples/python/train.py)")
    a = p.parse_args()
    for package in (a.old, a.new):
        if not os.path.isfile(os.path.join(package, "__init__.py")):
            p.error(f"{package} is not a crashcap package directory (no __init__.py)")
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    command = a.command or ["/usr/bin/python3", "samples/python/train.py"]
    wall, cpu = [], []
    with tempfile.TemporaryDirectory(prefix="package_ab.") as tmp:
        directory = os.path.join(tmp, "runs")
        for package in (a.old, a.new):  # compiles each package's bytecode; not counted
            run_once(a.crashcap, package, command, directory)
        for i in range(a.rounds):
            order = (a.old, a.new) if i % 2 == 0 else (a.new, a.old)
            times = {package: run_once(a.crashcap, package, command, directory) for package in order}
            old, new = times[a.old], times[a.new]
            wall.append(new[0] / old[0])
            cpu.append(new[1] / old[1])
            if not a.json:
                print(f"pair {i + 1}/{a.rounds}: old {old[0]:.2f} s, new {new[0]:.2f} s, wall ratio {wall[-1]:.3f}, "
                      f"processor ratio {cpu[-1]:.3f}", flush=True)
    result = {"rounds": a.rounds, "command": command, "wall_ratio": median_interval(wall),
              "processor_ratio": median_interval(cpu)}
    if a.json:
        print(json.dumps(result, indent=2))
        return
    for name, key in (("wall", "wall_ratio"), ("processor time", "processor_ratio")):
        r = result[key]
        print(f"new/old {name}: median {r['median']:.3f}, interval {r['low']:.3f}-{r['high']:.3f} "
              f"({100 * r['confidence']:.1f}%)")


if __name__ == "__main__":
    main()
