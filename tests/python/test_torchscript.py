"""The opt-in TorchScript path: a Python training that gives its step as a scripted module is
recorded as a TorchScript step program and replays in crashcap's own process, without Python."""

import os
import shutil

from conftest import TRAININGS, crashcap_json, only_bundle, run_python


def test_a_scripted_step_replays_bit_for_bit_without_the_python_program(tmp_path):
    script = tmp_path / "scripted.py"
    shutil.copy(os.path.join(TRAININGS, "scripted.py"), script)
    r = run_python(str(script), "--record", "runs", "--fault-step", 20, "--fault-row", 5, "--workers", 2, cwd=tmp_path)
    assert r.returncode != 0, r.stdout + r.stderr
    bundle = only_bundle(tmp_path / "runs")
    story = crashcap_json("inspect", bundle)
    assert story["program"]["format"] == "torchscript", story["program"]
    assert story["crash"]["kind"] == "nonfinite" and story["crash"]["step"] == 20
    # The program is gone: only a replay in crashcap's own process can still run the step.
    script.unlink()
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    assert replay["keyframe"] == 18 and [s["step"] for s in replay["steps"]] == [18, 19, 20]
    assert all(s["bitwise"] for s in replay["steps"] if s["recorded_loss"] is not None), replay["steps"]
    triage = crashcap_json("triage", bundle)
    verdicts = {h["id"]: h["verdict"] for h in triage["hypotheses"]}
    assert verdicts["invalid-data"] == "confirmed", triage["hypotheses"]
    assert triage["culprit"]["rows"] == [5]


def test_sgd_with_momentum_replays_bit_for_bit_from_a_python_optimizer_state(tmp_path):
    r = run_python(os.path.join(TRAININGS, "scripted.py"), "--record", "runs", "--fault-step", 15, "--optimizer", "sgd",
                   cwd=tmp_path)
    assert r.returncode != 0
    replay = crashcap_json("replay", only_bundle(tmp_path / "runs"))
    assert replay["verdict"] == "reproduced-bitwise", replay
    assert replay["keyframe"] == 12


def test_an_optimizer_libtorch_lacks_or_a_step_that_is_not_torchscript_is_refused_at_once(tmp_path):
    r = run_python(os.path.join(TRAININGS, "scripted.py"), "--record", "runs", "--optimizer", "adamax", cwd=tmp_path)
    assert r.returncode != 0
    assert "ValueError" in r.stderr and "'adamax'" in r.stderr and "record without program=" in r.stderr, r.stderr
    script = tmp_path / "eager.py"
    script.write_text("import torch, crashcap\n"
                      "m = torch.nn.Linear(2, 2)\n"
                      "crashcap.Recorder('runs', model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1), program=m)\n")
    r = run_python(str(script), cwd=tmp_path)
    assert r.returncode != 0
    assert "TypeError" in r.stderr and "takes a TorchScript module" in r.stderr and "Linear" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists() or not os.listdir(tmp_path / "runs")
