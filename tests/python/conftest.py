"""Shared helpers of the Python tests. ctest runs them with PYTHONPATH=build/python,
CRASHCAP_BIN=build/bin and CRASHCAP_SOURCE=the source tree (tests/CMakeLists.txt)."""

import glob
import json
import os
import subprocess
import sys

import pytest

BIN = os.environ.get("CRASHCAP_BIN", "")
SOURCE = os.environ.get("CRASHCAP_SOURCE", os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
PYTHON = sys.executable
SAMPLE = os.path.join(SOURCE, "samples", "python", "train.py")
TRAININGS = os.path.join(os.path.dirname(__file__), "trainings")


def python_stack_on_signal():
    """Whether this interpreter lets crashcap write its Python stack on a fatal signal (it exports
    CPython's _Py_DumpTraceback; Debian's 3.11 does)."""
    r = subprocess.run([PYTHON, "-c", "import crashcap._native as n; print(n.python_stack_on_signal)"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip() == "True"


def crashcap(*args, cwd=None, check=False, timeout=900, env=None):
    """Runs the crashcap CLI; returns the CompletedProcess (text). `env`: variables added to this
    process's environment."""
    if not BIN:
        pytest.skip("CRASHCAP_BIN is not set (ctest sets it)")
    r = subprocess.run([os.path.join(BIN, "crashcap"), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, **env) if env else None)
    if check and r.returncode != 0:
        raise AssertionError(f"crashcap {' '.join(map(str, args))} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def crashcap_json(*args, cwd=None):
    r = crashcap(*args[:2], "--json", *args[2:], cwd=cwd)
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"crashcap {' '.join(map(str, args))} --json printed no JSON (exit {r.returncode}):\n"
                             f"{r.stdout}\n{r.stderr}")


def triage_json_and_text(bundle):
    """One `crashcap triage` (minutes), both its forms: (the JSON --json-out wrote, the text printed)."""
    out = os.path.join(os.path.dirname(str(bundle)), "triage.json")
    r = crashcap("triage", bundle, "--json-out", out, check=True)
    assert f"wrote {out}" in r.stderr, r.stderr
    with open(out) as f:
        return json.load(f), r.stdout


def run_python(script, *args, cwd, env=None, timeout=600):
    """Runs a Python training as a user would: the crashcap package on PYTHONPATH."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([PYTHON, script, *map(str, args)], cwd=cwd, capture_output=True, text=True, env=e,
                          timeout=timeout)


def only_bundle(directory):
    bundles = glob.glob(os.path.join(str(directory), "crash-*.ccap"))
    assert len(bundles) == 1, f"expected one crash bundle in {directory}, found {bundles}"
    return bundles[0]


# ---- crashcap run --record over the trainings in observed/ ----------------------------------------

OBSERVED = os.path.join(os.path.dirname(__file__), "observed")


def run_recorded(tmp_path, script, *args, options=()):
    """crashcap run --record over the script; (CompletedProcess, the run's directory)."""
    runs = tmp_path / "runs"
    r = crashcap("run", "--record", *options, "--dir", runs, "--", PYTHON, os.path.join(OBSERVED, script), *args,
                 cwd=tmp_path)
    return r, runs


def run_bare(tmp_path, script, *args):
    return subprocess.run([PYTHON, os.path.join(OBSERVED, script), *map(str, args)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)


def verdicts(triage):
    return {h["id"]: h["verdict"] for h in triage["hypotheses"]}


def replay_and_triage(bundle):
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    triage = crashcap_json("triage", bundle)
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    return replay, triage


def record_written_program(tmp_path, *options):
    """Record tmp_path/train.py, run from tmp_path, until its non-finite loss; return the bundle."""
    r = crashcap("run", "--record", *options, "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    return only_bundle(tmp_path / "runs")
