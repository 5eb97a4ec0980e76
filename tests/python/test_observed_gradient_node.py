"""`crashcap run --record` on an unmodified training whose forward runs clean and whose backward()
makes NaN (tests/python/observed/equal_pair.py): a Euclidean distance taken by hand as the square
root of summed squares, where one pair's positive equals its anchor. sqrt(0) is finite, its
derivative is not. The replay names the autograd node the first NaN came from (SqrtBackward0),
and triage names it, says why that op's gradient is infinite there, and convicts the pair."""

import pytest

from conftest import crashcap, crashcap_json, only_bundle, run_recorded, triage_json_and_text, verdicts


def evidence_of(triage, hypothesis):
    (evidence,) = [h["evidence"] for h in triage["hypotheses"] if h["id"] == hypothesis]
    return " ".join(evidence)


@pytest.mark.parametrize("root,node,said", [("sqrt", "SqrtBackward0", "the derivative of sqrt is infinite at 0"),
                                            ("pow", "PowBackward0",
                                             "the derivative of a fractional power (x ** 0.5) is infinite at 0")])
def test_a_nan_made_in_backward_names_the_autograd_node_and_why_its_gradient_is_infinite(tmp_path, root, node, said):
    r, runs = run_recorded(tmp_path, "equal_pair.py", "--equal", 211, "--root", root)
    assert r.returncode != 0 and "non-finite gradient norm" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    op = replay["first_nonfinite_op"]
    assert op["phase"] == "backward" and op["node"] == node, op
    assert f"(backward, in {node}, the gradient of {root}, op #" in crashcap("replay", bundle).stdout
    triage, text = triage_json_and_text(bundle)
    v = verdicts(triage)
    assert v["loss-numerics"] == "confirmed", triage["hypotheses"]
    assert v["optimizer-divergence"] == "refuted", triage["hypotheses"]
    numerics = evidence_of(triage, "loss-numerics")
    assert f"(backward, step {triage['step']}, in {node}, the gradient of {root}) turns finite inputs into NaN/Inf" \
        in numerics, numerics
    assert said in numerics, numerics
    assert "a division or log of zero" not in numerics, numerics  # the node's own reason instead
    culprit = triage["culprit"]
    assert culprit["dataset_indices"] == [211] and culprit["node"] == node and culprit["phase"] == "backward", culprit
    assert f"(dataset indices [211]), op {culprit['op']} (backward, in {node}, the gradient of {root})" in text, text
