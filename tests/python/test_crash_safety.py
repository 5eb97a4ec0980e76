"""Every way a Python training can die leaves a sealed bundle that says how, and the program's
own reporting (the traceback, faulthandler) still happens."""

import json
import os
import signal
import subprocess
import textwrap
import time

import pytest

from conftest import PYTHON, crashcap, crashcap_json, only_bundle, python_stack_on_signal

PROLOGUE = """
import faulthandler, sys, torch, crashcap
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""
LOOP = """
def batches():
    while True:
        yield torch.randn(5, 4)
for step, x in rec.steps(batches()):
    loss = model(x).pow(2).mean()
    if step == 3:
        FAIL
    loss.backward()
    rec.end(loss)
    opt.step()
    opt.zero_grad()
    if step == STOP:
        break
"""


def run(tmp_path, fail, before="", after="", wait=True, stop=200):
    code = textwrap.dedent(PROLOGUE) + before + '\nrec = crashcap.Recorder("runs", model=model, optimizer=opt, quiet=True)\n' \
        + after + textwrap.dedent(LOOP).replace("FAIL", fail).replace("STOP", str(stop))
    script = tmp_path / "train.py"
    script.write_text(code)
    if not wait:
        return subprocess.Popen([PYTHON, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return subprocess.run([PYTHON, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("order", ["faulthandler first", "faulthandler after"])
def test_a_segfault_in_native_code_is_sealed_and_faulthandler_still_reports_it(tmp_path, order):
    enable = "faulthandler.enable()\n"
    r = run(tmp_path, "import ctypes; ctypes.string_at(0)", before=enable if order == "faulthandler first" else "",
            after=enable if order == "faulthandler after" else "")
    assert r.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in r.stderr
    crash = crashcap_json("inspect", only_bundle(tmp_path / "runs"))["crash"]
    assert crash["kind"] == "signal" and crash["signal_name"] == "SIGSEGV" and crash["step"] == 3
    if order == "faulthandler first":  # crashcap's handler sees the fault itself, at its address
        assert "at address 0x" in crash["error"], crash["error"]
    else:  # faulthandler reports it and raises it again: the address is not in what crashcap sees
        assert "raised in the process (raise or kill, or a fault handler passing a fault on)" in crash["error"]
    # The Python line that was running, in the error (the program's, calling into ctypes) and as
    # the outermost frames of the stack, after the native ones.
    if not python_stack_on_signal():
        assert "; in Python at " not in crash["error"], crash["error"]
        return
    script = tmp_path / "train.py"
    line = script.read_text().splitlines().index("        import ctypes; ctypes.string_at(0)") + 1
    program_frame = f'File "{script}", line {line}, in <module>'
    assert f"; in Python at {program_frame} (calling File " in crash["error"], crash["error"]
    assert crash["stack"][-1] == program_frame and "ctypes" in crash["stack"][-2], crash["stack"][-3:]
    assert crash["stack"][0].startswith("/"), crash["stack"][0]  # the native frames first, innermost first


def test_an_uncaught_exception_is_sealed_with_its_python_traceback_and_still_printed(tmp_path):
    r = run(tmp_path, 'raise ValueError("the batch had no labels")')
    assert r.returncode == 1
    assert "ValueError: the batch had no labels" in r.stderr and "Traceback" in r.stderr
    crash = crashcap_json("inspect", only_bundle(tmp_path / "runs"))["crash"]
    assert crash["kind"] == "exception" and crash["step"] == 3 and crash["phase"] == "forward"
    assert crash["error"] == "ValueError: the batch had no labels" and crash["error_type"] == "ValueError"
    assert "train.py" in crash["stack"][0] and "raise ValueError" in crash["stack"][0]


def test_a_handled_exception_given_to_fail_is_sealed_and_training_goes_on(tmp_path):
    r = run(tmp_path, textwrap.dedent("""\
        try:
                    raise KeyError("shard 7")
                except KeyError as e:
                    print("bundle:", rec.fail(e))"""))
    assert r.returncode == 0, r.stderr
    bundle = only_bundle(tmp_path / "runs")
    assert f"bundle: {os.path.abspath(bundle)}" in r.stdout or "bundle: runs/" in r.stdout
    crash = crashcap_json("inspect", bundle)["crash"]
    assert crash["error"] == "KeyError: 'shard 7'" and crash["step"] == 3


def test_a_non_finite_loss_is_sealed_with_the_python_stack(tmp_path):
    r = run(tmp_path, 'loss = loss * float("inf") * 0')
    assert r.returncode == 1 and "crashcap.NonFiniteError" in r.stderr
    crash = crashcap_json("inspect", only_bundle(tmp_path / "runs"))["crash"]
    assert crash["kind"] == "nonfinite" and crash["step"] == 3
    assert any("train.py" in f and "rec.end(loss)" in f for f in crash["stack"]), crash["stack"]
    # inf * 0 is a NaN with its sign bit set on x86; the message reads "nan" as Python writes it.
    assert crash["error"].startswith("non-finite loss at step 3: nan ") and "-nan" not in r.stderr, crash["error"]
    assert crash["error"].endswith('nonfinite="record" lets the training go on)'), crash["error"]
    replay = crashcap_json("replay", only_bundle(tmp_path / "runs"))
    assert replay["error"] == "non-finite loss at step 3: nan", replay


def test_after_sigkill_crashcap_seal_keeps_what_reached_the_disk(tmp_path):
    p = run(tmp_path, "pass", wait=False, stop=10**9)
    runs = tmp_path / "runs"
    deadline = time.time() + 120
    while time.time() < deadline and not any(runs.glob("recording-*/*")):
        time.sleep(0.2)
    time.sleep(1.0)
    p.kill()
    p.wait()
    r = crashcap("seal", runs)
    assert r.returncode == 0, r.stderr
    story = crashcap_json("inspect", only_bundle(runs))
    assert story["steps"]["last"] >= 0 and story["program"]["format"] == "python"


def test_a_dataloader_worker_that_segfaults_is_the_trainings_error_not_a_crash_of_its_own(tmp_path):
    # Forked workers inherit the crash guard and the op observer; in a worker they only pass the
    # failure on, so the one bundle is the training's, with the loader's error.
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import ctypes, torch, crashcap
        from torch.utils.data import DataLoader, Dataset

        class Data(Dataset):
            def __len__(self):
                return 64
            def __getitem__(self, i):
                if i == 37:
                    ctypes.string_at(0)
                return torch.full((3,), float(i))

        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        rec = crashcap.Recorder("runs", model=model, optimizer=opt, quiet=True)
        for step, x in rec.steps(DataLoader(Data(), batch_size=4, num_workers=2)):
            loss = model(x).mean()
            loss.backward()
            rec.end(loss)
            opt.step()
            opt.zero_grad()
    """))
    r = subprocess.run([PYTHON, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert "segmentation fault" in r.stderr.lower()  # the worker's own last words
    # The training's error is the DataLoader's report of the worker, or the pipe the dying worker
    # broke (ConnectionResetError), then with the DataLoader's report beside it. Either way the
    # bundle names the worker and the signal.
    crash = crashcap_json("inspect", only_bundle(tmp_path / "runs"))["crash"]
    assert crash["kind"] == "exception", crash
    assert "DataLoader worker (pid" in crash["error"] and "Segmentation fault" in crash["error"], crash["error"]


def test_an_error_a_signal_handler_raises_inside_crashcap_is_the_trainings_crash_not_crashcaps(tmp_path):
    # A handler of the program's (a cluster's preemption signal; the DataLoader's SIGCHLD handler)
    # raises wherever the main thread is when the signal comes, in crashcap's own code too. That
    # error is the training's: it ends the training, recorded as its crash, and does not stop the
    # recording as an error of crashcap's own would (letting the training go on). The signal comes
    # there every time here: the batch holds tags crashcap keeps by their repr, and one tag's repr,
    # which crashcap calls as it records the batch, sends the signal.
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import os, signal, torch
        from torch.utils.data import DataLoader, Dataset

        class Preemption:  # as a framework installs one: an object, which puts the default back first
            def __call__(self, signum, frame):
                signal.signal(signum, signal.SIG_DFL)
                raise RuntimeError("preempted: the cluster wants this node back")

        signal.signal(signal.SIGUSR1, Preemption())

        class Tag:  # slots: no attributes crashcap could keep, so it keeps the repr
            __slots__ = ("i",)
            def __init__(self, i):
                self.i = i
            def __repr__(self):
                if self.i == 43:
                    os.kill(os.getpid(), signal.SIGUSR1)
                return f"Tag({self.i})"

        class Records(Dataset):
            def __len__(self):
                return 96
            def __getitem__(self, i):
                return torch.full((3,), i / 96.0), torch.tensor([float(i % 2)]), Tag(i)

        def collate(samples):
            xs, ys, tags = zip(*samples)
            return torch.stack(xs), torch.stack(ys), list(tags)

        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for x, y, tags in DataLoader(Records(), batch_size=8, collate_fn=collate):
            opt.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
            opt.step()
        print("trained")
    """))
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode != 0 and "trained" not in r.stdout, r.stdout + r.stderr
    assert "error of crashcap's own" not in r.stderr, r.stderr  # before: the training went on, the error lost
    assert "RuntimeError: preempted" in r.stderr, r.stderr  # the program's own traceback, as without crashcap
    crash = crashcap_json("inspect", only_bundle(tmp_path / "runs"))["crash"]
    assert crash["error"].endswith("RuntimeError: preempted: the cluster wants this node back"), crash
    assert crash["step"] == 4, crash  # batch 5 (samples 40..47) never became a step; steps 0..4 ran


def test_an_error_raised_from_another_keeps_the_chain_and_still_replays_bit_for_bit(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch, crashcap
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        rec = crashcap.Recorder("runs", model=model, optimizer=opt, keyframe_every=2, quiet=True)
        settings = {"scale": 1.0}
        for step, x in rec.steps([torch.randn(4, 3) for _ in range(8)]):
            loss = model(x).pow(2).mean()
            if step == 5:
                try:
                    settings["clip"]
                except KeyError as e:
                    raise ValueError("no clip setting for step 5") from e
            loss.backward()
            rec.end(loss)
            opt.step()
            opt.zero_grad()
    """))
    r = subprocess.run([PYTHON, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    bundle = only_bundle(tmp_path / "runs")
    crash = crashcap_json("inspect", bundle)["crash"]
    assert crash["error"] == ("KeyError: 'clip'\n\nThe above exception was the direct cause of the following exception:"
                              "\n\nValueError: no clip setting for step 5"), crash["error"]
    assert crash["step"] == 5
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay  # the last lines agree


def test_a_child_the_training_forks_exits_normally_and_the_recording_goes_on(tmp_path):
    # A child that returns through Python's exit (atexit, the Recorder's close) inherits the
    # recorder without its writer thread: before, its close waited for that thread forever. Its
    # own steps and errors are not the training's.
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PROLOGUE) + textwrap.dedent("""\
        import os
        rec = crashcap.Recorder("runs", model=model, optimizer=opt, quiet=True)
        for step in range(7):
            with rec.step(step, torch.randn(5, 4)):
                loss = model(torch.randn(5, 4)).pow(2).mean()
                loss.backward()
                rec.end(loss)
                opt.step()
                opt.zero_grad()
            if step == 3:
                pid = os.fork()
                if pid == 0:
                    with rec.step(1000, torch.randn(5, 4)):
                        rec.end(model(torch.randn(5, 4)).sum())
                    try:
                        raise ValueError("the child's own error")
                    except ValueError as e:
                        assert rec.fail(e) == ""
                    sys.exit(0)
                _, status = os.waitpid(pid, 0)
                print("child status", status)
        rec.close()
        """))
    r = subprocess.run([PYTHON, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "child status 0" in r.stdout
    runs = os.listdir(tmp_path / "runs")
    assert not [f for f in runs if f.startswith("crash-")], runs
    recording = [d for d in runs if d.startswith("recording-")]
    assert len(recording) == 1, runs
    crashcap("seal", tmp_path / "runs" / recording[0], "-o", tmp_path / "all.ccap", check=True)
    story = crashcap_json("inspect", tmp_path / "all.ccap")
    assert story["steps"]["count"] == 7 and story["steps"]["last"] == 6, story["steps"]


def segfaulting_training(tmp_path, make_batch, dies_when):
    """Runs a training of 6 steps whose batch `make_batch` makes (x, from step) and which dies of
    SIGSEGV in native code in the step where `dies_when` holds."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PROLOGUE) + textwrap.dedent("""\
        import ctypes
        rec = crashcap.Recorder("runs", model=model, optimizer=opt, quiet=True)
        def batches():
            for step in range(6):
        MAKE_BATCH
                yield x
        for step, x in rec.steps(batches()):
            if DIES_WHEN:
                ctypes.string_at(0)
            loss = model(x).pow(2).mean()
            loss.backward()
            rec.end(loss)
            opt.step()
            opt.zero_grad()
        """).replace("MAKE_BATCH", textwrap.indent(make_batch, " " * 8)).replace("DIES_WHEN", dies_when))
    r = subprocess.run([PYTHON, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGSEGV, r.stderr


def test_a_replay_that_dies_in_the_programs_set_up_is_not_the_failure_reproduced(tmp_path):
    # The recording died of SIGSEGV in step 3; the replay dies of SIGSEGV too, but in the program's
    # own set-up, before its loop began a replayed step: not the recorded failure, and said so.
    r = run(tmp_path, "import ctypes; ctypes.string_at(0)",
            after="if crashcap.replaying():\n    import ctypes; ctypes.string_at(0)\n")
    assert r.returncode == -signal.SIGSEGV
    bundle = only_bundle(tmp_path / "runs")
    out = crashcap("replay", bundle)
    assert out.returncode > 0, (out.returncode, out.stdout, out.stderr)  # an error, not the signal
    assert "died of SIGSEGV while it replayed" in out.stderr
    assert "before it began the first replayed step (before it had restored the keyframe" in out.stderr
    assert "not in the step the recording failed in" in out.stderr
    assert "verdict" not in out.stdout


def test_a_segfault_that_comes_back_at_another_step_is_named_where_it_came(tmp_path):
    # Recorded: SIGSEGV in step 3. Replayed from keyframe 0: SIGSEGV in step 1, a step the
    # recording ran through. The failure came back, earlier; the step is the one it came in.
    segfaulting_training(tmp_path, "x = torch.randn(5, 4)", "step == (1 if crashcap.replaying() else 3)")
    bundle = only_bundle(tmp_path / "runs")
    rep = crashcap_json("replay", bundle)
    assert rep["verdict"] == "reproduced" and rep["step"] == 3 and rep["died_in_step"] == 1
    assert any("died in step 1, the recording in step 3" in n and "one the recording ran through" in n
               for n in rep["notes"]), rep["notes"]
    steps = crashcap_json("bisect", "steps", bundle)
    assert steps["first_failing_step"] == 1 and steps["reason"] == "error"
    assert [s["step"] for s in steps["steps"]] == [0, 1] and steps["steps"][0]["bitwise"]


def test_a_segfault_one_sample_causes_is_bisected_to_its_row(tmp_path):
    # Native code that dies on one sample (row 5 of step 3's batch): the replays cannot answer, but
    # each dies in the step whose rows it keeps, or passes, so the rows can be searched.
    segfaulting_training(tmp_path, "x = torch.randn(8, 4)\nif step == 3:\n    x[5, 2] = 1e6", "(x.abs() > 1e5).any()")
    bundle = only_bundle(tmp_path / "runs")
    rep = crashcap_json("replay", bundle)
    assert rep["died_in_step"] == 3 and rep["batch_size"] == 8
    samples = crashcap_json("bisect", "samples", bundle)
    assert samples["reproduced"] is True and samples["rows"] == [5], samples
    triage = crashcap_json("triage", bundle)
    assert triage["culprit"]["step"] == 3 and triage["culprit"]["rows"] == [5], triage["culprit"]


def test_signal_handlers_wait_while_a_crash_is_recorded_and_run_after_it():
    from crashcap._recorder import _SignalHandlersDeferred
    calls = []

    def usr1(signum, frame):
        calls.append(signum)
        raise RuntimeError("worker died")

    previous = signal.signal(signal.SIGUSR1, usr1)
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):
            with _SignalHandlersDeferred() as deferred:
                os.kill(os.getpid(), signal.SIGUSR1)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # both delivered; neither handler has run
                assert calls == []
                raised = deferred.run_pending()  # as rec.fail does, before it seals
                assert calls == [signal.SIGUSR1]
                assert [type(e) for e in raised] == [RuntimeError, KeyboardInterrupt]
        # The first exception a handler raised comes out after the block, and every handler is back.
        assert signal.getsignal(signal.SIGUSR1) is usr1 and signal.getsignal(signal.SIGINT) is sigint
        with pytest.raises(RuntimeError, match="worker died"):
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_segfault_that_comes_back_in_replay_is_the_failure_reproduced(tmp_path):
    # The recorded program dies of SIGSEGV again when it replays step 3: nothing in it can answer,
    # so only the failure is compared, and replay says so instead of dying itself.
    r = run(tmp_path, "import ctypes; ctypes.string_at(0)")
    assert r.returncode == -signal.SIGSEGV
    bundle = only_bundle(tmp_path / "runs")
    out = crashcap("replay", bundle, "--json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["verdict"] == "reproduced" and rep["step"] == 3 and rep["steps"] == []
    assert rep["error"] == "killed by SIGSEGV again, as in the recording"
    assert rep["same_setup"] is False
    # The program's progress file says where it died, and from which keyframe it replayed.
    assert rep["died_in_step"] == 3 and rep["keyframe"] == 0
    assert any("died of SIGSEGV while it replayed" in n and "in step 3" in n for n in rep["notes"])
    assert not any("another step" in n for n in rep["notes"])
    text = crashcap("replay", bundle)
    assert text.returncode == 0 and "verdict  reproduced" in text.stdout
    assert "no step came back (it died in step 3)" in text.stdout
    # Step bisection takes the step from there; the steps before it pass.
    steps = crashcap_json("bisect", "steps", bundle)
    assert steps["first_failing_step"] == 3 and steps["reason"] == "error"
    assert [s["step"] for s in steps["steps"]] == [0, 1, 2, 3] and all(s["bitwise"] for s in steps["steps"][:3])
    # A step before the crash replays bit for bit as usual.
    before = crashcap_json("replay", bundle, "--step", "2")
    assert before["verdict"] == "reproduced-bitwise" and [s["step"] for s in before["steps"]][-1] == 2
