"""`crashcap run --record` over unmodified trainings whose batches and models take more than a glance:
a sequence-first batch is cut by its sample dimension (also when its time steps are as many as its
samples), a model's deliberate infinities (a mask) are no finding while its in-place ops and a row
masked whole are, a crash in a validation pass falls between steps, and an error raised about a NaN
names the op that made it (tests/python/observed/)."""

import os

from conftest import (OBSERVED, crashcap_json, only_bundle, replay_and_triage, run_recorded, triage_json_and_text,
                      verdicts)


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
    # The validation loader's batch it was on: its second batch of 48, which holds sample 50.
    assert (f"the last batch the program took before the crash came from DataLoader #1 (not the training's #0), of "
            f"dataset indices {list(range(48, 96))}, and that loader's iteration" in crash["error"]), crash["error"]
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "not-reproduced" and not replay["error"], replay
    assert any("came after step 1's update, between steps" in n for n in replay["notes"]), replay["notes"]
    # The note names the program's line that raised, from the crash's traceback.
    script = os.path.join(OBSERVED, "validation_pass.py")
    line = next(i for i, text in enumerate(open(script).read().splitlines(), 1) if "raise ValueError(f\"non-finite" in text)
    assert any(f'Its traceback says where: File "{script}", line {line}, in ' in n for n in replay["notes"]), replay["notes"]
    triage, text = triage_json_and_text(bundle)
    hypotheses = {h["id"]: h for h in triage["hypotheses"]}
    assert hypotheses["nondeterminism"]["verdict"] == "inconclusive", hypotheses["nondeterminism"]
    assert "which a replay does not run" in " ".join(hypotheses["nondeterminism"]["evidence"])
    # The validation batch the program held, kept in the bundle: its row 2 (sample 50) holds the NaN
    # the program's check is about. No replay runs the validation, so the rows are judged as kept.
    assert crash["other_batch"]["loader"] == 1 and "crash/batch/index" in crash["other_batch"]["tensors"], crash
    assert crashcap_json("show", bundle, "crash/batch/index")["shape"] == [48]
    assert hypotheses["invalid-data"]["verdict"] == "confirmed", hypotheses["invalid-data"]
    evidence = hypotheses["invalid-data"]["evidence"]
    assert "between steps" in evidence[0], evidence
    assert any("in the batch the program took last from DataLoader #1, not a step's (kept at the crash), row 2 of "
               "crash/batch/0 holds 1 NaN and 0 Inf values; dataset index 50" in e for e in evidence), evidence
    culprit = triage["culprit"]
    assert (culprit["loader"], culprit["step"], culprit["rows"], culprit["dataset_indices"]) == (1, 1, [2], [50]), culprit
    assert "crash exception after step 1" in text, text
    assert "culprit: rows [2] of the batch DataLoader #1 gave after step 1" in text and "dataset indices [50]" in text, text
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


def test_an_error_raised_about_a_nan_names_the_op_that_made_it_and_the_sample(tmp_path):
    # torch.multinomial raises on the NaN probabilities a corrupt observation makes: the error
    # comes out of the multinomial, the NaN out of the first linear layer, the sample is 277.
    r, runs = run_recorded(tmp_path, "sampled_policy.py", "--nan-index", 277)
    assert r.returncode != 0 and "probability tensor contains" in r.stderr, r.stderr
    replay, triage = replay_and_triage(only_bundle(runs))
    assert replay["raising_op"]["name"] == "aten::multinomial", replay["raising_op"]
    assert replay["raising_op"]["inputs"][0]["nan_count"] > 0, replay["raising_op"]
    culprit = triage["culprit"]
    assert culprit["dataset_indices"] == [277] and culprit["op"] == "aten::addmm", culprit
