"""`crashcap run --record` follows the shapes a training's loops and data take (tests/python/observed/
shapes_of_loops.py and small programs of their own): workers, iterable datasets, a statistics pass,
folds, a loader made anew each epoch, a sampler that draws with replacement, a directory changed
before training, an epoch's last batch of one sample (a loader that fails to load: test_observed_loading.py; state the program keeps
across steps: test_observed_program_state.py)."""

import os
import re
import textwrap

from conftest import (PYTHON, crashcap, crashcap_json, only_bundle, record_written_program, replay_and_triage,
                      run_bare, run_recorded)


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
    # Fold 0 ended clean before fold 1 failed: its recording is no evidence of the crash, so it is
    # neither sealed nor named as the run's bundle, and goes as a clean run's recording does.
    assert sorted(os.listdir(runs)) == [os.path.basename(bundle), "runs.jsonl"], os.listdir(runs)
    assert f"bundle    {bundle}" in r.stderr, r.stderr
    facts = crashcap_json("inspect", bundle)["env"]["facts"]
    assert facts["python.observed.training"] == "1"
    replay, triage = replay_and_triage(bundle)
    assert replay["keyframe"] == 0  # fold 1's own first step: fold 0 ran before it, as the program runs it
    assert triage["culprit"]["dataset_indices"] == [120]  # the index in the data, not in the fold's Subset


def test_an_optimizer_made_in_the_loop_after_a_lazy_forward_is_recorded_from_the_next_batch_and_replays(tmp_path):
    # The NaN row (dataset index 130) comes after the first batch in the loader's shuffled order.
    r, runs = run_recorded(tmp_path, "shapes_of_loops.py", "--case", "lazy", "--nan-index", 130)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    assert "no model to record yet" in r.stderr, r.stderr
    assert "no DataLoader" not in r.stderr, r.stderr  # the first batch's backward is no training without one
    assert r.stderr.count("recording this training") == 1, r.stderr
    # The replay takes the recorded batches over from the second batch of the first iteration, as
    # the recording took them, and runs the first batch as the program does.
    _, triage = replay_and_triage(only_bundle(runs))
    assert triage["culprit"]["dataset_indices"] == [130]


def test_a_second_backward_whose_loss_is_inf_fails_its_step_and_the_replay_runs_the_step_to_it(tmp_path):
    bare = run_bare(tmp_path, "shapes_of_loops.py", "--case", "two-losses")
    r, runs = run_recorded(tmp_path, "shapes_of_loops.py", "--case", "two-losses")
    assert r.returncode == 0 and r.stdout == bare.stdout, r.stderr
    assert r.stderr.count("ran backward() more than once") == 1, r.stderr
    # Dataset index 130's reconstruction target is Inf: the step's classification loss (its first
    # backward, the fingerprint) is finite, its second loss is not. Unchecked, the update would
    # carry it into the weights and every later loss would be NaN.
    (tmp_path / "bad").mkdir()
    r, runs = run_recorded(tmp_path / "bad", "shapes_of_loops.py", "--case", "two-losses", "--nan-index", 130)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    assert "its backward() #2; the first one's loss was finite" in r.stderr, r.stderr
    # The replay runs the target step past its first backward, to the second, and stops there.
    replay, triage = replay_and_triage(only_bundle(runs))
    assert "backward() #2" in replay["error"], replay
    target = [s for s in replay["steps"] if s["step"] == replay["step"]][0]
    assert target["later_backward"]["backward"] == 2 and target["later_backward"]["loss"] == "inf", target
    assert triage["culprit"]["dataset_indices"] == [130]


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


def test_a_loop_over_itertools_cycle_records_each_batch_it_hands_out_again_as_a_step_of_its_samples(tmp_path):
    # cycle(loader) keeps the first epoch's 10 batches and hands them out again: the same items,
    # in the same order. The observer's cycle tells each of them as a step, of the samples it held.
    bare = run_bare(tmp_path, "shapes_of_loops.py", "--case", "cycle")
    r, _ = run_recorded(tmp_path, "shapes_of_loops.py", "--case", "cycle")
    assert r.returncode == 0 and r.stdout == bare.stdout, r.stderr
    (tmp_path / "blow-up").mkdir()
    r, runs = run_recorded(tmp_path / "blow-up", "shapes_of_loops.py", "--case", "cycle", "--blow-up")
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    assert "more than once" not in r.stderr and ".step() ran again" not in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    step = replay["step"]
    assert step >= 20, replay  # the loss leaves the finite numbers in the third pass or later, not at batch 9
    assert all(s["bitwise"] for s in replay["steps"]), replay["steps"]

    def indices(k):
        return crashcap_json("show", bundle, f"steps/{k}/batch/index")["text"]
    earlier = [k for k in range(step % 10, step, 10)
               if crashcap("show", bundle, f"steps/{k}/batch/index").returncode == 0]
    assert earlier, "the recording keeps no earlier pass of the failing step's batch"
    assert all(indices(k) == indices(step) for k in earlier), (earlier, step)
    assert indices(step) != indices(step - 1)  # each step its own batch of the pass


def test_a_loop_that_updates_many_times_on_one_batch_is_said_to_and_its_late_non_finite_loss_says_after_how_many(
        tmp_path):
    # "Overfit one batch": one batch drawn, then an update after update on it with a learning rate
    # that grows until the loss is no longer finite. Every update is step 0's.
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(64, 10, generator=g), torch.randint(0, 3, (64,), generator=g)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.3 ** s)
        xb, yb = next(iter(DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)))
        for _ in range(120):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            optimizer.zero_grad(); loss.backward(); optimizer.step(); schedule.step()
    """))
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    assert r.stderr.count("SGD.step() ran again in step 0 before DataLoader #0 gave another batch") == 1, r.stderr
    assert "non-finite loss at step 0" in r.stderr and "optimizer steps on its batch" in r.stderr, r.stderr
    inspect = crashcap_json("inspect", only_bundle(tmp_path / "runs"))
    said = re.search(r"its backward\(\) #(\d+), after (\d+) optimizer steps on its batch", inspect["crash"]["error"])
    assert inspect["crash"]["step"] == 0 and said, inspect["crash"]
    assert int(said[2]) == int(said[1]) - 1 > 1, said[0]  # one update after each backward() before it


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


def test_the_epochs_last_batch_of_one_sample_that_batchnorm_refuses_is_named_a_short_batch(tmp_path):
    # 81 samples in batches of 16 (drop_last=False): step 5 is the epoch's last batch, of 1 row,
    # and BatchNorm raises on it. Sample bisection can only name that row, the whole batch; triage
    # says the batch is short, beside it and on the culprit line.
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        x, y = torch.randn(81, 6), torch.randint(0, 3, (81,))
        model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.BatchNorm1d(12), torch.nn.ReLU(),
                                    torch.nn.Linear(12, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    """))
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode == 1 and "Expected more than 1 value per channel when training" in r.stderr, r.stderr
    bundle = only_bundle(tmp_path / "runs")
    triage = crashcap("triage", bundle)
    assert triage.returncode == 0, triage.stderr
    assert ("step 5's batch has 1 row, where 5 earlier recorded steps had 16: a short batch, the last of an epoch"
            " whose dataset the batch size does not divide?" in triage.stdout), triage.stdout
    assert "culprit: step 5, its short batch of 1 row (earlier steps had 16)" in triage.stdout, triage.stdout
