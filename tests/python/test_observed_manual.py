"""`crashcap run --record` of a training that makes no torch.optim optimizer and updates its weights by
its own code (`p -= lr * p.grad` under no_grad): the modules the first backward() gives gradients
are the model, recorded from the next batch on (tests/python/observed/shapes_of_loops.py --case
manual, and small programs of their own)."""

import textwrap

from conftest import PYTHON, crashcap, only_bundle, replay_and_triage, run_bare, run_recorded


def test_a_training_without_an_optimizer_that_updates_its_weights_itself_is_recorded_and_replays_from_a_later_keyframe(tmp_path):
    # `p -= lr * p.grad` under no_grad, no torch.optim, a loader made in each epoch's for statement
    # (gone but for its iterator: the replay keeps it to take its batches over): the observer's
    # record changes nothing the training computes.
    bare = run_bare(tmp_path, "shapes_of_loops.py", "--case", "manual")
    r, runs = run_recorded(tmp_path, "shapes_of_loops.py", "--case", "manual")
    assert r.returncode == 0 and r.stdout == bare.stdout, r.stderr
    # Dataset index 130 is NaN in the third epoch only (the program's batches 20..29).
    (tmp_path / "bad").mkdir()
    r, runs = run_recorded(tmp_path / "bad", "shapes_of_loops.py", "--case", "manual", "--nan-index", 130,
                           "--nan-epoch", 2, options=("--keyframe-every", 5))
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    assert "updates the weights itself" in r.stderr and "optimizer manual" in r.stderr, r.stderr
    assert "gradient accumulation" not in r.stderr, r.stderr  # every step updates, by the program's code
    bundle = only_bundle(runs)
    # Recording began at the program's second batch (the first backward() showed which parameters
    # train): recorded step s is the program's batch s + 1, so the NaN's steps are 19..28.
    replay, triage = replay_and_triage(bundle)
    assert 19 <= replay["step"] <= 28, replay
    # Keyframes were not held back as if gradients were accumulating: the replay starts from the
    # last one before the crash, the weights the program's own updates left there.
    assert replay["keyframe"] == replay["step"] // 5 * 5 and replay["keyframe"] >= 15, replay
    assert triage["culprit"]["dataset_indices"] == [130]


def test_an_optimizer_made_after_the_first_backward_is_the_trainings_and_bare_tensors_are_said_to_be_unrecorded(tmp_path):
    # The optimizer comes after the first backward() (which made the stand-in for a training
    # without one): it takes the stand-in's place, and nothing says the weights are updated by hand.
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        X = torch.randn(200, 4); Y = X.sum(1, keepdim=True); X[150, 1] = float("nan")
        m = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
        opt = None
        for epoch in range(2):
            for xb, yb in DataLoader(TensorDataset(X, Y), batch_size=10, shuffle=True):
                loss = nn.functional.mse_loss(m(xb), yb)
                loss.backward()
                if opt is None:
                    opt = torch.optim.SGD(m.parameters(), lr=0.01)
                opt.step(); opt.zero_grad()
    """))
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    assert "optimizer SGD" in r.stderr and "updates the weights itself" not in r.stderr, r.stderr
    _, triage = replay_and_triage(only_bundle(tmp_path / "runs"))
    assert triage["culprit"]["dataset_indices"] == [150]
    # Parameters that are bare tensors, updated by hand: no module holds them, so there is no model.
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "train.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        X = torch.randn(100, 5); Y = (X[:, 0] > 0).float()
        w = torch.zeros(5, requires_grad=True)
        for xb, yb in DataLoader(TensorDataset(X, Y), batch_size=25):
            torch.nn.functional.binary_cross_entropy_with_logits(xb @ w, yb).backward()
            with torch.no_grad():
                w -= 0.1 * w.grad
                w.grad = None
        print("done")
    """))
    r = crashcap("run", "--record", "--dir", tmp_path / "bare" / "runs", "--", PYTHON, "train.py", cwd=tmp_path / "bare")
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr
    assert r.stderr.count("a model of bare tensors?") == 1 and "records nothing of this training" in r.stderr, r.stderr
    assert "makes its own batches" not in r.stderr, r.stderr  # its batches are a DataLoader's
