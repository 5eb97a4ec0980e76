"""Python trainings that are not the sample: other models, losses, optimizers, schedules, batch
shapes and loop forms, recorded, replayed bit for bit and triaged."""

import os
import textwrap

from conftest import TRAININGS, crashcap, crashcap_json, only_bundle, run_python


def record(script, tmp_path, *args):
    r = run_python(os.path.join(TRAININGS, script), "--record", "runs", *args, cwd=tmp_path)
    assert r.returncode != 0, f"{script} was meant to crash:\n{r.stdout}\n{r.stderr}"
    return only_bundle(tmp_path / "runs")


def test_tuple_batches_sgd_steplr_and_numpy_noise_in_the_loop_replay_bit_for_bit(tmp_path):
    bundle = record("mlp_tuple.py", tmp_path, "--fault-step", 13, "--fault-row", 2, "--workers", 2)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    assert replay["keyframe"] == 8 and replay["step"] == 13
    triage = crashcap_json("triage", bundle)
    verdicts = {h["id"]: h["verdict"] for h in triage["hypotheses"]}
    assert verdicts["invalid-data"] == "confirmed", triage["hypotheses"]
    assert triage["culprit"]["rows"] == [2]


def test_nested_dict_batches_without_a_dataloader_and_an_embedding_past_its_vocabulary(tmp_path):
    bundle = record("embed_dict.py", tmp_path, "--fault-step", 13, "--fault-row", 1)
    story = crashcap_json("inspect", bundle)
    assert story["crash"]["kind"] == "exception" and "IndexError" in story["crash"]["error"]
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    triage = crashcap_json("triage", bundle)
    verdicts = {h["id"]: h["verdict"] for h in triage["hypotheses"]}
    assert verdicts["invalid-data"] == "confirmed", triage["hypotheses"]
    assert triage["culprit"]["rows"] == [1]
    assert triage["culprit"]["dataset_indices"] == [13 * 8 + 1]


def test_a_with_rec_step_loop_replays_from_its_keyframe_and_refuses_a_subset_of_rows(tmp_path):
    # with_form.py seeds differently in a replay: the bits can only come from the restore.
    bundle = record("with_form.py", tmp_path, "--fault-step", 14)
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    assert replay["keyframe"] == 12 and [s["step"] for s in replay["steps"]] == [12, 13, 14]
    assert replay["first_nonfinite_op"]["name"] == "aten::log"
    rows = crashcap("replay", bundle, "--rows", "3")
    assert rows.returncode != 0 and "replays only whole, unchanged batches" in rows.stderr
    # Sample bisection stops at the first refused replay and says why, instead of counting each
    # refusal as a pass and naming every row.
    samples = crashcap("bisect", "samples", bundle)
    assert samples.returncode != 0 and "did not run" in samples.stderr, samples.stdout + samples.stderr
    assert "replays only whole, unchanged batches" in samples.stderr


def test_ops_the_autograd_engine_runs_around_a_node_are_recorded_as_backward(tmp_path):
    script = tmp_path / "shared.py"
    script.write_text(textwrap.dedent("""
        import torch, crashcap
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rec = crashcap.Recorder("runs", model=model, optimizer=opt, quiet=True)
        nan = torch.tensor(float("nan"))  # made before the step: no op runs after its backward
        for step, x in rec.steps([torch.randn(3, 4)]):
            h = model(x)
            loss = (h * h.sigmoid() + h.exp()).sum()   # h feeds three ops: its gradients accumulate
            loss.backward()
            rec.end(nan)
    """))
    r = run_python(str(script), cwd=tmp_path)
    assert r.returncode != 0
    ops = crashcap_json("inspect", only_bundle(tmp_path / "runs"), "--ops", 1000)["last_ops"]
    ops = [o for o in ops if o["step"] == 0]
    first_backward = next(i for i, o in enumerate(ops) if o["phase"] == "backward")
    late_forward = [o["name"] for o in ops[first_backward:] if o["phase"] != "backward"]
    assert late_forward == [], f"ops after backward began but labelled forward: {late_forward}"
    assert any(o["name"] == "aten::add" or o["name"] == "aten::add_" for o in ops[first_backward:])


def test_a_module_switched_to_eval_mid_run_replays_in_the_mode_it_had(tmp_path):
    # Batch norm frozen at step 5; replay starts at keyframe 8, so the loop never sees step 5:
    # only the recorded train/eval flags put the layer back in eval mode.
    script = tmp_path / "freeze.py"
    script.write_text(textwrap.dedent("""
        import torch, crashcap
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                    torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        rec = crashcap.Recorder("runs", model=model, optimizer=opt, keyframe_every=4, quiet=True)
        model.train()
        g = torch.Generator().manual_seed(1)
        batches = [torch.randn(16, 6, generator=g) for _ in range(12)]
        for step, x in rec.steps(batches):
            if step == 5:
                model[1].eval()
            if step == 10:
                x[2, 0] = float("nan")
            loss = model(x).pow(2).mean()
            loss.backward()
            rec.end(loss)
            opt.step()
            opt.zero_grad()
    """))
    r = run_python(str(script), cwd=tmp_path)
    assert r.returncode != 0
    replay = crashcap_json("replay", only_bundle(tmp_path / "runs"))
    assert replay["keyframe"] == 8 and replay["verdict"] == "reproduced-bitwise", replay
