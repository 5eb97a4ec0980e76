"""`crashcap bisect ops` of Python recordings: the program runs twice, once as the float64
reference (the target step widened) and once as recorded, and the target step's outermost ops
are compared. Each case checks what the comparison must conclude, not only that it ran."""

import os
import textwrap

from conftest import SAMPLE, TRAININGS, crashcap, crashcap_json, only_bundle, run_python


def sample_crash(tmp_path, fault, step):
    r = run_python(SAMPLE, "--record", "runs", "--steps", 30, "--fault", fault, "--fault-step", step, "--fault-row", 3,
                   "--workers", 2, "--keyframe-every", 10, "--quiet", cwd=tmp_path)
    assert r.returncode != 0, r.stdout + r.stderr
    return only_bundle(tmp_path / "runs")


def bisect_ops(bundle):
    ops = crashcap_json("bisect", "ops", bundle)
    assert ops["replay"]["verdict"] == "reproduced-bitwise", ops
    assert ops["reference"]["dtype"] == "float64 (target step)", ops
    return ops


def test_a_division_by_an_empty_mask_fails_in_float64_too_and_names_the_division(tmp_path):
    ops = bisect_ops(sample_crash(tmp_path, "mask-eps0", 19))
    assert ops["step"] == 19
    assert ops["first_nonfinite_op"]["name"] == "aten::div", ops["first_nonfinite_op"]
    assert ops["first_nonfinite_op"]["phase"] == "forward"
    # 0/0 is NaN in any precision: the arithmetic, not float32, is at fault; the NaN comes at the
    # same op in both, so no op departs before it.
    assert ops["fails_in_float64"] is True, ops["reference"]
    assert ops["first_departing_op"] is None, ops["first_departing_op"]
    assert ops["stopped_because"] is None, ops["stopped_because"]
    assert ops["ops_compared"] > 20  # the forward up to the loss, and its backward


def test_a_runaway_learning_rate_overflows_float32_only_and_departs_in_the_forward(tmp_path):
    ops = bisect_ops(sample_crash(tmp_path, "lr-blowup", 15))
    assert ops["fails_in_float64"] is False, ops["reference"]
    departing = ops["first_departing_op"]
    assert departing is not None and departing["phase"] == "forward" and departing["elements"] > 0, ops
    assert ops["first_nonfinite_op"] is not None


def test_an_overflow_only_float32_has_departs_at_the_op_and_float64_runs_clean(tmp_path):
    # The step makes its own float32 constant (torch.ones): the reference widens the default dtype,
    # so the constant is float64 there and the matmul with the widened activations runs.
    script = tmp_path / "overflow.py"
    script.write_text(textwrap.dedent("""
        import torch, crashcap
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh())
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        rec = crashcap.Recorder("runs", model=model, optimizer=opt, keyframe_every=3, quiet=True)
        g = torch.Generator().manual_seed(2)
        batches = [torch.randn(8, 5, generator=g) for _ in range(10)]
        for step, x in rec.steps(batches):
            scale = 1e39 if step == 7 else 1.0   # beyond float32's range, well inside float64's
            loss = (model(x) @ torch.ones(4, 1)).pow(2).mean() * scale
            loss.backward()
            rec.end(loss)
            opt.step()
            opt.zero_grad()
    """))
    r = run_python(str(script), cwd=tmp_path)
    assert r.returncode != 0
    ops = bisect_ops(only_bundle(tmp_path / "runs"))
    assert ops["step"] == 7
    assert ops["fails_in_float64"] is False, ops["reference"]
    assert ops["reference"]["error"] is None, ops["reference"]
    departing = ops["first_departing_op"]
    assert departing is not None, ops
    assert departing["name"] == "aten::mul" and departing["phase"] == "forward", departing
    assert departing["replayed"]["inf_count"] == 1 and departing["reference"]["inf_count"] == 0, departing
    assert ops["first_nonfinite_op"]["name"] == "aten::mul"


