"""Bad input to the Python recorder and to replays of Python recordings: each a clear message,
and nothing lost."""

import json
import os
import shutil
import subprocess
import textwrap
import time

from conftest import BIN, PYTHON, TRAININGS, crashcap, crashcap_json, only_bundle, run_python


def recorded_copy(tmp_path):
    """A crash recorded from a copy of a training script the test may then change."""
    script = tmp_path / "train.py"
    shutil.copy(os.path.join(TRAININGS, "mlp_tuple.py"), script)
    r = run_python(str(script), "--record", "runs", "--fault-step", 9, cwd=tmp_path)
    assert r.returncode != 0
    return script, only_bundle(tmp_path / "runs")


def test_a_changed_script_is_named_and_refused_unless_asked_to_go_on(tmp_path):
    script, bundle = recorded_copy(tmp_path)
    with open(script, "a") as f:
        f.write("# an edit after the crash\n")
    r = crashcap("replay", bundle)
    assert r.returncode != 0
    assert "train.py (changed since the recording)" in r.stderr and "--allow-changed-source" in r.stderr
    went_on = crashcap_json("replay", bundle, "--allow-changed-source")
    assert went_on["verdict"] == "reproduced", went_on  # the code differs: the bits are not held to it
    assert any("train.py" in n and "changed" in n for n in went_on["notes"])
    assert os.path.exists(bundle)


def test_a_missing_script_is_named(tmp_path):
    script, bundle = recorded_copy(tmp_path)
    os.remove(script)
    r = crashcap("replay", bundle)
    assert r.returncode != 0 and "train.py" in r.stderr


def test_another_torch_version_is_named_in_the_verdict(tmp_path):
    # A sitecustomize that makes torch report another version in the replaying process only.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        import os
        if "CRASHCAP_REPLAY_REQUEST" in os.environ:
            import torch
            torch.__version__ = "9.9.0"
    """))
    script = tmp_path / "train.py"
    shutil.copy(os.path.join(TRAININGS, "mlp_tuple.py"), script)
    pythonpath = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    r = run_python(str(script), "--record", "runs", "--fault-step", 9, cwd=tmp_path, env={"PYTHONPATH": pythonpath})
    assert r.returncode != 0
    replay = crashcap_json("replay", only_bundle(tmp_path / "runs"))
    assert any(n.startswith("torch 9.9.0 here,") for n in replay["notes"]), replay["notes"]
    assert replay["verdict"] == "reproduced" and replay["same_setup"] is False


def test_a_replaying_program_that_never_answers_is_stopped_at_the_timeout_and_named(tmp_path):
    # A sitecustomize that makes the replaying process (only) hang before it can answer, as a
    # program stuck in a DataLoader worker or a lock would.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        import os, time
        if "CRASHCAP_REPLAY_REQUEST" in os.environ:
            time.sleep(3600)
    """))
    script = tmp_path / "train.py"
    shutil.copy(os.path.join(TRAININGS, "mlp_tuple.py"), script)
    pythonpath = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    r = run_python(str(script), "--record", "runs", "--fault-step", 9, cwd=tmp_path, env={"PYTHONPATH": pythonpath})
    assert r.returncode != 0
    bundle = only_bundle(tmp_path / "runs")
    started = time.monotonic()
    r = crashcap("replay", bundle, "--timeout", 3, timeout=120, env={"PYTHONPATH": pythonpath})
    assert 3 <= time.monotonic() - started < 60
    assert r.returncode != 0, r.stdout
    assert "had not answered 3 s after it was started to replay" in r.stderr and "train.py" in r.stderr, r.stderr
    assert "and was stopped (--timeout)" in r.stderr and "raise --timeout" in r.stderr, r.stderr
    r = crashcap("replay", bundle, "--json", "--timeout", 3, timeout=120, env={"PYTHONPATH": pythonpath})
    failed = json.loads(r.stdout)  # JSON: the error, with its code
    assert r.returncode != 0 and failed["error"]["code"] == "limit-exceeded", failed
    assert os.path.exists(bundle)


