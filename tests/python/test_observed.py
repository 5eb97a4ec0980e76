"""`crashcap run --record`: unmodified PyTorch trainings (tests/python/observed/, none of which
imports crashcap) recorded from PyTorch's own seams, replayed bit for bit and triaged (batches and
models that take more than a glance: test_observed_layouts.py; what the observer cannot infer, and
what it leaves alone: test_observed_bootstrap.py)."""

import re

from conftest import crashcap_json, only_bundle, run_recorded, verdicts


def test_a_plain_loop_with_workers_dropout_and_a_schedule_replays_bit_for_bit_from_an_earlier_epoch(tmp_path):
    # 12 steps an epoch; the bad label shows from epoch 2 (steps 24..35), the keyframe before it is
    # step 20, in epoch 1, with the epoch's validation pass (under no_grad) between them.
    r, runs = run_recorded(tmp_path, "mlp_loader.py", "--bad-label-index", 77, "--fault-epoch", 2, "--epochs", 4,
                           options=("--keyframe-every", 20))
    assert r.returncode != 0 and "python-exception" in r.stderr, r.stderr
    assert "recording this training from DataLoader #0" in r.stderr
    bundle = only_bundle(runs)
    story = crashcap_json("inspect", bundle)
    assert "IndexError" in story["crash"]["error"] and story["crash"]["source"] == "recorder"
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    assert replay["keyframe"] == 20 and 24 <= replay["step"] < 36, replay
    triage = crashcap_json("triage", bundle)
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    assert triage["culprit"]["dataset_indices"] == [77], triage["culprit"]
    # The culprit row is the row of the batch that holds dataset index 77.
    row = triage["culprit"]["rows"][0]
    index = crashcap_json("show", bundle, f"steps/{replay['step']}/batch/index", "--full")
    assert [int(v) for v in re.findall(r"-?\d+", index["text"])][row] == 77, index


def test_a_nan_row_stops_the_training_at_its_step_and_triage_names_its_dataset_index(tmp_path):
    r, runs = run_recorded(tmp_path, "mlp_loader.py", "--nan-index", 100, "--epochs", 2)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    assert "epoch 0:" not in r.stdout  # stopped at the step, before the epoch ended
    bundle = only_bundle(runs)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    assert replay["first_nonfinite_op"]["name"] == "aten::addmm"
    triage = crashcap_json("triage", bundle)
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    assert triage["culprit"]["dataset_indices"] == [100]


def test_nonfinite_record_seals_the_first_nan_step_and_lets_the_training_go_on(tmp_path):
    r, runs = run_recorded(tmp_path, "mlp_loader.py", "--nan-index", 100, "--epochs", 2,
                           options=("--nonfinite", "record"))
    assert r.returncode == 0, r.stderr
    assert "epoch 1: loss nan" in r.stdout
    assert "a crash the program recorded and went on from" in r.stderr
    bundle = only_bundle(runs)
    story = crashcap_json("inspect", bundle)
    assert story["crash"]["kind"] == "nonfinite" and "went on" in story["crash"]["error"]
    assert crashcap_json("replay", bundle)["verdict"] == "reproduced-bitwise"


def test_a_dict_batch_with_file_names_replays_and_triage_names_the_corrupt_image(tmp_path):
    r, runs = run_recorded(tmp_path, "conv_dict.py", "--nan-index", 201)
    assert r.returncode != 0, r.stderr
    bundle = only_bundle(runs)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    triage = crashcap_json("triage", bundle)
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    assert triage["culprit"]["dataset_indices"] == [201]
