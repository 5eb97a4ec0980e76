"""Must-show 1 of the Python recorder: every fault of the Python sample (a DataLoader with two
augmenting workers, dropout, a warm-up + cosine schedule, AdamW) is recorded, sealed, replayed
bit for bit from a keyframe in an earlier epoch than the crash, and triaged to its cause."""


import pytest

from conftest import SAMPLE, crashcap_json, only_bundle, run_python

# 512 samples in batches of 32: 16 steps an epoch. A keyframe every 10 steps puts the newest
# keyframe before step 19 at step 10, in epoch 0; step 19 is in epoch 1.
FAULT_STEP, FAULT_ROW = 19, 3

CASES = {
    # fault: (hypothesis triage confirms, the culprit rows it must name, the recorded crash kind,
    # the fault's step). The runaway schedule of lr-blowup takes two steps to overflow the weights.
    "nan-sample": ("invalid-data", [FAULT_ROW], "nonfinite", FAULT_STEP),
    "bad-label": ("invalid-data", [FAULT_ROW], "exception", FAULT_STEP),
    "mask-eps0": ("loss-numerics", None, "nonfinite", FAULT_STEP),
    "lr-blowup": ("optimizer-divergence", None, "nonfinite", 15),
}


@pytest.mark.parametrize("fault", sorted(CASES))
def test_a_python_sample_crash_is_recorded_replayed_bit_for_bit_and_triaged(fault, tmp_path):
    hypothesis, rows, kind, fault_step = CASES[fault]
    r = run_python(SAMPLE, "--record", "runs", "--steps", 40, "--fault", fault, "--fault-step", fault_step,
                   "--fault-row", FAULT_ROW, "--workers", 2, "--keyframe-every", 10, "--quiet", cwd=tmp_path)
    assert r.returncode != 0, r.stdout + r.stderr
    bundle = only_bundle(tmp_path / "runs")
    story = crashcap_json("inspect", bundle)
    assert story["crash"]["kind"] == kind
    assert story["program"]["format"] == "python"
    assert any(s["path"].endswith("train.py") for s in story["program"]["sources"])

    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    assert replay["keyframe"] < 16 <= replay["step"], "the keyframe must lie in an earlier epoch than the crash"
    assert all(s["bitwise"] for s in replay["steps"] if s["recorded_loss"] is not None)

    # Packed for a bug report: the replay writes the state the crash step starts from (optimizer,
    # scheduler and module modes from Python, as the recorder keeps them) as the one keyframe, and
    # the attachment replays the same.
    packed = tmp_path / "packed.ccap"
    pack = crashcap_json("pack", bundle, "-o", packed)
    assert pack["replay"]["verdict"] == "reproduced-bitwise" and pack["replay"]["keyframe_materialised"], pack
    assert pack["keyframe_step"] == replay["step"] and pack["first_step"] == pack["last_step"] == replay["step"], pack
    assert pack["packed_bytes"] < pack["original_bytes"]
    kept = crashcap_json("inspect", packed)
    assert kept["keyframes"] == [replay["step"]], kept["keyframes"]
    again = crashcap_json("replay", packed)
    assert (again["verdict"], again["error"]) == (replay["verdict"], replay["error"])
    assert again["keyframe"] == replay["step"]
    # The same op, phase, position and values; its autograd sequence number counts the process's
    # autograd nodes so far, fewer when replay starts at the crash step.
    def op(r):
        return None if r["first_nonfinite_op"] is None else {k: v for k, v in r["first_nonfinite_op"].items() if k != "seq"}
    assert op(again) == op(replay)
    if rows is not None:
        # Only the culprit rows of the crash step, named by dataset index, and it still fails so.
        culprits = crashcap_json("pack", bundle, "-o", tmp_path / "culprit.ccap", "--rows", "culprit")
        assert culprits["rows"] == rows and culprits["samples"] == len(rows), culprits
        assert len(culprits["dataset_indices"][0]["indices"]) == len(rows), culprits
        cut = crashcap_json("replay", tmp_path / "culprit.ccap")
        assert cut["verdict"] in ("reproduced", "reproduced-bitwise"), cut
        assert (cut["error"] is None) == (replay["error"] is None)

    triage = crashcap_json("triage", bundle)
    verdicts = {h["id"]: h["verdict"] for h in triage["hypotheses"]}
    assert verdicts[hypothesis] == "confirmed", triage["hypotheses"]
    culprit = triage["culprit"]
    if rows is not None:
        assert culprit["rows"] == rows
        assert culprit["dataset_indices"] and len(culprit["dataset_indices"]) == len(rows)
    if hypothesis == "loss-numerics":
        assert culprit["op"], "loss-numerics names the op"
