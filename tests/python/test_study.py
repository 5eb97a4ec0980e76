"""crashcap.optuna and crashcap summary: an Optuna study whose trials die in five different ways
(tests/python/observed/study.py) runs every other trial to the end; each failed trial carries its
bundle and classification; the summary groups the crashes and names the parameter behind each."""

import json
import os
import subprocess
import textwrap

import optuna
import pytest

from crashcap import optuna as crashcap_optuna
from conftest import PYTHON, crashcap, crashcap_json

STUDY = os.path.join(os.path.dirname(__file__), "observed", "study.py")


def run_study(tmp_path, *args):
    r = subprocess.run([PYTHON, STUDY, str(tmp_path / "study"), *map(str, args)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=800)
    return r


def trials_of(tmp_path):
    return optuna.load_study(study_name="mlp", storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}").trials


def test_an_isolated_study_outlives_five_kinds_of_crash_and_the_summary_names_their_causes(tmp_path):
    r = run_study(tmp_path, "--trials", 32)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    trials = trials_of(tmp_path)
    assert len(trials) == 32
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 24 and len(failed) == 8, [(t.number, t.state.name) for t in trials]
    by_number = {t.number: t.user_attrs for t in failed}
    expected = {1: "python-exception", 5: "nonfinite-loss", 9: "signal", 13: "cuda-device-assert", 17: "signal",
                21: "python-exception", 25: "nonfinite-loss", 29: "cuda-device-assert"}
    assert {n: a["crashcap_classification"] for n, a in by_number.items()} == expected
    for number, attrs in by_number.items():
        assert os.path.isfile(attrs["crashcap_bundle"]), (number, attrs)
        assert attrs["crashcap_step"] is not None, (number, attrs)
    # Only the CUDA error left its process unable to go on.
    assert sorted(n for n, a in by_number.items() if a["crashcap_poisoned"]) == [13, 29]
    steps = {n: a["crashcap_step"] for n, a in by_number.items()}
    # SIGKILL (trial 17) is placed by the progress file, whatever of its records reached the disk.
    assert steps == {1: 6, 5: 0, 9: 5, 13: 3, 17: 4, 21: 6, 25: 0, 29: 3}
    assert "SIGSEGV" in by_number[9]["crashcap_error"] and "SIGKILL" in by_number[17]["crashcap_error"]
    # The failed trials' parameters are in the storage, as optuna shows them.
    assert failed[0].params["num_classes"] == 4

    # Damage and foreign files beside the runs are listed, never fatal.
    study = tmp_path / "study"
    bundle = by_number[1]["crashcap_bundle"]
    with open(bundle, "rb") as f:
        head = f.read(3000)
    (study / "cut-short.ccap").write_bytes(head)
    (study / "notes.txt").write_text("what we tried\n")
    summary = crashcap_json("summary", study)
    assert summary["runs"] == 32 and summary["healthy"] == 24 and summary["failed"] == 8
    assert [u["path"] for u in summary["unreadable"]] == ["cut-short.ccap"], summary["unreadable"]
    assert "notes.txt" in summary["skipped"] and "study.db" in summary["skipped"]
    groups = {(g["classification"], g["signature"].split(" | ")[0]): g for g in summary["groups"]}
    assert len(summary["groups"]) == 5, list(groups)
    index = groups[("python-exception", "IndexError: Target N is out of bounds.")]
    assert index["count"] == 2 and index["runs"] == ["trials/trial-0001", "trials/trial-0021"]
    assert index["op"] == "aten::cross_entropy_loss"  # the op the program called, which raised
    assert index["separated_by"][0]["rule"] == "num_classes = 4" and index["separated_by"][0]["healthy"] == 0
    nan = [g for (c, _), g in groups.items() if c == "nonfinite-loss"][0]
    assert nan["count"] == 2 and nan["separated_by"][0]["rule"] == "temperature = 0.0"
    cuda = [g for (c, _), g in groups.items() if c == "cuda-device-assert"][0]
    assert cuda["count"] == 2 and cuda["separated_by"][0]["rule"] == "amp = true"
    assert cuda["signature"].startswith("RuntimeError: CUDA error: device-side assert triggered")
    signals = sorted(g["signature"].split(" | ")[0] for (c, _), g in groups.items() if c == "signal")
    assert len(signals) == 2 and any("SIGSEGV" in s for s in signals) and any("SIGKILL" in s for s in signals)
    text = crashcap("summary", study, check=True).stdout
    assert "apart   num_classes = 4: all 2 of these, 0 of 24 healthy runs" in text, text

    # A crashed trial's bundle replays in the trial's own process, bit for bit, and triage finds the
    # sample with the mislabelled class.
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    triage = crashcap_json("triage", bundle)
    assert triage["culprit"]["dataset_indices"] == [150], triage["culprit"]


def test_in_process_trials_are_recorded_one_by_one_and_a_crash_fails_only_its_trial(tmp_path):
    r = run_study(tmp_path, "--trials", 8, "--in-process")
    assert r.returncode == 0, r.stderr[-5000:]
    trials = trials_of(tmp_path)
    failed = {t.number: t.user_attrs for t in trials if t.state == optuna.trial.TrialState.FAIL}
    assert sorted(failed) == [1, 5]
    assert failed[1]["crashcap_classification"] == "python-exception"
    assert failed[5]["crashcap_classification"] == "nonfinite-loss"
    for attrs in failed.values():
        assert os.path.dirname(attrs["crashcap_bundle"]).endswith(("trial-0001", "trial-0005"))
    # Healthy trials leave no recording behind, only their line in the run log.
    assert not any(name.startswith("recording-") for _, dirs, _ in os.walk(tmp_path / "study") for name in dirs)
    summary = crashcap_json("summary", tmp_path / "study")
    assert summary["runs"] == 8 and summary["healthy"] == 6


def objective(trial):
    return trial.suggest_float("x", 0, 1)


def test_isolation_refuses_what_another_process_cannot_take(tmp_path):
    in_memory = optuna.create_study()
    with pytest.raises(ValueError, match="in-memory study"):
        crashcap_optuna.optimize(in_memory, objective, n_trials=1, directory=tmp_path)
    stored = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    with pytest.raises(ValueError, match="does not pickle"):
        crashcap_optuna.optimize(stored, lambda t: 0.0, n_trials=1, directory=tmp_path)


def test_a_seeded_multivariate_sampler_samples_the_same_with_isolated_trials(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "observed", "sampled_study.py")
    runs = {}
    for mode in ("plain", "isolated"):
        r = subprocess.run([PYTHON, script, str(tmp_path), mode], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(runs["plain"]) == 6
    assert runs["isolated"] == runs["plain"]


def test_parallel_isolated_trials_are_refused_with_what_to_do_instead(tmp_path):
    stored = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    with pytest.raises(ValueError, match="n_jobs=1"):
        crashcap_optuna.optimize(stored, objective, n_trials=2, directory=tmp_path, n_jobs=2)


def test_an_in_process_trial_whose_recording_stopped_on_an_error_of_crashcaps_own_fails_with_no_bundle(tmp_path):
    # Trial 0 breaks crashcap's batch flattening at its third batch and fails at its sixth: the
    # recording stopped at the error is removed with the trial, the failure names no bundle and no
    # step (none of crashcap's), and trial 1 is recorded again from its start.
    (tmp_path / "study.py").write_text(textwrap.dedent("""
        import optuna, torch
        import crashcap._batch
        import crashcap.optuna
        from torch.utils.data import DataLoader, TensorDataset

        flatten = crashcap._batch.flatten
        def broken(*args, **kwargs):
            raise KeyError("put in by the test")

        def objective(trial):
            crashcap._batch.flatten = flatten
            torch.manual_seed(trial.number)
            model = torch.nn.Linear(4, 2)
            opt = torch.optim.SGD(model.parameters(), lr=trial.suggest_float("lr", 0.01, 0.1))
            data = TensorDataset(torch.randn(32, 4), torch.arange(32) % 2)
            for step, (x, y) in enumerate(DataLoader(data, batch_size=4)):
                if trial.number == 0 and step == 2:
                    crashcap._batch.flatten = broken
                if trial.number == 0 and step == 5:
                    raise RuntimeError("trial 0's own failure")
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(); loss.backward(); opt.step()
            return float(loss)

        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        crashcap.optuna.optimize(study, objective, n_trials=2, directory="trials", isolate=False)
        for t in study.trials:
            print("TRIAL", t.number, t.state.name, repr(t.user_attrs.get("crashcap_bundle")),
                  t.user_attrs.get("crashcap_step"))
    """))
    r = subprocess.run([PYTHON, "study.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-5000:]
    assert "stopped recording this training after an error of crashcap's own (KeyError" in r.stderr, r.stderr
    assert "TRIAL 0 FAIL '' None" in r.stdout and "TRIAL 1 COMPLETE None None" in r.stdout, r.stdout
    assert os.listdir(tmp_path / "trials" / "trial-0000") == ["runs.jsonl"], os.listdir(tmp_path / "trials" / "trial-0000")
    assert os.listdir(tmp_path / "trials" / "trial-0001") == ["runs.jsonl"], os.listdir(tmp_path / "trials" / "trial-0001")
    # Trial 1 was recorded (the stop was trial 0's only): its clean recording was removed with it.
    assert "crashcap: recording training 1 of this process" in r.stderr, r.stderr