def test_finite_gradients_too_large_for_a_float32_norm_are_said_so_and_no_norm_of_crashcaps_is_an_op(tmp_path):
    # Gradients of about 1e25 are finite in float32, their squares are not: the step's gradient
    # norm is Inf. The recorder says the gradients are finite; the replay's own norms (its
    # fingerprint of the step) are not among the step's ops, so no op is blamed for the Inf.
    script = tmp_path / "huge.py"
    script.write_text(textwrap.dedent("""
        import torch, crashcap
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        rec = crashcap.Recorder("runs", model=model, optimizer=opt, keyframe_every=2, quiet=True)
        g = torch.Generator().manual_seed(2)
        batches = [torch.randn(8, 6, generator=g) for _ in range(8)]
        for step, x in rec.steps(batches):
            loss = model(x).pow(2).mean() * (1e25 if step == 5 else 1.0)
            loss.backward()
            rec.end(loss)
            opt.step()
            opt.zero_grad()
    """))
    r = run_python(str(script), cwd=tmp_path)
    assert r.returncode != 0
    assert "non-finite gradient norm at step 5: inf, of gradients that are all finite" in r.stderr, r.stderr
    ops = bisect_ops(only_bundle(tmp_path / "runs"))
    assert ops["step"] == 5
    assert ops["first_nonfinite_op"] is None, ops["first_nonfinite_op"]
    assert ops["fails_in_float64"] is False, ops["reference"]
    departing = ops["first_departing_op"]
    assert departing is None or "norm" not in departing["name"], departing


def test_a_with_rec_step_loop_widens_its_own_batch_tensors_for_the_reference(tmp_path):
    r = run_python(os.path.join(TRAININGS, "with_form.py"), "--record", "runs", "--fault-step", 14, cwd=tmp_path)
    assert r.returncode != 0
    ops = bisect_ops(only_bundle(tmp_path / "runs"))
    assert ops["step"] == 14
    assert ops["first_nonfinite_op"]["name"] == "aten::log"
    assert ops["fails_in_float64"] is True  # log(0) is -inf in any precision
    # The forward runs through the loop's own x, widened by .data: had it stayed float32, the
    # reference's linear layer would have failed on mixed dtypes before the log.
    assert "expected" not in (ops["reference"]["error"] or ""), ops["reference"]
    assert ops["stopped_because"] is None, ops["stopped_because"]


def test_a_reference_that_breaks_on_its_own_float32_tensor_says_nothing_about_precision(tmp_path):
    # The step makes a float32 tensor explicitly: against the widened activations the matmul
    # fails in the reference, for the reference's own reason, not the training's NaN.
    script = tmp_path / "explicit.py"
    script.write_text(textwrap.dedent("""
        import torch, crashcap
        torch.manual_seed(0)
        model = torch.nn.Linear(5, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        rec = crashcap.Recorder("runs", model=model, optimizer=opt, keyframe_every=3, quiet=True)
        g = torch.Generator().manual_seed(2)
        batches = [torch.randn(8, 5, generator=g) for _ in range(6)]
        batches[4][2, 1] = float("nan")
        for step, x in rec.steps(batches):
            loss = (model(x) @ torch.ones(4, 1, dtype=torch.float32)).pow(2).mean()
            loss.backward()
            rec.end(loss)
            opt.step()
            opt.zero_grad()
    """))
    r = run_python(str(script), cwd=tmp_path)
    assert r.returncode != 0
    ops = crashcap_json("bisect", "ops", only_bundle(tmp_path / "runs"))
    assert ops["replay"]["verdict"] == "reproduced-bitwise", ops
    assert ops["reference"]["error"], ops["reference"]  # it failed ...
    assert "non-finite" not in ops["reference"]["error"], ops["reference"]
    assert ops["fails_in_float64"] is False  # ... but not the way the training did


def test_a_loss_module_s_own_tensors_are_widened_with_the_model_for_the_reference(tmp_path):
    # CrossEntropyLoss(weight=...) keeps its class weights as a buffer of the loss module, not of
    # the model: the reference widens them too, or cross_entropy refuses float64 logits beside
    # float32 weights and the reference says nothing about precision.
    script = tmp_path / "weighted.py"
    script.write_text(textwrap.dedent("""
        import torch, crashcap
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        crit = torch.nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 3.0]), label_smoothing=0.1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        rec = crashcap.Recorder("runs", model=model, optimizer=opt, keyframe_every=3, quiet=True)
        g = torch.Generator().manual_seed(2)
        batches = [(torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(6)]
        batches[4][0][2, 1] = float("nan")
        for step, (x, y) in rec.steps(batches):
            logits = model(x)
            loss = crit(logits, y)
            loss.backward()
            rec.end(loss)
            opt.step()
            opt.zero_grad()
    """))
    r = run_python(str(script), cwd=tmp_path)
    assert r.returncode != 0
    ops = bisect_ops(only_bundle(tmp_path / "runs"))
    assert ops["step"] == 4
    assert ops["reference"]["error"] is None or "expected" not in ops["reference"]["error"], ops["reference"]
    assert ops["fails_in_float64"] is True, ops["reference"]  # the NaN feature is NaN in any precision
    assert ops["first_nonfinite_op"]["name"] in ("aten::linear", "aten::addmm"), ops["first_nonfinite_op"]


