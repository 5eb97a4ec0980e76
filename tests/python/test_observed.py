"""`crashcap run --record`: unmodified PyTorch trainings (tests/python/observed/, none of which
imports crashcap) recorded from PyTorch's own seams, replayed bit for bit and triaged; what the
observer cannot infer is one warning, and the training computes what it computes without it."""

import os
import re
import subprocess
import textwrap

from conftest import (PYTHON, SAMPLE, crashcap, crashcap_json, only_bundle, replay_and_triage, run_bare, run_recorded,
                      verdicts)


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


def test_a_sequence_first_batch_is_cut_by_its_sample_dimension_and_triage_names_the_bad_label(tmp_path):
    # Tokens (time, batch) from pad_sequence, labels (batch,): sample 77's label is out of range.
    r, runs = run_recorded(tmp_path, "sequence_first.py", "--bad-label-index", 77)
    assert r.returncode != 0 and "Target 7 is out of bounds" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay, triage = replay_and_triage(bundle)
    assert triage["culprit"]["dataset_indices"] == [77], triage["culprit"]
    (row,) = triage["culprit"]["rows"]
    (evidence,) = [h["evidence"] for h in triage["hypotheses"] if h["id"] == "invalid-data"]
    assert f"row {row} of steps/{replay['step']}/batch/1 is 7, outside 0..2" in " ".join(evidence), evidence
    # A pack of that row alone keeps every token of its sequence, and still fails so.
    step = replay["step"]
    tokens = f"steps/{step}/batch/0"
    whole = crashcap_json("show", bundle, tokens)
    packed = crashcap_json("pack", bundle, "-o", tmp_path / "row.ccap", "--rows", row)
    assert packed["rows"] == [row] and packed["samples"] == 1, packed
    assert crashcap_json("show", tmp_path / "row.ccap", tokens)["shape"] == [whole["shape"][0], 1]
    assert crashcap_json("show", tmp_path / "row.ccap", f"steps/{step}/batch/1")["text"] == "[7]"
    again = crashcap_json("replay", tmp_path / "row.ccap")
    assert again["verdict"] in ("reproduced", "reproduced-bitwise") and "out of bounds" in again["error"], again


def test_a_crash_in_the_validation_pass_is_after_the_step_and_a_bias_before_batch_norm_is_no_departure(tmp_path):
    # The validation pass runs after step 1's optimizer.step(): the crash is between steps, which
    # the replay of the steps does not run, and triage says so instead of suspecting a race in it.
    r, runs = run_recorded(tmp_path, "validation_pass.py", "--bad-val-index", 50)
    assert r.returncode != 0 and "non-finite validation logits after step 1" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    crash = crashcap_json("inspect", bundle)["crash"]
    assert (crash["step"], crash["phase"]) == (1, "between-steps"), crash
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "not-reproduced" and not replay["error"], replay
    assert any("came after step 1's update, between steps" in n for n in replay["notes"]), replay["notes"]
    triage = crashcap_json("triage", bundle)
    hypotheses = {h["id"]: h for h in triage["hypotheses"]}
    assert hypotheses["nondeterminism"]["verdict"] == "inconclusive", hypotheses["nondeterminism"]
    assert "which a replay does not run" in " ".join(hypotheses["nondeterminism"]["evidence"])
    assert hypotheses["invalid-data"]["verdict"] == "inconclusive", hypotheses["invalid-data"]
    assert "between steps" in hypotheses["invalid-data"]["evidence"][0], hypotheses["invalid-data"]
    text = crashcap("triage", bundle).stdout
    assert "crash exception after step 1" in text, text
    # The first Linear's bias gradient is 0 in exact arithmetic: float32's rounding noise against
    # float64's is not an op departing from float64.
    ops = crashcap_json("bisect", "ops", bundle)
    assert ops["ops_compared"] > 20 and not ops["stopped_because"], ops
    assert ops["first_departing_op"] is None, ops["first_departing_op"]


def test_a_sequence_first_batch_with_as_many_time_steps_as_samples_keeps_its_earlier_sample_dimension(tmp_path):
    # In dataset order, sample 77's batch (step 4) has tokens [16, 16]: shapes alone cannot tell.
    r, runs = run_recorded(tmp_path, "sequence_first.py", "--bad-label-index", 77, "--square")
    assert r.returncode != 0 and "Target 7 is out of bounds" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    assert crashcap_json("show", bundle, "steps/4/batch/0")["shape"] == [16, 16]
    _, triage = replay_and_triage(bundle)
    assert (triage["culprit"]["rows"], triage["culprit"]["dataset_indices"]) == ([77 % 16], [77]), triage["culprit"]


