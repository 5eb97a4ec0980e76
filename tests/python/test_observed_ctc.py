"""`crashcap run --record` on unmodified CTC trainings (tests/python/observed/ctc_transcripts.py):
transcripts concatenated or padded beside their lengths, as tensors or as Python lists, cut by those
lengths when rows are replayed or packed; a transcript no alignment exists for, named as invalid data
of its row rather than as a loss that cannot handle it."""

import re

import pytest

from conftest import crashcap_json, only_bundle, replay_and_triage, run_recorded, verdicts


def test_transcripts_concatenated_beside_their_lengths_are_cut_by_them_and_the_long_one_is_named(tmp_path):
    # The CTC way: every transcript of the batch in one tensor, and their lengths. Sample 211's
    # transcript is longer than its frames and its loss is inf. The lengths tell each row's span,
    # so sample bisection tests each utterance and names that one; the CTC loss's own arguments
    # show that no alignment of it exists: invalid data, not the loss's arithmetic.
    r, runs = run_recorded(tmp_path, "ctc_transcripts.py", "--long-transcript", 211)
    assert r.returncode != 0 and "non-finite CTC loss inf" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise"
    assert replay["first_nonfinite_op"]["name"] == "aten::_ctc_loss", replay["first_nonfinite_op"]
    (unalignable,) = replay["first_nonfinite_op"]["unalignable"]
    triage = crashcap_json("triage", bundle)
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    assert verdicts(triage)["loss-numerics"] == "refuted", triage["hypotheses"]
    assert triage["culprit"]["dataset_indices"] == [211], triage["culprit"]
    assert triage["culprit"]["op"] == "aten::_ctc_loss", triage["culprit"]
    assert triage["culprit"]["rows"] == [unalignable["element"]], (triage["culprit"], unalignable)
    (evidence,) = [h["evidence"] for h in triage["hypotheses"] if h["id"] == "invalid-data"]
    frames = 20 + 211 % 10
    assert f"row {unalignable['element']}: its CTC target of {frames + 4} labels needs" in " ".join(evidence), evidence
    assert (unalignable["target_length"], unalignable["input_length"]) == (frames + 4, frames), unalignable
    step, (row,) = triage["culprit"]["step"], triage["culprit"]["rows"]
    # Packed alone: the row's frames, its frame count, its own transcript and its length.
    lengths = [int(x) for x in re.findall(r"\d+", crashcap_json("show", bundle, f"steps/{step}/batch/3")["text"])]
    frames = [int(x) for x in re.findall(r"\d+", crashcap_json("show", bundle, f"steps/{step}/batch/1")["text"])]
    assert lengths[row] > frames[row], (lengths, frames, row)
    packed = crashcap_json("pack", bundle, "-o", tmp_path / "row.ccap", "--rows", row)
    assert packed["rows"] == [row], packed
    assert crashcap_json("show", tmp_path / "row.ccap", f"steps/{step}/batch/2")["shape"] == [lengths[row]]
    assert crashcap_json("show", tmp_path / "row.ccap", f"steps/{step}/batch/3")["text"] == f"[{lengths[row]}]"
    again = crashcap_json("replay", tmp_path / "row.ccap")
    assert again["verdict"] in ("reproduced", "reproduced-bitwise") and "non-finite CTC loss" in again["error"], again


def test_a_transcript_whose_repeats_need_more_frames_than_it_has_is_named_though_shorter_than_them(tmp_path):
    # Sample 142's transcript is one symbol 20 times over its 22 frames: a blank must part each
    # repeat, so it needs 39. Its length alone looks fine beside its frame count.
    r, runs = run_recorded(tmp_path, "ctc_transcripts.py", "--repeated-transcript", 142)
    assert r.returncode != 0 and "non-finite CTC loss inf" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay, triage = replay_and_triage(bundle)
    (unalignable,) = replay["first_nonfinite_op"]["unalignable"]
    assert (unalignable["target_length"], unalignable["frames_needed"], unalignable["input_length"]) == (20, 39, 22)
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    assert triage["culprit"]["dataset_indices"] == [142], triage["culprit"]
    assert triage["culprit"]["rows"] == [unalignable["element"]], (triage["culprit"], unalignable)


@pytest.mark.parametrize("transcripts", ["padded", "concatenated"])
def test_lengths_given_as_python_lists_are_cut_with_the_rows(tmp_path, transcripts):
    # The collate gives the frames' and transcripts' lengths as Python lists: a replay of some rows,
    # and a pack of them, keep those rows' lengths beside their frames and transcripts. Transcripts
    # concatenated are cut by the list of their lengths, as by a tensor of them.
    r, runs = run_recorded(tmp_path, "ctc_transcripts.py", "--long-transcript", 211, "--lists", transcripts)
    assert r.returncode != 0 and "non-finite CTC loss inf" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay, triage = replay_and_triage(bundle)
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    assert triage["culprit"]["dataset_indices"] == [211], triage["culprit"]
    (row,) = triage["culprit"]["rows"]
    alone = crashcap_json("replay", bundle, "--rows", row)
    assert "non-finite CTC loss" in alone["error"], alone
    (unalignable,) = alone["first_nonfinite_op"]["unalignable"]
    frames = 20 + 211 % 10  # and its transcript is 4 symbols longer
    assert (unalignable["element"], unalignable["input_length"], unalignable["target_length"]) == (0, frames, frames + 4)
    packed = crashcap_json("pack", bundle, "-o", tmp_path / "row.ccap", "--rows", "culprit")
    assert packed["rows"] == [row], packed
    kept = crashcap_json("show", tmp_path / "row.ccap", f"steps/{replay['step']}/batch/2")["shape"]
    assert kept == ([frames + 4] if transcripts == "concatenated" else [1, frames + 4]), kept
    again = crashcap_json("replay", tmp_path / "row.ccap")
    assert again["verdict"] in ("reproduced", "reproduced-bitwise") and "non-finite CTC loss" in again["error"], again
