"""`crashcap run --record` on unmodified trainings whose batches are ragged or packed
(tests/python/observed/): samples concatenated and cut by their rows' offsets, a batch that nothing
tells how to cut, a list of each sample's own target tensors, a sequence of length 0 packed among
others. The CTC trainings, whose transcripts
are cut by their lengths, are in test_observed_ctc.py."""

import re

import pytest

from conftest import crashcap, crashcap_json, only_bundle, replay_and_triage, run_recorded, verdicts


def test_a_ragged_batch_is_cut_by_its_offsets_and_a_padded_one_by_row(tmp_path):
    # The tokens of a batch's texts concatenated, read through offsets: a replay of some rows keeps
    # those rows' spans of the tokens and makes their offsets anew, so sample bisection tests each
    # text, and the token past the vocabulary is named in the culprit row's span.
    r, runs = run_recorded(tmp_path, "token_bags.py", "--bad-index", 150)
    assert r.returncode != 0 and "out of bounds" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    step = replay["step"]
    every = crashcap_json("replay", bundle, "--rows", ",".join(str(r) for r in range(12)))  # the batch as recorded
    assert every["verdict"] == "reproduced-bitwise", every
    triage = crashcap_json("triage", bundle)
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    assert triage["culprit"]["dataset_indices"] == [150], triage["culprit"]
    (row,) = triage["culprit"]["rows"]
    (evidence,) = [h["evidence"] for h in triage["hypotheses"] if h["id"] == "invalid-data"]
    assert any(e.startswith("element ") and f"of steps/{step}/batch/1 is 53, outside 0..49" in e
               and f"the op that raised; by the offsets in steps/{step}/batch/2 it is in row {row}'s span (dataset "
                   f"index 150)" in e for e in evidence), evidence
    # The row alone, replayed and packed: its own tokens, at offset 0.
    offsets = [int(x) for x in re.findall(r"\d+", crashcap_json("show", bundle, f"steps/{step}/batch/2")["text"])]
    tokens = crashcap_json("show", bundle, f"steps/{step}/batch/1")["shape"][0]
    length = (offsets + [tokens])[row + 1] - offsets[row]
    alone = crashcap_json("replay", bundle, "--rows", row)
    assert alone["verdict"] in ("reproduced", "reproduced-bitwise") and "out of bounds" in alone["error"], alone
    packed = crashcap_json("pack", bundle, "-o", tmp_path / "row.ccap", "--rows", row)
    assert packed["rows"] == [row] and packed["samples"] == 1, packed
    assert crashcap_json("show", tmp_path / "row.ccap", f"steps/{step}/batch/1")["shape"] == [length]
    assert crashcap_json("show", tmp_path / "row.ccap", f"steps/{step}/batch/2")["text"] == "[0]"
    again = crashcap_json("replay", tmp_path / "row.ccap")
    assert again["verdict"] in ("reproduced", "reproduced-bitwise") and "out of bounds" in again["error"], again
    # Every other row: the step passes.
    others = crashcap_json("replay", bundle, "--rows", ",".join(str(r) for r in range(12) if r != row))
    assert others["verdict"] == "not-reproduced" and not others["error"], others
    # pack --rows culprit finds the same row (its bisection runs in the bundle, which tells the
    # batch ragged by its sizes at other steps).
    culprit = crashcap_json("pack", bundle, "-o", tmp_path / "culprit.ccap", "--rows", "culprit")
    assert culprit["rows"] == [row], culprit
    # Padded to each batch's longest text instead (tokens [12, longest], position ids [1, longest]):
    # the length changes from batch to batch with the rows, and the rows are cut.
    (tmp_path / "padded").mkdir()
    r, runs = run_recorded(tmp_path / "padded", "token_bags.py", "--bad-index", 150, "--padded")
    assert r.returncode != 0 and "index out of range" in r.stderr, r.stderr
    _, triage = replay_and_triage(only_bundle(runs))
    assert triage["culprit"]["dataset_indices"] == [150], triage["culprit"]