def test_the_libtorch_free_crashcap_inspects_a_python_bundle(tmp_path):
    _, bundle = recorded_copy(tmp_path)
    libs = subprocess.run(["ldd", os.path.join(BIN, "crashcap")], capture_output=True, text=True).stdout
    assert "libtorch" not in libs and "libc10" not in libs
    story = crashcap_json("inspect", bundle)
    assert story["program"]["format"] == "python"
    assert [s["path"] for s in story["program"]["sources"]] == ["train.py"]
    assert story["env"]["facts"]["python.executable"]
    text = crashcap("inspect", bundle, check=True).stdout
    assert "python (its own loop replays it" in text and "sources    train.py" in text


def test_a_model_whose_parameters_are_not_the_optimizers_is_refused_before_training(tmp_path):
    r = subprocess.run([PYTHON, "-c", textwrap.dedent("""
        import torch, crashcap
        model = torch.nn.Linear(3, 3)
        opt = torch.optim.SGD(torch.nn.Linear(3, 3).parameters(), lr=0.1)
        crashcap.Recorder("runs", model=model, optimizer=opt)
    """)], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode != 0
    assert "ValueError: the optimizer's parameter 0 of group 0 (shape [3, 3]) is not a parameter of the model" in r.stderr
    assert not (tmp_path / "runs").exists(), "nothing is recorded for a refused setup"


def test_an_unknown_option_is_a_type_error_that_lists_the_known_ones(tmp_path):
    r = subprocess.run([PYTHON, "-c", textwrap.dedent("""
        import torch, crashcap
        model = torch.nn.Linear(3, 3)
        crashcap.Recorder("runs", model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), keyframes=3)
    """)], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode != 0 and "unknown options ['keyframes']" in r.stderr and "keyframe_every" in r.stderr


def test_a_keyframe_cadence_that_is_neither_steps_nor_auto_is_refused_and_auto_is_the_default(tmp_path):
    r = subprocess.run([PYTHON, "-c", textwrap.dedent("""
        import torch, crashcap
        model = torch.nn.Linear(3, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for bad in ("fast", 0, -2):
            try:
                crashcap.Recorder("runs", model=model, optimizer=opt, keyframe_every=bad, quiet=True)
            except crashcap.Error as e:
                print("refused", bad, e)
        for every in ("auto", None, 7):
            policy = {} if every is None else {"keyframe_every": every}
            rec = crashcap.Recorder("runs", model=model, optimizer=opt, quiet=True, **policy)
            print("interval", every, rec.stats()["keyframe_interval"])
            rec.close()
    """)], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [l.split()[1] for l in lines if l.startswith("refused")] == ["fast", "0", "-2"], r.stdout
    assert 'must be a number of steps or "auto"' in r.stdout and 'must be >= 1, or "auto"' in r.stdout
    assert [l for l in lines if l.startswith("interval")] == ["interval auto 50", "interval None 50", "interval 7 7"]


def test_a_python_package_given_under_another_name_than_crashcap_is_refused_not_run_unrecorded(tmp_path):
    # The recorded program imports the package as `crashcap` from the directory above it: a copy
    # under another name would leave the training unrecorded, said only in the child's stderr.
    package = os.path.join(BIN, os.pardir, "python", "crashcap")
    shutil.copytree(package, tmp_path / "old-package")
    env = dict(os.environ, CRASHCAP_PYTHON_PACKAGE=str(tmp_path / "old-package"))
    r = subprocess.run([os.path.join(BIN, "crashcap"), "run", "--record", "--dir", str(tmp_path / "runs"), "--",
                        PYTHON, "-c", "print('ran')"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "ran" not in r.stdout, (r.stdout, r.stderr)
    assert "named 'old-package'" in r.stderr and "must be named crashcap" in r.stderr, r.stderr
    shutil.copytree(package, tmp_path / "old" / "crashcap")
    env["CRASHCAP_PYTHON_PACKAGE"] = str(tmp_path / "old" / "crashcap") + "/"
    r = subprocess.run([os.path.join(BIN, "crashcap"), "run", "--record", "--dir", str(tmp_path / "runs"), "--",
                        PYTHON, "-c", "import torch, crashcap._observe as o; print(o.__file__)"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0 and "not recording" not in r.stderr, r.stderr
    assert r.stdout.strip() == str(tmp_path / "old" / "crashcap" / "_observe.py"), r.stdout  # the copy records