def test_a_random_draw_that_float64_draws_differently_stops_the_comparison_and_is_not_blamed(tmp_path):
    # A VAE's reparameterisation draws noise with randn_like: the float64 reference draws other
    # numbers from the same generator state, so the comparison stops there instead of naming the
    # draw as the first op that departs.
    script = tmp_path / "vae.py"
    script.write_text(textwrap.dedent("""
        import torch, crashcap
        torch.manual_seed(0)
        enc, dec = torch.nn.Linear(6, 4), torch.nn.Linear(2, 6)
        params = list(enc.parameters()) + list(dec.parameters())
        opt = torch.optim.Adam(params, lr=1e-3)
        model = torch.nn.ModuleList([enc, dec])
        rec = crashcap.Recorder("runs", model=model, optimizer=opt, keyframe_every=2, quiet=True)
        g = torch.Generator().manual_seed(3)
        batches = [torch.rand(8, 6, generator=g) for _ in range(5)]
        batches[3][5] = -0.5  # not a pixel: log() below goes NaN
        for step, x in rec.steps(batches):
            mu, logvar = enc(x).chunk(2, dim=1)
            z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
            recon = torch.sigmoid(dec(z))
            loss = -(x * recon.log() + (1 - x) * (1 - recon).log()).mean() + x.log().mean() * 0
            loss.backward()
            rec.end(loss)
            opt.step()
            opt.zero_grad()
    """))
    r = run_python(str(script), cwd=tmp_path)
    assert r.returncode != 0, r.stderr
    ops = crashcap_json("bisect", "ops", only_bundle(tmp_path / "runs"))
    assert ops["replay"]["verdict"] == "reproduced-bitwise", ops
    assert ops["first_departing_op"] is None, ops["first_departing_op"]
    assert "aten::randn_like" in ops["stopped_because"] and "draws random numbers" in ops["stopped_because"], ops


NARROWING_STEP = """
    import torch, crashcap
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rec = crashcap.Recorder("runs", model=model, optimizer=opt, keyframe_every=3, quiet=True)
    g = torch.Generator().manual_seed(2)
    batches = [torch.randn(8, 5, generator=g) for _ in range(10)]
    for step, x in rec.steps(batches):
        {loss}
        loss.backward()
        rec.end(loss)
        opt.step()
        opt.zero_grad()
"""


def narrowing_ops(tmp_path, loss):
    script = tmp_path / "narrowing.py"
    script.write_text(textwrap.dedent(NARROWING_STEP).format(loss=loss))
    r = run_python(str(script), cwd=tmp_path)
    assert r.returncode != 0, r.stdout + r.stderr
    ops = bisect_ops(only_bundle(tmp_path / "runs"))
    assert ops["step"] == 7
    return ops


def test_a_step_that_narrows_float64_values_past_float32s_range_itself_is_no_float64_failure(tmp_path):
    # The step casts to float32 itself: the reference's widened values (1e39, inside float64's
    # range) overflow at that cast, so the reference fails the same way without failing in float64.
    ops = narrowing_ops(tmp_path, "loss = (model(x) * (1e39 if step == 7 else 1.0)).float().pow(2).mean()")
    assert ops["first_nonfinite_op"]["name"] == "aten::mul", ops["first_nonfinite_op"]  # float32 overflows there
    assert ops["reference"]["first_nonfinite_op"]["name"] == "aten::to", ops["reference"]  # the cast, not a move
    assert ops["reference_narrowed"] == {"dtype": "Float", "op": "aten::to", "past_range": True}, ops
    assert ops["fails_in_float64"] is False, ops["reference"]
    text = crashcap("bisect", "ops", only_bundle(tmp_path / "runs"))
    assert ("goes non-finite only at aten::to, where the step casts its float64 values to Float itself: they exceed "
            "Float's range (not a float64 failure" in text.stdout), text.stdout


def test_an_op_the_step_runs_in_float32_itself_fails_in_float32_in_the_reference_too(tmp_path):
    # The step narrows the model's output to float32 itself before it overflows: the reference's
    # multiplication runs on float32 values too, and its infinity says nothing about float64.
    ops = narrowing_ops(tmp_path, "loss = (model(x).float() * (1e39 if step == 7 else 1.0)).pow(2).mean()")
    assert ops["reference"]["first_nonfinite_op"]["name"] == "aten::mul", ops["reference"]
    assert ops["reference_narrowed"] == {"dtype": "Float", "op": "aten::mul", "past_range": False}, ops
    assert ops["fails_in_float64"] is False, ops["reference"]
    text = crashcap("bisect", "ops", only_bundle(tmp_path / "runs"))
    assert "goes non-finite at aten::mul, which ran in Float there" in text.stdout, text.stdout
