"""`crashcap run --record` on an unmodified training whose batch gives the loss nothing to average
(tests/python/observed/unlabelled_batch.py): every target of the batch is ignore_index, or the mask
that selects the labelled rows selects none. The NaN is 0/0, the right value of a mean of nothing:
triage says so of the batch as a whole and names all its samples, instead of refuting the data
because no single sample is needed."""

from conftest import crashcap, crashcap_json, only_bundle, run_recorded, triage_json_and_text, verdicts


def evidence_of(triage, hypothesis):
    (evidence,) = [h["evidence"] for h in triage["hypotheses"] if h["id"] == hypothesis]
    return " ".join(evidence)


def test_a_batch_whose_targets_are_all_ignore_index_is_named_whole_as_a_mean_of_nothing(tmp_path):
    r, runs = run_recorded(tmp_path, "unlabelled_batch.py", "--unlabelled-from", 128)
    assert r.returncode != 0 and "non-finite loss" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    assert replay["step"] == 8, replay  # samples 128..143, the ninth batch of 16 in stored order
    op = replay["first_nonfinite_op"]
    assert op["name"] == "aten::nll_loss_forward", op
    assert op["empty_mean"] == {"empty": False, "targets": 16, "ignored": 16, "ignore_index": -1, "of": None}, op
    triage, text = triage_json_and_text(bundle)
    v = verdicts(triage)
    assert v["loss-numerics"] == "confirmed", triage["hypotheses"]
    assert v["invalid-data"] == "inconclusive", triage["hypotheses"]  # not refuted: the batch as a whole
    assert "makes NaN as a mean of nothing: none of its 16 targets counts (all are ignore_index -1)" in \
        evidence_of(triage, "loss-numerics")
    assert "step 8's batch as a whole gives aten::nll_loss_forward nothing to average" in \
        evidence_of(triage, "invalid-data")
    # The rows left after the sample bisection's cut are unlabelled too: their replay says so.
    assert "the rows left giving it nothing to count either: no one sample is to blame" in \
        evidence_of(triage, "invalid-data")
    assert "no particular sample is needed" not in evidence_of(triage, "invalid-data")
    culprit = triage["culprit"]
    assert culprit["rows"] is None and culprit["empty_mean"]["ignored"] == 16, culprit
    assert culprit["dataset_indices"] == list(range(128, 144)), culprit
    assert culprit["op"] == "aten::nll_loss_forward", culprit
    assert "culprit: step 8, the whole batch, which gives the loss no target to count (all 16 are ignore_index -1) " \
        "(dataset indices [128,129," in text, text
    assert "a mean of nothing: none of its 16 targets counts" in crashcap("replay", bundle).stdout


def test_a_mask_that_selects_no_row_of_the_batch_is_named_as_a_mean_of_an_empty_tensor(tmp_path):
    r, runs = run_recorded(tmp_path, "unlabelled_batch.py", "--unlabelled-from", 64, "--loss", "masked")
    assert r.returncode != 0 and "non-finite loss" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    op = crashcap_json("replay", bundle)["first_nonfinite_op"]
    assert op["empty_mean"]["empty"] is True and op["empty_mean"]["of"] == "aten::mse_loss", op
    triage = crashcap_json("triage", bundle)
    assert triage["step"] == 4, triage
    assert verdicts(triage)["loss-numerics"] == "confirmed", triage["hypotheses"]
    assert verdicts(triage)["invalid-data"] == "inconclusive", triage["hypotheses"]
    # torch's mse_loss divides the sum of nothing by 0 itself: the NaN comes from inside it.
    assert "makes NaN as a mean of nothing: it is the mean aten::mse_loss takes of an empty tensor" in \
        evidence_of(triage, "loss-numerics")
    assert "step 4's batch as a whole gives" in evidence_of(triage, "invalid-data")
    assert "the rows left giving it nothing to count either" in evidence_of(triage, "invalid-data")
    culprit = triage["culprit"]
    assert culprit["empty_mean"]["empty"] is True and culprit["empty_mean"]["of"] == "aten::mse_loss", culprit
    assert culprit["dataset_indices"] == list(range(64, 80)), culprit