def test_a_mask_s_deliberate_infinity_is_no_finding_an_in_place_op_shows_its_first_inputs_and_a_row_masked_whole_is_an_edge_case(
        tmp_path):
    # The model masks padding with masked_fill(mask, -inf) before a softmax in every step. A label
    # cross_entropy refuses is an error: its culprit op is the one it came out of, not the mask.
    r, runs = run_recorded(tmp_path, "masked_attention.py", "--bad-label-index", 37)
    assert r.returncode != 0 and "evidence  IndexError: Target 99 is out of bounds." in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    assert replay["raising_op"]["name"] == "aten::cross_entropy_loss", replay["raising_op"]
    assert replay["raising_op"]["inputs"][1]["max"] == 99, replay["raising_op"]  # the labels it was given
    assert replay["first_nonfinite_op"] is None, replay["first_nonfinite_op"]
    triage = crashcap_json("triage", bundle)
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    assert triage["culprit"]["op"] == "aten::cross_entropy_loss" and triage["culprit"]["dataset_indices"] == [37]
    # A sample of zero features: the in-place log_ makes -inf of a legitimate 0. The op is named
    # (not the mask, not a later op), with its input as it was before log_ overwrote it.
    (tmp_path / "zero").mkdir()
    r, runs = run_recorded(tmp_path / "zero", "masked_attention.py", "--zero-index", 37)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    op = replay["first_nonfinite_op"]
    assert op["name"] == "aten::log_", op
    assert op["inputs"][0]["inf_count"] == 0 and op["inputs"][0]["min"] == 0, op
    assert op["outputs"][0]["inf_count"] == 1, op
    triage = crashcap_json("triage", bundle)
    hypotheses = {h["id"]: h for h in triage["hypotheses"]}
    assert hypotheses["loss-numerics"]["verdict"] == "confirmed", hypotheses["loss-numerics"]
    assert any("reaches 0" in e for e in hypotheses["loss-numerics"]["evidence"]), hypotheses["loss-numerics"]
    assert triage["culprit"]["op"] == "aten::log_" and triage["culprit"]["dataset_indices"] == [37], triage["culprit"]
    # A sample of length 0: the mask covers its whole row, and the softmax of nothing but the
    # mask's -inf is NaN. The infinities are the program's: the softmax's arithmetic meets an edge
    # case of the step's own values, and the 0 among the lengths is named.
    (tmp_path / "empty").mkdir()
    r, runs = run_recorded(tmp_path / "empty", "masked_attention.py", "--empty-index", 37)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    op = replay["first_nonfinite_op"]
    assert op["name"] == "aten::_softmax" and op["after_given_infinity"], op
    assert op["inputs"][0]["nan_count"] == 0 and op["inputs"][0]["inf_count"] > 0, op
    triage = crashcap_json("triage", bundle)
    hypotheses = {h["id"]: h for h in triage["hypotheses"]}
    assert hypotheses["loss-numerics"]["verdict"] == "confirmed", hypotheses["loss-numerics"]
    assert any("makes NaN of infinities the step wrote on purpose" in e for e in hypotheses["loss-numerics"]["evidence"])
    assert hypotheses["invalid-data"]["verdict"] == "inconclusive", hypotheses["invalid-data"]
    (row,) = triage["culprit"]["rows"]
    assert any(f"row {row} of steps/{replay['step']}/batch/length is 0, while the batch's other rows are 3.." in e
               for e in hypotheses["invalid-data"]["evidence"]), hypotheses["invalid-data"]
    assert triage["culprit"]["op"] == "aten::_softmax" and triage["culprit"]["dataset_indices"] == [37], triage["culprit"]


def test_two_optimizers_are_one_warning_kept_together_and_the_training_computes_the_same(tmp_path):
    bare = run_bare(tmp_path, "two_optimizers.py")
    r, runs = run_recorded(tmp_path, "two_optimizers.py")
    assert bare.returncode == 0 and r.returncode == 0, r.stderr
    assert r.stdout == bare.stdout  # the losses, digit for digit
    assert r.stderr.count("2 optimizers (Adam, SGD)") == 1, r.stderr
    # With a NaN point it crashes, and both optimizers' states replay it bit for bit.
    (tmp_path / "nan").mkdir()
    r, runs = run_recorded(tmp_path / "nan", "two_optimizers.py", "--nan-index", 17)
    bundle = only_bundle(runs)
    assert crashcap_json("replay", bundle)["verdict"] == "reproduced-bitwise"
    story = crashcap_json("inspect", bundle)
    assert any("2 optimizers" in w for w in story["warnings"]), story["warnings"]
    assert story["optimizer"]["kind"] == "adam+sgd", story["optimizer"]


def test_a_training_without_a_dataloader_is_one_warning_and_keeps_its_crash(tmp_path):
    bare = run_bare(tmp_path, "no_loader.py")
    r, runs = run_recorded(tmp_path, "no_loader.py")
    assert r.returncode == 0 and r.stdout == bare.stdout, r.stderr
    assert r.stderr.count("no DataLoader batch came before it") == 1, r.stderr
    (tmp_path / "crash").mkdir()
    r, runs = run_recorded(tmp_path / "crash", "no_loader.py", "--fail-step", 12)
    bundle = only_bundle(runs)
    story = crashcap_json("inspect", bundle)
    assert story["crash"]["source"] == "recorder" and "lost track of the data at step 12" in story["crash"]["error"]
    assert any("no_loader.py" in frame for frame in story["crash"]["stack"]), story["crash"]["stack"]
    replay = crashcap("replay", bundle)
    assert replay.returncode == 2 and "holds no steps" in replay.stderr, replay.stderr