def test_a_ragged_batch_without_lengths_or_offsets_is_not_cut_and_its_bad_value_is_named(tmp_path):
    # Each token carries its text's number instead of offsets: no tensor of one value per row says
    # where each text's tokens lie. Replay and pack refuse to cut the batch and say why; triage
    # names the token past the vocabulary, outside the table of the op that raised, without a row.
    r, runs = run_recorded(tmp_path, "token_bags.py", "--bad-index", 150, "--segments")
    assert r.returncode != 0 and "index out of range" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    cut = crashcap("replay", bundle, "--rows", 0)
    assert cut.returncode != 0 and f"step {replay['step']}'s batch cannot be cut to some of its 12 rows: '1' [" in cut.stderr
    assert "no tensor of one length or offset per row tells where each row's samples lie" in cut.stderr, cut.stderr
    packed = crashcap("pack", bundle, "-o", tmp_path / "rows.ccap", "--rows", 0)
    assert packed.returncode != 0 and "holds the samples concatenated" in " ".join(packed.stderr.split()), packed.stderr
    triage = crashcap_json("triage", bundle)
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    assert not triage["culprit"]["rows"] and not triage["culprit"]["dataset_indices"], triage["culprit"]
    value = triage["culprit"]["value"]
    assert value["tensor"] == f"steps/{replay['step']}/batch/1" and value["value"] == 53, value
    assert value["row"] is None and value["spans_by"] is None, value


def test_an_empty_sequence_packed_by_length_is_named_with_its_length_of_zero(tmp_path):
    # Padded features, lengths and labels; sample 277 has no time steps, and packing raises. Its
    # length is 0 where the batch's others are 3..11: an input the step cannot handle, not an
    # invalid value, and the evidence says which length is empty.
    r, runs = run_recorded(tmp_path, "packed_sequences.py", "--empty-index", 277)
    assert r.returncode != 0 and "Length of all samples has to be greater than 0" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    triage = crashcap_json("triage", bundle)
    assert triage["culprit"]["dataset_indices"] == [277], triage["culprit"]
    (row,) = triage["culprit"]["rows"]
    assert verdicts(triage)["invalid-data"] == "inconclusive", triage["hypotheses"]
    (evidence,) = [h["evidence"] for h in triage["hypotheses"] if h["id"] == "invalid-data"]
    text = " ".join(evidence)
    assert re.search(rf"row {row} of steps/{replay['step']}/batch/1 is 0, while the batch's other rows are 3\.\.(9|10|11)",
                     text), evidence
    assert f"row {row} of steps/{replay['step']}/batch/0 is all zeros" in text, evidence


def test_a_packed_batch_is_cut_by_packing_the_rows_kept_anew_and_its_bad_label_is_named(tmp_path):
    # The collate function returns a PackedSequence: its data interleaves the rows' time steps,
    # sorted by length, and its batch_sizes (one per time step) can have as many entries as the
    # batch has rows. A cut packs the kept rows anew, so sample bisection tests each row; the loss's
    # error ("Target 3 is out of bounds.", which names no size) with the loss's classes from the op
    # trace names the value.
    r, runs = run_recorded(tmp_path, "packed_sequences.py", "--packed-batch", "--bad-label", 213)
    assert r.returncode != 0 and "Target 3 is out of bounds." in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay, triage = replay_and_triage(bundle)
    step = replay["step"]
    every = crashcap_json("replay", bundle, "--rows", ",".join(str(r) for r in range(10)))  # packed anew, as recorded
    assert every["verdict"] == "reproduced-bitwise", every
    assert triage["culprit"]["dataset_indices"] == [213], triage["culprit"]
    (row,) = triage["culprit"]["rows"]
    (evidence,) = [h["evidence"] for h in triage["hypotheses"] if h["id"] == "invalid-data"]
    assert (f"row {row} of steps/{step}/batch/1 is 3, outside 0..2: the error says target 3 is out of bounds, "
            f"and the loss (aten::cross_entropy_loss) sees 3 classes (logits [10,3])") in evidence, evidence
    labels = [int(x) for x in re.findall(r"-?\d+", crashcap_json("show", bundle, f"steps/{step}/batch/1")["text"])]
    assert labels[row] == 3 and labels.count(3) == 1, labels
    # The row alone fails as recorded; the rest run (the GRU takes every repacked batch).
    alone = crashcap_json("replay", bundle, "--rows", row)
    assert "Target 3 is out of bounds." in alone["error"], alone
    rest = crashcap_json("replay", bundle, "--rows", ",".join(str(r) for r in range(10) if r != row))
    assert rest["verdict"] == "not-reproduced" and not rest.get("error"), rest


