"""A replay that starts at a keyframe sets the training loop's own numbers (its step counter, the
epoch, an enumerate count, a weight it anneals) back to the recording's at each step
(crashcap/_loop.py, docs/PYTHON.md "The loop's own numbers"), and a keyframe keeps which
parameters are frozen and which hold a gradient (tests/python/observed/own_counters.py)."""

import json
import os
import sys

import torch
from conftest import OBSERVED, crashcap, crashcap_json, only_bundle, run_python, run_recorded, verdicts

from crashcap import _loop, _state

EVERY = ("--keyframe-every", "20")


def _replay(bundle):
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    return replay


def _said(replay):
    notes = [n for n in replay["notes"] if "the loop's own numbers" in n]
    assert len(notes) == 1, replay["notes"]
    return notes[0]


def test_a_warm_up_from_the_scripts_own_counter_replays_bit_for_bit_from_a_later_keyframe(tmp_path):
    # The learning rate and the penalty's weight come from the script's `step` and `beta`: a
    # replay from keyframe 20 that left them at 0 departed at its first update.
    r, runs = run_recorded(tmp_path, "own_counters.py", "--case", "script", "--nan-step", 30, options=EVERY)
    assert r.returncode != 0 and "nonfinite-loss" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    records = crashcap_json("info", bundle)
    assert "loop_state" in json.dumps(records), records
    replay = _replay(bundle)
    assert replay["keyframe"] == 20 and replay["step"] == 30, replay
    assert "step 0 -> 20" in _said(replay) and "beta 0.0 -> 0.4" in _said(replay)
    triage = crashcap_json("triage", bundle)
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    assert verdicts(triage)["nondeterminism"] == "refuted", triage["hypotheses"]
    assert triage["culprit"]["dataset_indices"] == [30 * 16 + 3]


def test_an_enumerate_count_and_the_epoch_in_a_function_come_back_across_an_epoch_and_a_frozen_layer(tmp_path):
    # The error is raised when epoch * 40 + i reaches 70: a replay from keyframe 60 (epoch 1,
    # i 20) reaches it only with the enumerate count and the epoch set back. The first layer was
    # frozen at step 30 and goes on moving with its momentum (its zeroed gradient exists): the
    # keyframe holds both, so the replay's updates match.
    r, runs = run_recorded(tmp_path, "own_counters.py", "--case", "function", "--nan-step", -1, "--raise-at", 70,
                           options=EVERY)
    assert r.returncode != 0 and "global step 70" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    replay = _replay(bundle)
    assert replay["keyframe"] == 60 and replay["step"] == 70, replay
    assert "global step 70" in replay["error"], replay
    said = _said(replay)
    assert "epoch 0 -> 1" in said and "i 0 -> 20" in said, said

    # A pack keeps the target step's loop numbers with it: replayed from the state it holds at
    # step 70, the loop reaches the error there.
    pack = tmp_path / "small.ccap"
    crashcap("pack", bundle, "-o", pack, check=True)
    replay = _replay(pack)
    assert replay["keyframe"] == 70 and "global step 70" in replay["error"], replay


def test_a_clock_reading_is_not_set_back_so_a_time_budget_does_not_end_the_replay(tmp_path):
    r, runs = run_recorded(tmp_path, "own_counters.py", "--case", "clock", "--nan-step", 30, options=EVERY)
    assert "nonfinite-loss" in r.stderr, r.stderr
    replay = _replay(only_bundle(runs))
    assert replay["keyframe"] == 20 and replay["step"] == 30, replay
    assert "t0" not in _said(replay) and "step 0 -> 20" in _said(replay)


def test_the_explicit_api_loop_sets_its_own_numbers_back_too(tmp_path):
    r = run_python(os.path.join(OBSERVED, "own_counters.py"), "--case", "api", "--nan-step", 30, cwd=tmp_path)
    assert "NonFiniteError" in r.stderr, r.stderr
    replay = _replay(only_bundle(tmp_path / "runs"))
    assert replay["keyframe"] == 20 and "beta 0.0 -> 0.4" in _said(replay), replay


# ---- the parts -----------------------------------------------------------------------------------


def test_numbers_keeps_plain_numbers_and_leaves_clock_readings_out():
    import time
    step, epoch, lr, warm, t0, tick, ns = 7, 2, 0.25, True, time.time(), time.monotonic(), time.perf_counter_ns()
    name, scale, arr = "x", 2 ** 70, [1]
    kept = _loop.numbers(sys._getframe())
    assert kept == {"step": step, "epoch": epoch, "lr": lr, "warm": warm, "scale": scale} == {
        "step": 7, "epoch": 2, "lr": 0.25, "warm": True, "scale": 2 ** 70}, kept
    del t0, tick, ns, name, arr  # locals of this frame until numbers() ran


def test_loop_frame_passes_generators_and_installed_code():
    def consumer():
        def wrap():
            yield _loop.loop_frame(sys._getframe())
        return next(wrap()), sys._getframe()
    found, own = consumer()
    assert found is own  # the generator wrapping the loader is passed for the loop that consumes it
    assert _loop.loop_frame(None) is None
    # A library's loop (installed code) is no loop of the program's: nothing is armed there.
    library = compile("def fit(hand_over):\n    return hand_over()\n",
                      os.path.join(os.path.dirname(os.__file__), "crashcap_test_fit.py"), "exec")
    scope = {}
    exec(library, scope)
    assert scope["fit"](lambda: _loop.loop_frame(sys._getframe().f_back)) is None


def test_no_capture_under_another_tracer():
    seen = []
    previous = sys.gettrace()
    sys.settrace(lambda *a: None)
    try:
        assert _loop._at_body(sys._getframe(), seen.append) is False
    finally:
        sys.settrace(previous)
    assert seen == []


def test_at_body_runs_at_the_loop_bodys_first_line_after_the_header_assigned():
    seen = []

    class Loader:
        def __iter__(self):
            for k in range(3):
                _loop._at_body(_loop.loop_frame(sys._getframe()), lambda f: seen.append(f.f_locals["i"]))
                yield k

    for i, _ in enumerate(Loader()):
        pass
    assert seen == [0, 1, 2]
    assert sys.gettrace() is None  # the trace is gone once it ran


def test_a_keyframes_modes_keep_frozen_parameters_and_which_hold_a_gradient():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    model(torch.randn(2, 3)).sum().backward()
    model[0].requires_grad_(False)
    model[1].bias.grad = None
    doc = _state.module_modes(model)
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    _state.restore_module_modes(fresh, doc)
    assert [p.requires_grad for p in fresh.parameters()] == [False, False, True, True]
    grads = [p.grad for p in fresh.parameters()]
    assert grads[3] is None and all(g is not None and not g.any() for g in grads[:3])
    # A keyframe written before these were kept leaves them as they are.
    older = torch.nn.Linear(3, 4)
    _state.restore_module_modes(older, json.dumps({"eval": []}))
    assert older.weight.requires_grad and older.weight.grad is None


def test_the_training_runs_the_same_recorded_and_bare(tmp_path):
    bare = run_python(os.path.join(OBSERVED, "own_counters.py"), "--case", "function", "--nan-step", -1,
                      "--epochs", 2, cwd=tmp_path)
    (tmp_path / "rec").mkdir()
    r, _ = run_recorded(tmp_path / "rec", "own_counters.py", "--case", "function", "--nan-step", -1, "--epochs", 2)
    assert r.returncode == 0 and bare.returncode == 0, r.stderr + bare.stderr
    assert r.stdout == bare.stdout  # the capture only reads the loop's numbers