def test_gradient_accumulation_is_one_warning_and_changes_nothing(tmp_path):
    bare = run_bare(tmp_path, "mlp_loader.py", "--accumulate", 2, "--epochs", 1)
    r, runs = run_recorded(tmp_path, "mlp_loader.py", "--accumulate", 2, "--epochs", 1)
    assert r.returncode == 0 and r.stdout == bare.stdout, r.stderr
    assert r.stderr.count("gradient accumulation?") == 1, r.stderr
    # A keyframe holds no gradients: one due between two updates waits for the step after the next
    # update, so a replay never starts without the gradients accumulated before it.
    (tmp_path / "nan").mkdir()
    r, runs = run_recorded(tmp_path / "nan", "mlp_loader.py", "--accumulate", 2, "--epochs", 2, "--nan-index", 100,
                           "--fault-epoch", 1, options=("--keyframe-every", 3))
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    keyframes = crashcap_json("inspect", bundle)["keyframes"]
    assert len(keyframes) > 1 and all(k % 2 == 0 for k in keyframes), keyframes  # updates end the odd steps
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay


def test_a_clean_run_leaves_no_recording_unless_kept_and_a_kept_one_seals_whole(tmp_path):
    # Without --keep-recording the observer closes the recording without syncing it (it is
    # removed); with it, the recording is closed as any other and stays for `crashcap seal`.
    r, runs = run_recorded(tmp_path, "mlp_loader.py", "--epochs", 1)
    assert r.returncode == 0, r.stderr
    assert not [n for n in os.listdir(runs) if n.startswith(("recording-", "crash-"))], os.listdir(runs)
    (tmp_path / "kept").mkdir()
    r, kept = run_recorded(tmp_path / "kept", "mlp_loader.py", "--epochs", 1, options=("--keep-recording",))
    assert r.returncode == 0, r.stderr
    assert len([n for n in os.listdir(kept) if n.startswith("recording-")]) == 1, os.listdir(kept)
    sealed = crashcap_json("seal", kept)["sealed"]
    assert len(sealed) == 1 and sealed[0]["state"] == "finished", sealed
    story = crashcap_json("inspect", sealed[0]["bundle"])
    assert story["crash"] is None and story["steps"]["completed"] == 12, story["steps"]


def test_a_training_that_records_itself_is_left_to_its_own_recorder(tmp_path):
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, SAMPLE, "--record", tmp_path / "own",
                 "--steps", 22, "--fault", "nan-sample", "--fault-step", 19, "--quiet", cwd=tmp_path)
    assert r.returncode != 0
    assert "recording this training" not in r.stderr, r.stderr
    story = crashcap_json("inspect", only_bundle(tmp_path / "own"))
    assert story["crash"]["step"] == 19
    env = crashcap_json("inspect", only_bundle(tmp_path / "own"))["env"]
    assert env["facts"]["python.capture"] == "api"
    # The observer recorded nothing beside it: runs/ holds the run log and the supervisor's bundle,
    # which has no steps of its own.
    assert not [n for n in os.listdir(tmp_path / "runs") if n.startswith("recording-")]
    assert crashcap_json("inspect", only_bundle(tmp_path / "runs"))["steps"]["count"] == 0


def test_the_bootstrap_runs_the_sitecustomize_it_hides_and_a_program_without_torch_runs_untouched(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n")
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        print(os.environ.get('USER_SITECUSTOMIZE'), 'torch' in sys.modules, 'crashcap' in sys.modules)
    """))
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([os.path.join(os.environ["CRASHCAP_BIN"], "crashcap"), "run", "--record", "--dir",
                        str(tmp_path / "runs"), "--", PYTHON, str(script)], cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ran", "False", "False"], r.stdout


def test_a_recorded_batch_is_freed_when_the_training_drops_it_not_when_the_garbage_collector_runs(tmp_path):
    # Batches from worker processes live in shared memory: a batch the recorder kept alive in a
    # reference cycle would pile up (every step's, until a collection) beside the training's own.
    script = tmp_path / "held.py"
    script.write_text(textwrap.dedent("""
        import gc, weakref, torch
        from torch.utils.data import DataLoader, TensorDataset
        gc.disable()
        data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
        loader = DataLoader(data, batch_size=8, num_workers=2)
        model = torch.nn.Linear(8, 3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        kept = []
        for x, y in loader:
            kept += [weakref.ref(x), weakref.ref(y)]
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        del x, y
        print("alive", sum(r() is not None for r in kept), "of", len(kept))
    """))
    bare = subprocess.run([PYTHON, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert bare.stdout.strip() == "alive 0 of 16", bare
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, script, cwd=tmp_path)
    assert r.returncode == 0 and "recording this training from DataLoader #0" in r.stderr, r.stderr
    assert r.stdout.strip() == "alive 0 of 16", r.stdout


def test_record_options_without_record_are_refused(tmp_path):
    r = crashcap("run", "--nonfinite", "record", "--dir", tmp_path, "--", PYTHON, "-c", "pass")
    assert r.returncode == 2 and "add --record" in r.stderr, r.stderr
