"""`crashcap run --record` follows the shapes a training's loops and data take (tests/python/observed/
shapes_of_loops.py and small programs of their own): workers, iterable datasets, a statistics pass,
folds, a loader made anew each epoch, a directory changed before training (a loader that fails to
load: test_observed_loading.py)."""

import textwrap

import pytest

from conftest import PYTHON, crashcap, crashcap_json, only_bundle, replay_and_triage, run_bare, run_recorded


def record_written_program(tmp_path, *options):
    """Record tmp_path/train.py, run from tmp_path, until its non-finite loss; return the bundle."""
    r = crashcap("run", "--record", *options, "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    return only_bundle(tmp_path / "runs")


def test_spawned_persistent_dataloader_workers_are_left_alone_and_the_training_replays(tmp_path):
    r, runs = run_recorded(tmp_path, "shapes_of_loops.py", "--case", "spawn", "--nan-index", 130)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    assert r.stderr.count("recording this training") == 1, r.stderr  # the workers record nothing
    _, triage = replay_and_triage(only_bundle(runs))
    assert triage["culprit"]["dataset_indices"] == [130]


def test_an_iterable_dataset_of_whole_batches_replays_without_dataset_indices(tmp_path):
    r, runs = run_recorded(tmp_path, "shapes_of_loops.py", "--case", "iterable", "--nan-index", 130)
    _, triage = replay_and_triage(only_bundle(runs))
    assert triage["culprit"]["rows"] == [130 % 16] and triage["culprit"]["dataset_indices"] is None


def test_a_statistics_pass_before_the_optimizer_exists_does_not_take_the_training_loader(tmp_path):
    r, runs = run_recorded(tmp_path, "shapes_of_loops.py", "--case", "stats-first", "--nan-index", 130)
    assert "a second DataLoader" not in r.stderr, r.stderr
    bundle = only_bundle(runs)
    assert crashcap_json("inspect", bundle)["env"]["facts"]["python.observed.loader"] == "1"
    _, triage = replay_and_triage(bundle)
    assert triage["culprit"]["dataset_indices"] == [130]


def test_the_second_fold_of_a_cross_validation_is_recorded_anew_and_replays_after_the_first(tmp_path):
    r, runs = run_recorded(tmp_path, "shapes_of_loops.py", "--case", "kfold", "--nan-index", 120)
    assert "fold 1" in r.stdout and "a new training" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    facts = crashcap_json("inspect", bundle)["env"]["facts"]
    assert facts["python.observed.training"] == "1"
    replay, triage = replay_and_triage(bundle)
    assert replay["keyframe"] == 0  # fold 1's own first step: fold 0 ran before it, as the program runs it
    assert triage["culprit"]["dataset_indices"] == [120]  # the index in the data, not in the fold's Subset


def test_a_dataloader_made_anew_every_epoch_goes_on_recording_the_training_and_a_validation_loader_does_not(tmp_path):
    bare = run_bare(tmp_path, "shapes_of_loops.py", "--case", "per-epoch")
    r, runs = run_recorded(tmp_path, "shapes_of_loops.py", "--case", "per-epoch")
    assert r.returncode == 0 and r.stdout == bare.stdout, r.stderr
    # The NaN row joins in epoch 1, from the second epoch's loader: recorded, replayed, triaged.
    (tmp_path / "nan").mkdir()
    r, runs = run_recorded(tmp_path / "nan", "shapes_of_loops.py", "--case", "per-epoch", "--nan-index", 130)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    assert r.stderr.count("a second DataLoader") == 1, r.stderr  # the validation loader, in eval mode
    assert "more than once" not in r.stderr, r.stderr
    replay, triage = replay_and_triage(only_bundle(runs))
    assert replay["step"] >= 10, replay  # epoch 0 has 10 steps of 16 rows
    assert triage["culprit"]["dataset_indices"] == [130]


def test_batches_left_unused_by_break_or_skipped_by_continue_replay_bit_for_bit_and_are_not_taken_for_a_prefetcher(
        tmp_path):
    bare = run_bare(tmp_path, "shapes_of_loops.py", "--case", "short")
    r, runs = run_recorded(tmp_path, "shapes_of_loops.py", "--case", "short")
    assert r.returncode == 0 and r.stdout == bare.stdout, r.stderr
    # Dataset index 77 is in epoch 1's first batch (the seeded shuffle): the sixth batch drawn.
    (tmp_path / "nan").mkdir()
    r, runs = run_recorded(tmp_path / "nan", "shapes_of_loops.py", "--case", "short", "--nan-index", 77)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    assert "draws a batch ahead" not in r.stderr, r.stderr
    replay, triage = replay_and_triage(only_bundle(runs))
    assert replay["step"] == 5, replay
    # Epoch 0's batch 1 (skipped) and batch 4 (drawn, then the loop left): no fingerprint either
    # side, and bit for bit.
    assert [s["step"] for s in replay["steps"] if s["untrained"]] == [1, 4], replay["steps"]
    assert all(s["bitwise"] for s in replay["steps"]), replay["steps"]
    assert triage["culprit"]["dataset_indices"] == [77]


def test_a_sample_drawn_twice_into_its_batch_is_named_once_by_triage_and_counted_as_such_by_pack(tmp_path):
    # The sampler draws with replacement; dataset index 7 is in step 2's batch twice (the seeded draw).
    r, runs = run_recorded(tmp_path, "shapes_of_loops.py", "--case", "replacement", "--nan-index", 7)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay, triage = replay_and_triage(bundle)
    assert replay["step"] == 2, replay
    # Each of the two rows fails alone: two sets, one dataset index.
    assert triage["culprit"]["dataset_indices"] == [7, 7], triage["culprit"]
    assert len(triage["culprit"]["rows"]) == 2, triage["culprit"]
    packed = crashcap_json("pack", bundle, "-o", tmp_path / "packed.ccap")
    samples = packed["contents"][0]
    # The replay wrote a keyframe at step 2: the attachment holds that step's batch alone.
    assert samples.startswith("16 training samples: the batch of step 2, dataset indices"), packed["contents"]
    assert "distinct among the 16 drawn: the sampler drew some more than once" in samples, samples
    assert "in all" not in samples, samples


def test_a_loop_that_draws_its_batches_one_ahead_is_said_to(tmp_path):
    r, _ = run_recorded(tmp_path, "shapes_of_loops.py", "--case", "prefetch")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("draws a batch ahead") == 1, r.stderr  # said once, for the whole run


def test_a_sanity_backward_before_the_loop_is_not_a_training_without_a_dataloader(tmp_path):
    r, runs = run_recorded(tmp_path, "shapes_of_loops.py", "--case", "warmup", "--nan-index", 130)
    assert "no DataLoader batch" not in r.stderr, r.stderr
    replay_and_triage(only_bundle(runs))


def test_a_program_that_changes_directory_before_it_trains_replays_from_where_it_started(tmp_path):
    # The script is named relative to where it started, and loads its data relative to where it
    # changed to: the replay must start it where it started, not where the recording began.
    (tmp_path / "data").mkdir()
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import os, torch
        from torch.utils.data import DataLoader, TensorDataset
        os.chdir("data")
        if not os.path.exists("table.pt"):
            torch.manual_seed(0)
            x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
            x[37, 1] = float("nan")
            torch.save((x, y), "table.pt")
        x, y = torch.load("table.pt")
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    """))
    bundle = record_written_program(tmp_path)
    assert crashcap_json("inspect", bundle)["env"]["facts"]["process.cwd"] == str(tmp_path)
    replay = crashcap_json("replay", bundle, cwd=tmp_path / "data")
    assert replay["verdict"] == "reproduced-bitwise", replay


def test_a_layer_frozen_before_the_keyframe_stays_frozen_and_keeps_moving_with_its_momentum_in_the_replay(tmp_path):
    # The first layer is frozen at the program's step 30; torch 1.13's zero_grad() leaves its
    # gradient a zero tensor, so SGD goes on moving it with its momentum. A replay from keyframe
    # 60 never runs the freeze (the program's counter starts again at 0): the keyframe keeps which
    # parameters are frozen and which hold a gradient, and the replay matches bit for bit.
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        x = torch.randn(16 * 40, 8)
        y = x[:, :3].sum(1, keepdim=True)
        x[30 * 16 + 3, 5] = float("nan")  # row 3 of step 70 (the second epoch's step 30)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        loader = DataLoader(TensorDataset(x, y), batch_size=16)
        step, clean = 0, x.clone()
        clean[30 * 16 + 3, 5] = 0.0
        for epoch in range(3):
            if epoch == 1:
                loader = DataLoader(TensorDataset(x, y), batch_size=16)
            else:
                loader = DataLoader(TensorDataset(clean, y), batch_size=16)
            for xb, yb in loader:
                if step == 30:
                    model[0].requires_grad_(False)
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(xb), yb).backward()
                opt.step()
                step += 1
    """))
    replay, triage = replay_and_triage(record_written_program(tmp_path, "--keyframe-every", 20))
    assert replay["keyframe"] == 60 and replay["step"] == 70, replay
    assert triage["culprit"]["dataset_indices"] == [30 * 16 + 3]


