"""Multi-process jobs: every rank's recording says which rank of which job it is."""

import glob
import os
import signal
import time

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


def _job(tmp_path, *args, hang_timeout=5):
    """crashcap run --record --nproc 2 over the DDP training; returns (result, stories by rank, seconds)."""
    started = time.monotonic()
    r = crashcap("run", "--record", "--nproc", 2, "--hang-timeout", hang_timeout, "--grace", 4, "--dir",
                 tmp_path / "runs", "--", PYTHON, DDP, "--steps", 6, *args, cwd=tmp_path, timeout=600)
    seconds = time.monotonic() - started
    bundles = glob.glob(str(tmp_path / "runs" / "crash-*.ccap"))
    stories = {s["distributed"]["rank"]: s for s in (crashcap_json("inspect", b) for b in bundles)}
    assert len(stories) == len(bundles), bundles
    return r, stories, seconds


def test_nproc_starts_the_ranks_and_a_rank_killed_at_step_n_and_a_hung_one_are_both_sealed_in_bounded_time(tmp_path):
    # Rank 1 is SIGKILLed at step 3; rank 0 hangs at step 3 (an hour's sleep before its
    # collective), so nothing would end it but Gloo's collective timeout (30 minutes).
    r, stories, seconds = _job(tmp_path, "--fail-rank", 1, "--fail-how", "kill", "--fail-step", 3, "--hang-rank", 0)
    assert r.returncode == 128 + signal.SIGKILL, r.stdout + r.stderr  # the status of the rank that failed first
    assert "rank 1 (pid" in r.stderr and "failed; the other ranks have 5 s" in r.stderr, r.stderr
    assert "rank 0 (pid" in r.stderr and "has not ended 5 s after rank 1" in r.stderr, r.stderr
    # Bounded: the hang wait (5 s) and the stop (SIGKILL 2 s after SIGTERM) on top of the training's
    # start-up, far from the collective's 30 minutes.
    assert seconds < 300, seconds
    assert sorted(stories) == [0, 1]
    killed, hung = stories[1], stories[0]
    assert killed["supervision"]["signal_name"] == "SIGKILL" and killed["crash"]["step"] == 3
    assert killed["supervision"]["classification"] == "signal"
    assert hung["supervision"]["signal_name"] in ("SIGTERM", "SIGKILL")
    assert hung["crash"]["evidence"].startswith("stopped by crashcap run: rank 1 (pid"), hung["crash"]
    assert hung["crash"]["step"] == 3
    # Each rank's bundle holds its own process's account, not the other's.
    assert killed["supervision"]["pid"] != hung["supervision"]["pid"]
    assert killed["supervision"]["seconds"] < hung["supervision"]["seconds"]
    for rank, s in stories.items():
        assert s["distributed"]["world_size"] == 2 and s["distributed"]["local_rank"] == rank
        assert s["distributed"]["job_id_source"] == "crashcap run"
        assert s["steps"]["count"] >= 3
    assert stories[0]["distributed"]["job_id"] == stories[1]["distributed"]["job_id"]


def test_nproc_a_rank_that_raises_takes_its_peer_down_through_gloo_and_each_keeps_its_own_error(tmp_path):
    r, stories, _ = _job(tmp_path, "--fail-rank", 0, "--fail-how", "raise", "--fail-step", 2, hang_timeout=60)
    assert r.returncode != 0
    assert sorted(stories) == [0, 1], r.stderr
    assert "rank 0 gives up at step 2" in stories[0]["crash"]["error"]
    assert stories[0]["supervision"]["classification"] == "python-exception"
    # Rank 1 ended on its own in its collective (no stop was needed), with Gloo's error, not rank 0's.
    assert "has not ended" not in r.stderr
    assert "rank 0 gives up" not in stories[1]["supervision"]["stderr_tail"]
    assert "(failed first)" in r.stderr and "rank 0 " in r.stderr


def test_nproc_bad_input_is_refused_clearly(tmp_path):
    r = crashcap("run", "--hang-timeout", 5, "--", PYTHON, "-c", "pass", cwd=tmp_path)
    assert r.returncode != 0 and "--nproc" in r.stderr
    r = crashcap("run", "--nproc", 0, "--", PYTHON, "-c", "pass", cwd=tmp_path)
    assert r.returncode != 0 and "nproc" in r.stderr