def test_a_nan_in_a_packed_batch_is_found_in_the_culprit_rows_time_steps(tmp_path):
    # The PackedSequence's data has no row dimension: triage gathers each row's time steps from it
    # by batch_sizes and sorted_indices, and names the NaN in the culprit row.
    r, runs = run_recorded(tmp_path, "packed_sequences.py", "--packed-batch", "--nan-index", 131)
    assert r.returncode != 0 and "non-finite loss" in r.stderr, r.stderr
    replay, triage = replay_and_triage(only_bundle(runs))
    assert triage["culprit"]["dataset_indices"] == [131], triage["culprit"]
    (row,) = triage["culprit"]["rows"]
    (evidence,) = [h["evidence"] for h in triage["hypotheses"] if h["id"] == "invalid-data"]
    assert f"row {row} of steps/{replay['step']}/batch/0/data holds 1 NaN and 0 Inf values" in evidence, evidence


@pytest.mark.parametrize("collate", ["lists", "tuples", "sorted"])
def test_a_list_of_each_samples_own_tensors_is_cut_by_its_items_and_the_nan_box_is_named(tmp_path, collate):
    # Detection targets: a list of one dict of tensors per image beside the images stacked, or, as
    # torchvision's references collate, a tuple of the images (each its own tensor: no tensor of
    # the batch has rows) and a tuple of the targets. Those tensors hold no row, and their sizes
    # change from image to image; a cut keeps the kept rows' items, renamed to their places among
    # them, so sample bisection tests each image with its own targets and triage finds the NaN in
    # the culprit image's boxes. The rows are matched to the samples by their own tensors too: a
    # tuple collate that puts the images with most objects first, where no tensor of the batch
    # holds the rows, still names the culprit's sample.
    r, runs = run_recorded(tmp_path, "detection_targets.py", "--nan-box", 58,
                           *({"tuples": ["--tuples"], "sorted": ["--tuples", "--sorted"]}.get(collate, [])))
    assert r.returncode != 0 and "non-finite loss nan" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay, triage = replay_and_triage(bundle)
    step = replay["step"]
    assert triage["culprit"]["dataset_indices"] == [58], triage["culprit"]
    (row,) = triage["culprit"]["rows"]
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    (evidence,) = [h["evidence"] for h in triage["hypotheses"] if h["id"] == "invalid-data"]
    assert f"row {row} of steps/{step}/batch/1/{row}/boxes holds 1 NaN and 0 Inf values" in evidence, evidence
    matched = ("matched to the rows after the collate function reordered the samples the sampler drew"
               if collate == "sorted" else
               "the rows in the sampler's order, checked against the program's collate function")
    assert f"dataset index 58 (the batch's index tensor, {matched})" in " ".join(evidence), evidence
    # The culprit image alone fails as recorded; the others, each with its own targets, do not.
    alone = crashcap_json("replay", bundle, "--rows", row)
    assert "non-finite loss nan" in alone["error"], alone
    rest = crashcap_json("replay", bundle, "--rows", ",".join(str(k) for k in range(8) if k != row))
    assert rest["verdict"] == "not-reproduced" and not rest.get("error"), rest
    # A pack of that row holds its image and its targets as the batch's only item, and replays.
    packed = tmp_path / "row.ccap"
    crashcap("pack", bundle, "-o", packed, "--rows", row, check=True)
    names = {t["name"] for t in crashcap_json("ls", packed)["tensors"]}
    image = f"steps/{step}/batch/0" if collate == "lists" else f"steps/{step}/batch/0/0"
    assert {image, f"steps/{step}/batch/1/0/boxes", f"steps/{step}/batch/1/0/labels"} <= names, names
    assert not any(n.startswith(f"steps/{step}/batch/1/1/") for n in names), names
    again = crashcap_json("replay", packed)
    assert again["verdict"] in ("reproduced", "reproduced-bitwise") and "non-finite loss nan" in again["error"], again
    boxes = crashcap_json("show", packed, f"steps/{step}/batch/1/0/boxes")
    assert "nan" in boxes["text"].lower(), boxes
