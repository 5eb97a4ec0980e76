"""`crashcap run --record` of a training that makes no torch.optim optimizer and updates its weights by
its own code (`p -= lr * p.grad` under no_grad): the modules the first backward() gives gradients
are the model, recorded from the next batch on (tests/python/observed/shapes_of_loops.py --case
manual, and small programs of their own); and of trainings that take their gradients with
torch.autograd.grad() instead of backward()."""

import math
import subprocess
import textwrap

from conftest import PYTHON, crashcap, only_bundle, replay_and_triage, run_bare, run_recorded

# A regression with a NaN at dataset index 77 under --nan; --way says how it takes its gradients:
#   grad      torch.autograd.grad(loss, m.parameters()) (a generator), set as .grad, an SGD step
#   penalty   backward() of a loss with a gradient penalty: a grad() of the loss for the parameters,
#             with create_graph=True, inside the loss (a part of the loss, not the step's gradients)
#   adaptive  backward() of a loss weighted by the norm of its gradient for the last layer, taken by a
#             grad() with retain_graph=True before it (as VQGAN's adaptive weight is)
#   manual    torch.autograd.grad(), no optimizer: `p -= lr * g` under no_grad; .grad stays None
GRAD_TRAINING = textwrap.dedent("""
    import sys, torch, torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(1)
    way = sys.argv[sys.argv.index("--way") + 1]
    X = torch.randn(300, 6); Y = X[:, :2].sum(1, keepdim=True)
    if "--nan" in sys.argv:
        X[77, 3] = float("nan")
    m = nn.Sequential(nn.Linear(6, 24), nn.Tanh(), nn.Linear(24, 1))
    opt = None if way == "manual" else torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(2):
        for xb, yb in DataLoader(TensorDataset(X, Y), batch_size=15, shuffle=True):
            if way in ("penalty", "adaptive"):
                fit = nn.functional.mse_loss(m(xb), yb)
                if way == "penalty":
                    slopes = torch.autograd.grad(fit, m.parameters(), create_graph=True)
                    loss = fit + 0.01 * sum(g.pow(2).sum() for g in slopes)
                else:
                    last, = torch.autograd.grad(fit, m[2].weight, retain_graph=True)
                    loss = fit / (1.0 + last.norm().detach())
                opt.zero_grad()
                loss.backward()
                opt.step()
                continue
            loss = nn.functional.mse_loss(m(xb), yb)
            grads = torch.autograd.grad(loss, m.parameters())
            assert all(p.grad is None for p in m.parameters()) or opt is not None, "crashcap left a .grad"
            print("norm", f"{float(torch.stack([g.norm() for g in grads]).norm()):.9g}")
            if opt is None:
                with torch.no_grad():
                    for p, g in zip(m.parameters(), grads):
                        p -= 0.05 * g
            else:
                for p, g in zip(m.parameters(), grads):
                    p.grad = g
                opt.step()
        print("epoch", epoch, f"{float(loss):.6f}")
""")


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


def test_trainings_that_take_their_gradients_with_autograd_grad_are_recorded_replayed_and_triaged(tmp_path):
    # A grad() of a one-element loss for parameters ends the step as backward() does: its loss and the
    # norm of the gradients it returned are the step's fingerprint, its NaN stops the step, and the
    # recording changes nothing the training computes. One taken with create_graph=True inside a loss
    # is not the step's. Before, such a training was recorded as batches with no steps ended (and
    # said to draw its batches ahead).
    (tmp_path / "train.py").write_text(GRAD_TRAINING)
    for way, optimizer in (("grad", "optimizer SGD"), ("penalty", "optimizer SGD"), ("adaptive", "optimizer SGD"),
                           ("manual", "optimizer manual")):
        (tmp_path / way).mkdir()
        bare = subprocess.run([PYTHON, "train.py", "--way", way], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        r = crashcap("run", "--record", "--dir", tmp_path / way / "clean", "--", PYTHON, "train.py", "--way", way,
                     cwd=tmp_path)
        assert r.returncode == 0 and bare.returncode == 0 and r.stdout == bare.stdout, (way, r.stderr, bare.stderr)
        # No other warning (a loop drawing its batches ahead, a second backward()) than the two that
        # say no optimizer was made and that the weights are updated by the program's own code.
        warnings = [line for line in r.stderr.splitlines() if "warning" in line]
        assert optimizer in r.stderr and len(warnings) == (2 if way == "manual" else 0), (way, r.stderr)
        assert all("before any torch.optim optimizer was made" in line or "updates the weights itself" in line
                   for line in warnings), (way, r.stderr)
        # ... naming how this training takes its gradients.
        assert way != "manual" or ("torch.autograd.grad() ran on a DataLoader batch" in r.stderr
                                   and "backward() ran" not in r.stderr), (way, r.stderr)
        bundle, printed = record_written_program_at(tmp_path, way)
        replay, triage = replay_and_triage(bundle)
        if way == "grad":
            # The fingerprint's gradient norm is that of the gradients grad() returned (recorded step s
            # is the program's batch s: its optimizer came before the loop).
            norms = [float(line.split()[1]) for line in printed.splitlines() if line.startswith("norm ")]
            finite = [s for s in replay["steps"] if isinstance(s["recorded_grad_norm"], float)
                      and math.isfinite(s["recorded_grad_norm"])]
            assert finite and all(math.isclose(s["recorded_grad_norm"], norms[s["step"]], rel_tol=1e-5)
                                  for s in finite), (norms, replay["steps"])
        assert triage["culprit"]["dataset_indices"] == [77], (way, triage["culprit"])
        story = crashcap("inspect", bundle, "--json", check=True).stdout
        assert "non-finite loss at step" in story and "more than once" not in story, (way, story[-2000:])


def record_written_program_at(tmp_path, way):
    r = crashcap("run", "--record", "--dir", tmp_path / way / "runs", "--", PYTHON, "train.py", "--way", way, "--nan",
                 cwd=tmp_path)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, (way, r.stderr)
    return only_bundle(tmp_path / way / "runs"), r.stdout
