"""`crashcap run --record`: what the observer cannot infer is one warning, and the training computes
what it computes without it; the bootstrap stays out of programs it has nothing to record in, and of
trainings that record themselves; a recorded batch lives as long as the training keeps it (the
recordings that replay: test_observed.py)."""

import os
import subprocess
import textwrap

from conftest import PYTHON, SAMPLE, crashcap, crashcap_json, only_bundle, run_bare, run_recorded


def test_two_optimizers_are_one_warning_kept_together_and_the_training_computes_the_same(tmp_path):
    bare = run_bare(tmp_path, "two_optimizers.py")
    r, runs = run_recorded(tmp_path, "two_optimizers.py")
    assert bare.returncode == 0 and r.returncode == 0, r.stderr
    assert r.stdout == bare.stdout  # the losses, digit for digit
    assert r.stderr.count("2 optimizers (Adam, SGD)") == 1, r.stderr
    # With a NaN point it crashes, and both optimizers' states replay it bit for bit.
    (tmp_path / "nan").mkdir()
    r, runs = run_recorded(tmp_path / "nan", "two_optimizers.py", "--nan-index", 17)
    bundle = only_bundle(runs)
    assert crashcap_json("replay", bundle)["verdict"] == "reproduced-bitwise"
    story = crashcap_json("inspect", bundle)
    assert any("2 optimizers" in w for w in story["warnings"]), story["warnings"]
    assert story["optimizer"]["kind"] == "adam+sgd", story["optimizer"]


def record_program(tmp_path, source, sealed="crash-*.ccap"):
    """crashcap run --record over a program of the test's own (it must fail); the run and its one
    bundle: the recorder's crash bundle, or, with `sealed="recording-*.ccap"`, the recording the
    supervisor sealed when the recorder did not."""
    (tmp_path / "train.py").write_text(textwrap.dedent(source))
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode != 0, r.stderr
    bundles = list((tmp_path / "runs").glob("*.ccap"))
    assert len(bundles) == 1 and bundles[0].match(sealed), bundles
    return r, str(bundles[0])


def test_a_sparse_embedding_gradient_is_part_of_the_fingerprint_and_its_step_replays_bit_for_bit(tmp_path):
    # EmbeddingBag(sparse=True) gives a sparse gradient (SparseAdam for it, Adam for the head): the
    # gradient norm of a step's fingerprint must read it. Sample 70 holds a token past the table.
    r, bundle = record_program(tmp_path, """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        tokens = torch.randint(0, 50, (96, 5))
        tokens[70, 2] = 53
        labels = torch.randint(0, 3, (96,))
        bags, head = torch.nn.EmbeddingBag(50, 8, sparse=True), torch.nn.Linear(8, 3)
        sparse, dense = torch.optim.SparseAdam(list(bags.parameters())), torch.optim.Adam(head.parameters())
        for step, (t, y) in enumerate(DataLoader(TensorDataset(tokens, labels), batch_size=8)):
            print("step", step, flush=True)
            loss = torch.nn.functional.cross_entropy(head(bags(t)), y)
            sparse.zero_grad(); dense.zero_grad(); loss.backward()
            head_grads = [p.grad.flatten() for p in head.parameters()]
            print("norms", step, torch.cat(head_grads).norm().item(),
                  torch.cat([bags.weight.grad.coalesce().values().flatten()] + head_grads).norm().item())
            sparse.step(); dense.step()
    """)
    assert "error of crashcap's own" not in r.stderr, r.stderr
    assert "step 8" in r.stdout and "step 9" not in r.stdout, r.stdout  # row 70 is in batch 8
    story = crashcap_json("inspect", bundle)
    assert story["crash_step"] == 8 and story["steps"]["completed"] == 8, story["steps"]
    # The last completed step's gradient norm is the whole gradient's, the sparse part counted.
    head_only, whole = [float(v) for v in r.stdout.split("norms 7 ")[1].split()[:2]]
    assert whole > head_only * 1.01, (head_only, whole)
    assert abs(story["steps"]["last_grad_norm"] - whole) <= 1e-5 * whole, (story["steps"], whole)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    assert all(s["grad_norm"] is not None for s in replay["steps"][:-1]), replay["steps"]


