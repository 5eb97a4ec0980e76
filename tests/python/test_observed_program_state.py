"""`crashcap run --record` over programs that keep state of their own across steps: a layer frozen
before the keyframe, a warm-up set from the program's own step counter, and state the keyframes do
not hold (a mean teacher's weights, a loss weight the program anneals itself), which a replay from
the earliest keyframe rebuilds; and state that keeps a graph an earlier backward() freed (a hidden
state not detached), which the failing backward() is told of.
(Split from test_observed_loops.py, which follows how a training loops over its data.)"""

import textwrap

import pytest
from conftest import PYTHON, crashcap, crashcap_json, only_bundle, record_written_program, replay_and_triage


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


TBPTT = """
    import torch
    from torch.utils.data import DataLoader
    torch.manual_seed(0)
    chunks = torch.sin(torch.linspace(0, 60, 40 * 4 * 20)).reshape(40, 4, 20, 1)
    gru, head = torch.nn.GRU(1, 16, batch_first=True), torch.nn.Linear(16, 1)
    opt = torch.optim.Adam(list(gru.parameters()) + list(head.parameters()), lr=0.01)
    h = None
    for x in DataLoader(chunks, batch_size=None):
        y, h = gru(x[:, :-1], h)  # h carried into the next step with its graph: h.detach() is missing
        loss = torch.nn.functional.mse_loss(head(y), x[:, 1:])
        opt.zero_grad(); loss.backward(); opt.step()
"""

GAN = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    gen, dis = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)
    og, od = torch.optim.Adam(gen.parameters()), torch.optim.Adam(dis.parameters())
    bce = torch.nn.BCEWithLogitsLoss()
    for real, in DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=16):
        fake = gen(torch.randn(16, 4))
        d_loss = bce(dis(real), torch.ones(16, 1)) + bce(dis(fake), torch.zeros(16, 1))  # fake.detach() is missing
        od.zero_grad(); d_loss.backward(); od.step()
        r = real.clone().requires_grad_()  # a gradient penalty's call keeps its graph: it frees nothing
        penalty = torch.autograd.grad(dis(r).sum(), r, create_graph=True)[0].pow(2).mean()
        g_loss = bce(dis(fake), torch.ones(16, 1))
        og.zero_grad(); g_loss.backward(); og.step()
"""


TWICE = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(TensorDataset(torch.randn(40, 5), torch.randn(40, 1)), batch_size=8):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward()
        loss.backward()  # the same loss again
        opt.step()
"""

RUNNING_MEAN = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 12), torch.nn.ReLU(), torch.nn.Linear(12, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mean = None
    for x, y in DataLoader(TensorDataset(torch.randn(200, 5), torch.randn(200, 1)), batch_size=20):
        loss = torch.nn.functional.mse_loss(model(x), y)
        mean = loss if mean is None else 0.9 * mean + 0.1 * loss  # loss.item() is missing
        for p, g in zip(model.parameters(), torch.autograd.grad(mean, list(model.parameters()))):
            p.grad = g
        opt.step()
"""


@pytest.mark.parametrize("program,by,whose,holder", [
    (TBPTT, "backward()", "of the graph that step 0's backward() freed, entering it at", None),
    (GAN, "backward()", "of the graph that this step's (step 0's) earlier backward() freed, entering it at", "`fake`"),
    (TWICE, "backward()", "starts from a tensor whose graph this step's (step 0's) earlier backward() already went "
     "through and freed (at its node MseLossBackward0): the same loss given to backward() twice?", None),
    (RUNNING_MEAN, "torch.autograd.grad()",
     "of the graph that step 0's torch.autograd.grad() freed, entering it at", None)],
    ids=["hidden-state-carried", "generator-output-twice", "same-loss-twice", "running-mean-by-grad"])
def test_a_backward_through_a_graph_an_earlier_backward_freed_says_whose_graph_it_reached(tmp_path, program, by, whose,
                                                                                          holder):
    # PyTorch says only "Trying to backward through the graph a second time". The graph the last
    # backward() freed is known to crashcap (its roots, held until the next one): the failing
    # backward() is told which backward's graph it reached, under the error and in the bundle, and
    # which of the program's variables holds a tensor of that graph, where one still does (the
    # GAN's `fake`; the carried hidden state and running mean were replaced by this step's, and
    # the earlier call's loss is no carrier). The GAN's gradient penalty between the two calls
    # keeps its graph (create_graph): it frees nothing, and the hold stays the discriminator's.
    (tmp_path / "train.py").write_text(textwrap.dedent(program))
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "RuntimeError: Trying to backward through the graph a second time" in r.stderr, r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith(f"crashcap: this {by} ")]
    assert len(said) == 1 and whose in said[0], r.stderr
    if holder:
        assert f'its graph, as {holder} does (File "{tmp_path / "train.py"}", line ' in said[0], said[0]
    else:
        assert "its graph, as `" not in said[0], said[0]
    crash = crashcap_json("inspect", only_bundle(tmp_path / "runs"))["crash"]
    assert crash["error"].endswith(said[0]), crash["error"]
    assert crash["classification"] == "python-exception"
