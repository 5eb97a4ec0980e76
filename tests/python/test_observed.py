"""`crashcap run --record`: unmodified PyTorch trainings (tests/python/observed/, none of which
imports crashcap) recorded from PyTorch's own seams, replayed bit for bit and triaged (batches and
models that take more than a glance: test_observed_layouts.py; what the observer cannot infer, and
what it leaves alone: test_observed_bootstrap.py)."""

import re
import textwrap

from conftest import PYTHON, crashcap, crashcap_json, only_bundle, run_recorded, verdicts


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
    # The error names the switch this user has, crashcap run's flag, not the C++ API's enum.
    assert "--nonfinite record lets the training go on" in r.stderr and "NonFinitePolicy" not in r.stderr, r.stderr
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


def record_program(tmp_path, source):
    """crashcap run --record over a program of the test's own; the bundle it sealed."""
    (tmp_path / "train.py").write_text(textwrap.dedent(source))
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode != 0, r.stderr
    return only_bundle(tmp_path / "runs")


def test_a_label_past_a_lookup_table_is_named_by_the_index_the_error_calls_out_of_bounds(tmp_path):
    # class_weights[labels] raises "index 7 is out of bounds for dimension 0 with size 5"; no op in
    # the trace declares that domain, the error does.
    bundle = record_program(tmp_path, """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        x, y = torch.randn(96, 6), torch.arange(96) % 5
        y[41] = 7
        model = torch.nn.Linear(6, 5)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        class_weights = torch.tensor([1.0, 2.0, 1.5, 0.5, 1.0])
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=12, shuffle=True):
            per_row = torch.nn.functional.cross_entropy(model(xb), yb.clamp(max=4), reduction="none")
            loss = (class_weights[yb] * per_row).mean()
            opt.zero_grad(); loss.backward(); opt.step()
    """)
    triage = crashcap_json("triage", bundle)
    invalid = next(h for h in triage["hypotheses"] if h["id"] == "invalid-data")
    assert invalid["verdict"] == "confirmed", invalid
    assert triage["culprit"]["dataset_indices"] == [41], triage["culprit"]
    assert any(e.endswith("is 7, outside 0..4: the error says index 7 is out of bounds for dimension 0 with "
                          "size 5") for e in invalid["evidence"]), invalid


def test_a_hidden_state_carried_between_batches_has_its_rows_tested_in_batches_of_the_whole_size(tmp_path):
    # Truncated backpropagation through time: the GRU's state goes from one batch to the next, so a
    # replay that keeps part of a batch fails on the state's size. Sample 43 (step 5, row 3) holds a NaN.
    # The rows are searched again in batches of all 8 rows, those left out replaced by copies of
    # those kept: row 3 copied fails, the other rows copied into its place pass.
    bundle = record_program(tmp_path, """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        series = torch.randn(80, 6, 2).cumsum(1) * 0.1
        series[43, 2, 1] = float("nan")
        gru, head = torch.nn.GRU(2, 8, batch_first=True), torch.nn.Linear(8, 2)
        opt = torch.optim.SGD([*gru.parameters(), *head.parameters()], lr=0.05)
        h = None
        for (chunk,) in DataLoader(TensorDataset(series), batch_size=8):
            out, h = gru(chunk[:, :-1], h)
            h = h.detach()
            loss = torch.nn.functional.mse_loss(head(out), chunk[:, 1:])
            opt.zero_grad(); loss.backward(); opt.step()
    """)
    samples = crashcap_json("bisect", "samples", bundle)
    assert samples["filled_because"].startswith("RuntimeError: Expected hidden size"), samples
    assert samples["cuts_fail"] is None and samples["rows"] == [3] and samples["dataset_indices"] == [43], samples
    assert len(samples["experiments"]) == samples["replays"], samples
    kept_row_3 = [e for e in samples["experiments"] if e["rows"] == [3]]
    assert kept_row_3 and kept_row_3[-1]["command"].endswith("--rows " + ",".join(["3"] * 8)), kept_row_3
    triage = crashcap_json("triage", bundle)
    invalid = next(h for h in triage["hypotheses"] if h["id"] == "invalid-data")
    assert invalid["verdict"] == "confirmed", invalid
    assert any(e.startswith("cut to fewer rows the step fails another way (RuntimeError: Expected hidden size")
               and e.endswith("those it left out replaced by copies of those it kept") for e in invalid["evidence"]), invalid
    assert triage["culprit"]["rows"] == [3] and triage["culprit"]["dataset_indices"] == [43], triage["culprit"]

