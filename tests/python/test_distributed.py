"""Multi-process jobs: every rank's recording says which rank of which job it is."""

import glob
import os

from conftest import PYTHON, TRAININGS, crashcap, crashcap_json

DDP = os.path.join(TRAININGS, "ddp_gloo.py")


def test_each_rank_of_a_ddp_job_records_its_rank_backend_and_the_shared_job_id(tmp_path):
    # An unmodified 2-rank DDP training (Gloo, CPU) under crashcap run --record; rank 1 raises
    # at step 3, rank 0 then fails in its all-reduce. Both seal a bundle.
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, DDP, "--steps", 6, "--fail-rank", 1,
                 "--fail-step", 3, cwd=tmp_path, timeout=600)
    assert r.returncode != 0, r.stdout + r.stderr
    bundles = sorted(glob.glob(str(tmp_path / "runs" / "crash-*.ccap")))
    assert len(bundles) == 2, (bundles, r.stdout, r.stderr)
    stories = [crashcap_json("inspect", b) for b in bundles]
    ranks = sorted(s["distributed"]["rank"] for s in stories)
    assert ranks == [0, 1]
    for s in stories:
        d = s["distributed"]
        assert d["world_size"] == 2 and d["local_rank"] == d["rank"]
        assert d["backend"] == "gloo" and d["source"] == "torch.distributed"
        assert d["rendezvous"].startswith("env://127.0.0.1:")
        assert d["job_id_source"] == "crashcap run"
    assert stories[0]["distributed"]["job_id"] == stories[1]["distributed"]["job_id"] != ""
    failed = next(s for s in stories if s["distributed"]["rank"] == 1)
    assert "rank 1 gives up at step 3" in failed["crash"]["error"] and failed["crash"]["step"] == 3
    text = crashcap("inspect", bundles[0], check=True).stdout
    assert "rank       " in text and "of 2" in text and "gloo" in text


def test_two_runs_of_one_command_are_two_jobs(tmp_path):
    ids = []
    for attempt in range(2):
        runs = tmp_path / f"runs{attempt}"
        crashcap("run", "--record", "--dir", runs, "--", PYTHON, DDP, "--steps", 4, "--fail-rank", 0, "--fail-step", 1,
                 cwd=tmp_path, timeout=600)
        bundles = glob.glob(str(runs / "crash-*.ccap"))
        assert bundles
        ids.append({crashcap_json("inspect", b)["distributed"]["job_id"] for b in bundles})
    assert len(ids[0]) == 1 and len(ids[1]) == 1 and ids[0] != ids[1]


def test_a_process_that_is_not_a_rank_has_no_distributed_identity(tmp_path):
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, os.path.join(TRAININGS, "mlp_tuple.py"),
                 "--fault-step", 3, cwd=tmp_path, timeout=600)
    assert r.returncode != 0
    bundles = glob.glob(str(tmp_path / "runs" / "crash-*.ccap"))
    assert len(bundles) == 1, r.stdout + r.stderr
    assert crashcap_json("inspect", bundles[0])["distributed"] is None