def test_an_error_of_crashcaps_own_ends_the_recording_and_a_later_crash_is_not_told_as_its_step(tmp_path):
    # crashcap's batch flattening fails from the fourth batch on (a fault the program puts into it
    # after it drew the third);
    # the training goes on and fails at its ninth batch, a step the recording does not hold.
    r, bundle = record_program(tmp_path, """
        import torch
        import crashcap._batch
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def broken(*args, **kwargs):
            raise KeyError("put in by the test")
        for step, (x, y) in enumerate(DataLoader(TensorDataset(torch.randn(64, 4), torch.arange(64) % 2), batch_size=4)):
            if step == 2:
                crashcap._batch.flatten = broken
            if step == 8:
                raise RuntimeError("the training's own failure at step 8")
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
    """, sealed="recording-*.ccap")
    # The traceback it asks to be reported with is there, and the training ran on to its own failure.
    assert "KeyError: 'put in by the test'" in r.stderr and "in broken" in r.stderr, r.stderr
    assert "stopped recording this training after an error of crashcap's own" in r.stderr, r.stderr
    story = crashcap_json("inspect", bundle)
    assert story["crash"]["error"] == "RuntimeError: the training's own failure at step 8", story["crash"]
    # Not a crash of the last recorded step: the recorder sealed none; the supervisor saw the exit.
    assert story["crash"]["source"] == "supervisor" and story["crash"]["step"] is None, story["crash"]
    assert story["steps"]["last"] == 2, story["steps"]
    assert any("recording stopped after an error of crashcap's own (KeyError" in w for w in story["warnings"]), story


def test_a_training_without_a_dataloader_is_one_warning_and_keeps_its_crash(tmp_path):
    bare = run_bare(tmp_path, "no_loader.py")
    r, runs = run_recorded(tmp_path, "no_loader.py")
    assert r.returncode == 0 and r.stdout == bare.stdout, r.stderr
    assert r.stderr.count("no DataLoader batch came before it") == 1, r.stderr
    (tmp_path / "crash").mkdir()
    r, runs = run_recorded(tmp_path / "crash", "no_loader.py", "--fail-step", 12)
    bundle = only_bundle(runs)
    story = crashcap_json("inspect", bundle)
    assert story["crash"]["source"] == "recorder" and "lost track of the data at step 12" in story["crash"]["error"]
    assert any("no_loader.py" in frame for frame in story["crash"]["stack"]), story["crash"]["stack"]
    replay = crashcap("replay", bundle)
    assert replay.returncode == 2 and "holds no steps" in replay.stderr, replay.stderr