def test_a_warm_up_set_from_the_programs_own_step_counter_replays_bit_for_bit_from_a_later_keyframe(tmp_path):
    # The learning rate is set from the program's own counter after each batch is taken. A replay
    # from keyframe 60 starts that counter at 0 and sets the first group's rate 61 times too small; the
    # recorder keeps the rates end(loss) saw where they differ from the batch's, and the replay sets
    # them back there, so every update uses the recorded rate. A second group follows its own rule.
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        x = torch.randn(16 * 100, 8)
        y = x[:, :3].sum(1, keepdim=True)
        x[70 * 16 + 5, 2] = float("nan")  # row 5 of step 70
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        opt = torch.optim.Adam([{"params": model[0].parameters()}, {"params": model[2].parameters()}], lr=1e-3)
        step = 0
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=16):
            opt.param_groups[0]["lr"] = 1e-2 * min(1.0, (step + 1) / 100)
            opt.param_groups[1]["lr"] = 1e-2 / (1 + step) ** 0.5
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
            step += 1
    """))
    bundle = record_written_program(tmp_path, "--keyframe-every", 20)
    story = crashcap_json("inspect", bundle)
    failed = story["steps"]["last"]
    expected = [1e-2 * min(1.0, (failed + 1) / 100), 1e-2 / (1 + failed) ** 0.5]  # not the step before's
    assert story["steps"]["last_learning_rates"] == pytest.approx(expected, rel=1e-12), story["steps"]
    replay, triage = replay_and_triage(bundle)
    assert failed == 70 and replay["keyframe"] == 60 and replay["step"] == 70, replay
    assert triage["culprit"]["dataset_indices"] == [70 * 16 + 5]


PROGRAM_STATE_OUTSIDE_KEYFRAMES = {
    # A mean teacher: an EMA copy of the model that no optimizer holds gives the consistency target.
    "mean-teacher": """
        import copy
        teacher = copy.deepcopy(model)
        for p in teacher.parameters():
            p.requires_grad_(False)
        def extra_loss(out, xb, step):
            with torch.no_grad():
                target = teacher(xb + 0.05 * torch.randn_like(xb))
            return 0.5 * torch.nn.functional.mse_loss(out, target)
        def after_update(step):
            with torch.no_grad():
                for pt, ps in zip(teacher.parameters(), model.parameters()):
                    pt.mul_(0.9).add_(ps, alpha=0.1)
    """,
    # A loss weight annealed from the program's own step counter.
    "annealed-weight": """
        def extra_loss(out, xb, step):
            return min(1.0, step / 50) * out.pow(2).mean()
        def after_update(step):
            pass
    """,
}


@pytest.mark.parametrize("state", sorted(PROGRAM_STATE_OUTSIDE_KEYFRAMES))
def test_state_the_program_keeps_outside_the_keyframes_replays_bit_for_bit_from_the_earliest_keyframe(tmp_path, state):
    # Keyframe 60 holds the model and the optimizer, not the program's teacher or its counter: the
    # replay from it departs at step 60. The replay is tried again from keyframe 0, where the program
    # makes that state again as it did, and that one is the answer, naming keyframe 60 as skipped;
    # triage's experiments start from keyframe 0 too.
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        x = torch.randn(16 * 100, 8)
        y = x[:, :3].sum(1, keepdim=True)
        x[70 * 16 + 9, 4] = float("nan")  # row 9 of step 70
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Dropout(0.1),
                                    torch.nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    """) + textwrap.dedent(PROGRAM_STATE_OUTSIDE_KEYFRAMES[state]) + textwrap.dedent("""
        step = 0
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=16):
            out = model(xb)
            loss = torch.nn.functional.mse_loss(out, yb) + extra_loss(out, xb, step)
            opt.zero_grad()
            loss.backward()
            opt.step()
            after_update(step)
            step += 1
    """))
    bundle = record_written_program(tmp_path, "--keyframe-every", 20)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise" and replay["step"] == 70, replay
    assert replay["keyframe"] == 0 and replay["skipped_keyframe"] == {"step": 60, "diverged_at": 60}, replay
    asked = crashcap_json("replay", bundle, "--keyframe", 60)  # the newer keyframe, asked for: no fallback
    assert asked["verdict"] == "diverged" and asked["diverged_at"] == 60 and asked["skipped_keyframe"] is None, asked
    triage = crashcap_json("triage", bundle)
    hypotheses = {h["id"]: h for h in triage["hypotheses"]}
    assert hypotheses["invalid-data"]["verdict"] == "confirmed", triage
    assert hypotheses["nondeterminism"]["verdict"] == "refuted", triage
    assert "keyframe 60 does not hold" in " ".join(hypotheses["nondeterminism"]["evidence"]), triage
    assert triage["culprit"]["step"] == 70 and triage["culprit"]["dataset_indices"] == [70 * 16 + 9], triage
    # Each bisection is told the keyframe the replay settled on, so none replays from keyframe 60 again.
    commands = {e["name"]: e["command"] for e in triage["experiments"]}
    for name in ("bisect-samples", "bisect-ops", "bisect-config"):
        assert commands[name].endswith("--keyframe 0"), commands
    assert "--keyframe" not in commands["bisect-steps"], commands
    samples = crashcap_json("bisect", "samples", bundle, "--keyframe", 0)
    assert samples["rows"] == [9] and samples["replays"] <= samples["replay_bound_single_row"], samples
    assert all(t["command"].endswith("--keyframe 0") for t in samples["experiments"]), samples
    refused = crashcap("bisect", "steps", bundle, "--keyframe", 0)
    assert refused.returncode != 0 and "--keyframe is for ops, samples and config" in refused.stderr, refused