def test_a_program_that_fails_before_its_first_batch_leaves_a_bundle_that_says_why_it_holds_no_steps(tmp_path):
    # The program dies while it sets up (its validation set is built wrong), before the first batch,
    # where crashcap run --record begins recording: the bundle is crashcap run's, with the error.
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        train = DataLoader(TensorDataset(torch.randn(40, 3), torch.randn(40, 1)), batch_size=8)
        validation = torch.randn(10, 3)[torch.tensor([2, 14])]
    """))
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode != 0 and "python-exception" in r.stderr, r.stderr
    bundle = only_bundle(tmp_path / "runs")
    replay = crashcap("replay", bundle)
    assert replay.returncode == 2 and "holds no steps: the process ended before its training's first batch" in \
        replay.stderr and "index 14 is out of bounds" in replay.stderr, replay.stderr
    triage = crashcap("triage", bundle)
    assert triage.returncode == 0, triage.stderr
    assert "crash python-exception (seen by crashcap run) before any step" in triage.stdout, triage.stdout
    assert triage.stdout.rstrip().endswith("culprit: none: the bundle holds no step to replay"), triage.stdout
    # Why the replay could not run is said once, in a note; each of the six hypotheses points to it.
    assert triage.stdout.count("holds no steps: the process ended before") == 1, triage.stdout
    assert triage.stdout.count("replay could not run (the note above), so nothing was tested") == 6, triage.stdout
    assert "Recorder::setProgram" not in triage.stdout + replay.stderr  # the C++ API's advice is not this user's
    # Without --record nothing in the process recorded: the replay says so, and how to record.
    (tmp_path / "plain").mkdir()
    crashcap("run", "--dir", tmp_path / "plain", "--", PYTHON, "train.py", cwd=tmp_path)
    replay = crashcap("replay", only_bundle(tmp_path / "plain"))
    assert replay.returncode == 2 and "without --record" in replay.stderr and "crashcap run --record" in replay.stderr, \
        replay.stderr


def test_gradient_accumulation_is_one_warning_and_changes_nothing(tmp_path):
    bare = run_bare(tmp_path, "mlp_loader.py", "--accumulate", 2, "--epochs", 1)
    r, runs = run_recorded(tmp_path, "mlp_loader.py", "--accumulate", 2, "--epochs", 1)
    assert r.returncode == 0 and r.stdout == bare.stdout, r.stderr
    assert r.stderr.count("gradient accumulation?") == 1, r.stderr
    # A keyframe holds no gradients: one due between two updates waits for the step after the next
    # update, so a replay never starts without the gradients accumulated before it.
    (tmp_path / "nan").mkdir()
    r, runs = run_recorded(tmp_path / "nan", "mlp_loader.py", "--accumulate", 2, "--epochs", 2, "--nan-index", 40,
                           "--fault-epoch", 1, options=("--keyframe-every", 3))
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    story = crashcap_json("inspect", bundle)
    keyframes = story["keyframes"]
    assert len(keyframes) > 1 and all(k % 2 == 0 for k in keyframes), keyframes  # updates end the odd steps
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    # The crash's step (13) begins with step 12's gradients: pack writes no keyframe there, and
    # keeps the one before it with the steps after it.
    assert story["crash"]["step"] == 13, story["crash"]
    packed = crashcap_json("pack", bundle, "-o", tmp_path / "packed.ccap")
    assert packed["keyframe_step"] == 12 and any("accumulated" in w for w in packed["warnings"]), packed
    assert crashcap_json("replay", tmp_path / "packed.ccap")["verdict"] == "reproduced-bitwise"


def test_a_clean_run_leaves_no_recording_unless_kept_and_a_kept_one_seals_whole(tmp_path):
    # Without --keep-recording the observer closes the recording without syncing it (it is
    # removed); with it, the recording is closed as any other and stays for `crashcap seal`.
    r, runs = run_recorded(tmp_path, "mlp_loader.py", "--epochs", 1)
    assert r.returncode == 0, r.stderr
    assert not [n for n in os.listdir(runs) if n.startswith(("recording-", "crash-"))], os.listdir(runs)
    (tmp_path / "kept").mkdir()
    r, kept = run_recorded(tmp_path / "kept", "mlp_loader.py", "--epochs", 1, options=("--keep-recording",))
    assert r.returncode == 0, r.stderr
    assert len([n for n in os.listdir(kept) if n.startswith("recording-")]) == 1, os.listdir(kept)
    sealed = crashcap_json("seal", kept)["sealed"]
    assert len(sealed) == 1 and sealed[0]["state"] == "finished", sealed
    story = crashcap_json("inspect", sealed[0]["bundle"])
    assert story["crash"] is None and story["steps"]["completed"] == 12, story["steps"]


def test_a_training_that_records_itself_is_left_to_its_own_recorder(tmp_path):
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, SAMPLE, "--record", tmp_path / "own",
                 "--steps", 22, "--fault", "nan-sample", "--fault-step", 19, "--quiet", cwd=tmp_path)
    assert r.returncode != 0
    assert "recording this training" not in r.stderr, r.stderr
    story = crashcap_json("inspect", only_bundle(tmp_path / "own"))
    assert story["crash"]["step"] == 19
    env = crashcap_json("inspect", only_bundle(tmp_path / "own"))["env"]
    assert env["facts"]["python.capture"] == "api"
    # The observer recorded nothing beside it: runs/ holds the run log and the supervisor's bundle,
    # which has no steps of its own.
    assert not [n for n in os.listdir(tmp_path / "runs") if n.startswith("recording-")]
    assert crashcap_json("inspect", only_bundle(tmp_path / "runs"))["steps"]["count"] == 0


def test_the_bootstrap_runs_the_sitecustomize_it_hides_and_a_program_without_torch_runs_untouched(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n")
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        print(os.environ.get('USER_SITECUSTOMIZE'), 'torch' in sys.modules, 'crashcap' in sys.modules)
    """))
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([os.path.join(os.environ["CRASHCAP_BIN"], "crashcap"), "run", "--record", "--dir",
                        str(tmp_path / "runs"), "--", PYTHON, str(script)], cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ran", "False", "False"], r.stdout


def test_a_recorded_batch_is_freed_when_the_training_drops_it_not_when_the_garbage_collector_runs(tmp_path):
    # Batches from worker processes live in shared memory: a batch the recorder kept alive in a
    # reference cycle would pile up (every step's, until a collection) beside the training's own.
    script = tmp_path / "held.py"
    script.write_text(textwrap.dedent("""
        import gc, weakref, torch
        from torch.utils.data import DataLoader, TensorDataset
        gc.disable()
        data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
        loader = DataLoader(data, batch_size=8, num_workers=2)
        model = torch.nn.Linear(8, 3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        kept = []
        for x, y in loader:
            kept += [weakref.ref(x), weakref.ref(y)]
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        del x, y
        print("alive", sum(r() is not None for r in kept), "of", len(kept))
    """))
    bare = subprocess.run([PYTHON, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert bare.stdout.strip() == "alive 0 of 16", bare
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, script, cwd=tmp_path)
    assert r.returncode == 0 and "recording this training from DataLoader #0" in r.stderr, r.stderr
    assert r.stdout.strip() == "alive 0 of 16", r.stdout


def test_record_options_without_record_are_refused(tmp_path):
    r = crashcap("run", "--nonfinite", "record", "--dir", tmp_path, "--", PYTHON, "-c", "pass")
    assert r.returncode == 2 and "add --record" in r.stderr, r.stderr


def test_the_stand_in_for_itertools_cycle_makes_cycles_that_pickle_subclass_and_compare_as_itertools_cycle(tmp_path):
    # The bootstrap's stand-in, imported before torch and after: the same values, pickling, copies,
    # isinstance and a subclass of the program's own, with and without the observer running.
    script = tmp_path / "cycles.py"
    script.write_text(textwrap.dedent("""
        import copy, itertools, pickle
        from itertools import cycle

        class Named(cycle):
            def name(self):
                return "named"

        def check(when):
            c = cycle([1, 2, 3]); next(c)
            again = pickle.loads(pickle.dumps(c))
            copied = copy.deepcopy(c)
            n = Named("ab")
            print(when, [next(again) for _ in range(4)], [next(copied) for _ in range(4)],
                  isinstance(c, itertools.cycle), issubclass(type(c), itertools.cycle), n.name(), next(n),
                  pickle.loads(pickle.dumps(itertools.cycle)) is itertools.cycle)

        check("before")
        import torch
        check("after")
    """))
    bare = subprocess.run([PYTHON, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    r = subprocess.run([os.path.join(os.environ["CRASHCAP_BIN"], "crashcap"), "run", "--record", "--dir",
                        str(tmp_path / "runs"), "--", PYTHON, str(script)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert bare.returncode == 0 and r.returncode == 0, (bare.stderr, r.stderr)
    assert r.stdout == bare.stdout, (r.stdout, bare.stdout)
    assert "before [2, 3, 1, 2] [2, 3, 1, 2] True True named a True" in r.stdout, r.stdout
