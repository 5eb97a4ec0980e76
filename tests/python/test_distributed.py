"""Multi-process jobs: every rank's recording says which rank of which job it is."""

import glob
import json
import os
import signal
import time

import pytest
from torch.utils.data import DistributedSampler

from conftest import PYTHON, TRAININGS, crashcap, crashcap_json, python_stack_on_signal

DDP = os.path.join(TRAININGS, "ddp_gloo.py")
SPAWN = os.path.join(TRAININGS, "ddp_spawn.py")
# torchrun over 2 ranks. torch 1.13's torchrun cannot parse its own default `--redirects 0` on
# Python 3.11 (IntFlag iteration there skips the zero member); any other value works.
TORCHRUN = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", 2, "--redirects", 2, "--tee", 2]


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


def _last_step_held(bundle):
    """The last step a bundle holds; -1 when none of its steps' records reached the disk."""
    steps = crashcap_json("inspect", bundle)["steps"]
    return steps["last"] if steps["count"] else -1


def _replay_of_the_sigkilled_rank(bundle, held):
    """The job's replay from the SIGKILLed rank's bundle, whose last step is `held`, or None when
    SIGKILL took every step's records before the writer had them on disk (held < 0: then replay
    refuses, and says why)."""
    if held < 0:
        r = crashcap("replay", bundle)
        assert r.returncode != 0 and "holds no recorded steps" in r.stderr, r.stdout + r.stderr
        return None
    return crashcap_json("replay", bundle)


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
    # The stopped rank's recorder drained its queue: steps 0..3 all began in its bundle. SIGKILL
    # takes the killed rank's queue with it (its writer runs a few ms behind, more on a loaded
    # machine), so each step it began before step 3 is in its bundle or named, by the seal, as
    # never having reached the disk.
    assert hung["steps"]["first"] == 0 and hung["steps"]["count"] >= 4, hung["steps"]
    held = killed["steps"]["last"] if killed["steps"]["count"] else -1
    assert killed["steps"]["count"] == held + 1 and held <= 3, killed["steps"]
    if held < 3:
        gap = ("no step's records reached the disk" if held < 0 else
               "the records of step 3 never reached the disk" if held == 2 else
               f"the records of steps {held + 1}..3 never reached the disk")
        assert any(w.startswith("the process was in step 3 (") and w.endswith(gap) for w in killed["warnings"]), killed
        # Named lost (four steps begun, the last step 3: steps 0..3), once a keyframe is held
        # (without one nothing can be replayed, and nothing is named).
        assert killed["steps"]["lost"] == (list(range(held + 1, 4)) if killed["keyframes"] else []), killed
    assert stories[0]["distributed"]["job_id"] == stories[1]["distributed"]["job_id"]
    # The stopped rank's own recorder wrote where SIGTERM found it: its step, its last collectives.
    assert hung["supervision"]["signal_name"] == "SIGTERM" and hung["supervision"]["stopped"] is True
    assert hung["crash"]["source"] == "recorder" and hung["crash"]["signal_name"] == "SIGTERM"
    assert hung["collectives"] and all(c["name"].startswith("gloo:") for c in hung["collectives"])
    assert hung["collectives"][-1]["seq"] == hung["op_trace"]["total_collectives"] - 1
    assert all(c["ended"] for c in hung["collectives"])  # it hung before its next collective, not in one

    # One story across the ranks: the directory.
    job_dir = tmp_path / "runs"
    story = crashcap_json("inspect", job_dir)
    assert len(story["jobs"]) == 1 and story["not_in_a_job"] == [], story
    job = story["jobs"][0]
    assert job["job_id"] == stories[0]["distributed"]["job_id"] and job["world_size"] == 2 and job["backend"] == "gloo"
    assert job["first_failed"] == 1 and job["missing"] == [] and job["healthy"] == []
    ranks = {r["rank"]: r for r in job["ranks"]}
    assert ranks[1]["failed_first"] and ranks[1]["outcome"] == "failed" and ranks[1]["how"] == "killed by SIGKILL"
    assert ranks[1]["step"] == 3 and ranks[1]["op_trace"] is False  # nothing in a SIGKILLed process writes
    assert ranks[0]["outcome"] == "stopped" and ranks[0]["step"] == 3
    assert ranks[0]["last_collective"]["seq"] == hung["collectives"][-1]["seq"]
    assert ranks[0]["last_collective"]["name"] == hung["collectives"][-1]["name"]
    assert ranks[0]["seconds_after_first"] > 0
    assert job["headline"].startswith("rank 1 failed first: killed by SIGKILL at step 3"), job["headline"]
    assert "rank 0 was stopped at step 3" in job["headline"], job["headline"]
    text = crashcap("inspect", job_dir, check=True).stdout
    assert "FIRST      rank 1 killed by SIGKILL at step 3" in text, text
    assert f"its last collective #{hung['collectives'][-1]['seq']} gloo:" in text, text
    # Where the stopped rank was: its Python line, from the stack SIGTERM's handler wrote (the sleep
    # it hangs in); the SIGKILLed rank wrote none.
    line = next(i for i, t in enumerate(open(DDP).read().splitlines(), 1) if "time.sleep(3600)" in t)
    assert ranks[1]["python_line"] is None, ranks[1]
    if python_stack_on_signal():
        assert ranks[0]["python_line"] == f'File "{DDP}", line {line}, in main', ranks[0]
        assert f"in Python at {ranks[0]['python_line']}" in text, text

    # The job replayed: rank 1 kills itself again at step 3 and rank 0 hangs again, stopped 30 s
    # later as crashcap run stopped it -- unless SIGKILL beat rank 1's writer to step 3's batch, and
    # the replay ends at the last step its bundle holds, bit for bit. With none held (a writer
    # three steps behind), there is nothing to replay, and replay says so.
    replay = _replay_of_the_sigkilled_rank(ranks[1]["bundle"], held)
    if replay is None:
        return
    verdicts = {r["rank"]: r["verdict"] for r in replay["ranks"]}
    if replay["step"] == 3:
        assert verdicts == {0: "reproduced", 1: "reproduced"}, replay["ranks"]
        assert "as in the recording (where crashcap run stopped it in step 3): stopped again in step 3" in \
            replay["ranks"][0]["error"], replay["ranks"][0]
        assert replay["ranks"][0]["stopped_in_step"] == 3 and replay["ranks"][1]["died_in_step"] == 3, replay["ranks"]
        assert "killed by SIGKILL again" in replay["ranks"][1]["error"]
    else:
        assert replay["step"] == held and "rank 1 was in step 3" in replay["notes"][0], replay
        assert set(verdicts.values()) == {"reproduced-bitwise"}, verdicts
    if replay["step"] == 3:
        # With --timeout shorter than the 30 s wait: rank 0 is stopped at the timeout, after rank 1
        # ended, and that is still the recorded hang.
        bounded = crashcap_json("replay", ranks[1]["bundle"], "--timeout", 15)
        assert {r["rank"]: r["verdict"] for r in bounded["ranks"]} == {0: "reproduced", 1: "reproduced"}, bounded
        assert "had not ended when the replay's --timeout of 15 s came" in bounded["ranks"][0]["error"], bounded
        assert bounded["ranks"][0]["stopped_in_step"] == 3, bounded
        # Bisecting the hung rank's steps: the step it was stopped in is the failing one, and one more
        # replay, to the step before, gives the steps that ran (no search over earlier targets, each
        # replay of which would wait out the hang).
        steps = crashcap_json("bisect", "steps", ranks[0]["bundle"])
        assert steps["first_failing_step"] == 3 and steps["reason"] == "error", steps
        assert steps["replays"] == 2, steps
        assert [s["step"] for s in steps["steps"]] == list(range(steps["from_keyframe"], 4)), steps
        text = crashcap("bisect", "steps", ranks[0]["bundle"], check=True).stdout
        assert "first failing step: 3 (its replay hung again and was stopped in it, as in the recording)" in text, text


def test_a_job_replay_none_of_whose_ranks_ends_is_stopped_at_the_timeout_and_each_rank_says_so(tmp_path):
    r, stories, _ = _job(tmp_path, "--fail-rank", 1, "--fail-how", "raise", "--fail-step", 3)
    assert r.returncode != 0 and sorted(stories) == [0, 1], r.stderr
    bundle = {r["rank"]: r["bundle"] for r in crashcap_json("inspect", tmp_path / "runs")["jobs"][0]["ranks"]}[1]
    # In the replay every rank sleeps at step 1 before its collective (the training's
    # DDP_TEST_HANG_AT_STEP), so no rank ends: without --timeout only Gloo's 30-minute timeout would.
    started = time.monotonic()
    r = crashcap("replay", bundle, "--json", "--timeout", 15, env={"DDP_TEST_HANG_AT_STEP": "1"},
                 timeout=300)
    seconds = time.monotonic() - started
    assert 15 <= seconds < 120, seconds
    hung = json.loads(r.stdout)
    assert [h["rank"] for h in hung["ranks"]] == [0, 1], hung
    for h in hung["ranks"]:
        assert h["replay"] is None and h["verdict"] is None, h
        assert h["error"].startswith(f"rank {h['rank']} had not ended 15 s after the job's replay began, and was "
                                     f"stopped in step 1 (--timeout): no rank ended"), h["error"]
        assert h["stopped_in_step"] == 1 and h["died_in_step"] is None, h
    r = crashcap("replay", bundle, "--timeout", -1)
    assert r.returncode != 0 and "--timeout" in r.stderr, r.stderr


@pytest.mark.parametrize("nproc", [2, 4])
def test_a_nan_sample_on_one_rank_is_the_story_s_first_failure_reaches_the_others_by_all_reduce_replays_and_is_triaged(tmp_path, nproc):
    bad = nproc - 1 if nproc == 2 else 2
    r = crashcap("run", "--record", "--nproc", nproc, "--hang-timeout", 30, "--dir", tmp_path / "runs", "--", PYTHON, DDP,
                 "--steps", 6, "--fail-rank", bad, "--fail-how", "nan", "--fail-step", 3, cwd=tmp_path, timeout=600)
    assert r.returncode != 0, r.stdout + r.stderr
    job = crashcap_json("inspect", tmp_path / "runs")["jobs"]
    assert len(job) == 1, job
    job = job[0]
    ranks = {r["rank"]: r for r in job["ranks"]}
    assert sorted(ranks) == list(range(nproc)) and job["missing"] == []
    # The bad rank's loss went non-finite; the others' gradients did, through the all-reduce of step 3.
    assert job["first_failed"] == bad, job["headline"]
    assert ranks[bad]["classification"] == "nonfinite-loss" and ranks[bad]["step"] == 3 and not ranks[bad]["from_peer"]
    assert ranks[bad]["error"].startswith("non-finite loss at step 3")
    for rank in set(range(nproc)) - {bad}:
        assert ranks[rank]["from_peer"] and ranks[rank]["step"] == 3, ranks[rank]
        assert ranks[rank]["error"].startswith("non-finite gradient norm at step 3")
    # Every rank issued the same collectives in the same order: the last is one and the same.
    last = {r["last_collective"]["seq"] for r in ranks.values()}
    assert len(last) == 1 and {r["last_collective"]["name"] for r in ranks.values()} == {"gloo:all_reduce"}
    assert all(r["last_collective"]["step"] == 3 for r in ranks.values())
    assert job["headline"].startswith(f"rank {bad} failed first: stopped by crashcap for a non-finite value at step 3")
    # The job replayed: its ranks together, each from its own batches, in lockstep through the
    # all-reduces, bit for bit; the bad rank's first op with a NaN output is named.
    replay = crashcap_json("replay", ranks[bad]["bundle"])
    assert replay["job_id"] == job["job_id"] and replay["world_size"] == nproc and replay["step"] == 3
    assert replay["keyframe"] == 0
    assert [r["rank"] for r in replay["ranks"]] == list(range(nproc))
    for r in replay["ranks"]:
        assert r["error"] is None and r["replay"]["verdict"] == "reproduced-bitwise", r
        assert [s["step"] for s in r["replay"]["steps"]] == [0, 1, 2, 3]
    # The gradient norm is the all-reduced one: equal on every rank, and NaN on all at step 3.
    norms = {json.dumps([s["grad_norm"] for s in r["replay"]["steps"]]) for r in replay["ranks"]}
    assert len(norms) == 1, norms
    assert replay["ranks"][bad]["replay"]["first_nonfinite_op"]["name"] == "aten::addmm"
    text = crashcap("replay", ranks[bad]["bundle"], check=True).stdout
    assert f"its {nproc} ranks replayed together" in text and text.count("reproduced-bitwise") >= nproc, text
    # Triage runs on the job: every experiment replays all the ranks, cutting the bad rank's rows.
    # Asked of a rank that failed only through the all-reduce, it triages the rank that failed first.
    asked = 0
    triage = crashcap_json("triage", ranks[asked]["bundle"])
    assert triage["job"]["rank"] == bad and triage["job"]["asked_rank"] == asked, triage["job"]
    assert triage["job"]["first_failed"] == bad and len(triage["job"]["ranks"]) == nproc
    assert triage["bundle"] == ranks[bad]["bundle"] and triage["reproduced"], triage
    hypotheses = {h["id"]: h for h in triage["hypotheses"]}
    assert hypotheses["invalid-data"]["verdict"] == "confirmed", hypotheses["invalid-data"]
    # Row 5 of the bad rank's batch at step 3, and the dataset index its DistributedSampler gave it.
    expected_index = list(DistributedSampler(range(256), num_replicas=nproc, rank=bad, shuffle=True, seed=1))[3 * 16 + 5]
    culprit = triage["culprit"]
    assert culprit["rank"] == bad and culprit["step"] == 3 and culprit["rows"] == [5], culprit
    assert culprit["dataset_indices"] == [expected_index], culprit
    assert any(f"rank {bad}'s batch row [5] alone" in e for e in hypotheses["invalid-data"]["evidence"]), hypotheses
    assert any("NaN" in e for e in hypotheses["invalid-data"]["evidence"]), hypotheses
    # Without row 5 the whole job runs clean at step 3.
    without = [e for e in triage["experiments"] if e["name"] == "without-rows"]
    assert len(without) == 1 and f"--rows {','.join(str(r) for r in range(16) if r != 5)}" in without[0]["command"]
    # bisect samples of a rank that failed through a peer is refused, naming the rank to bisect.
    r = crashcap("bisect", "samples", ranks[asked]["bundle"])
    assert r.returncode != 0 and f"rank {bad} failed first" in r.stderr, r.stderr
    assert f"crashcap bisect samples {ranks[bad]['bundle']}" in r.stderr, r.stderr
    # bisect ops has no float64 reference for a DDP job, and says why.
    r = crashcap("bisect", "ops", ranks[bad]["bundle"])
    assert r.returncode == 2 and "DDP's gradient buckets keep the dtype" in r.stderr, r.stderr
    # Nor a replay in float64: its all-reduce would not reach the gradients (said, not replayed).
    r = crashcap("replay", ranks[bad]["bundle"], "--dtype", "float64")
    assert r.returncode == 2 and "trains a DistributedDataParallel model" in r.stderr, r.stderr
    # One rank packed alone would not replay: said before anything is written.
    r = crashcap("pack", ranks[bad]["bundle"], "-o", tmp_path / "packed.ccap")
    assert r.returncode != 0 and "one rank packed alone would not replay" in r.stderr, r.stderr
    assert "crashcap merge DIR -o JOB.ccap" in r.stderr, r.stderr
    assert not (tmp_path / "packed.ccap").exists()
    if nproc == 2:
        _the_job_travels_in_one_archive(tmp_path, job, bad)


def _the_job_travels_in_one_archive(tmp_path, job, bad):
    """crashcap merge: the job's ranks in one file, which tells the same story and replays bit for
    bit with the directory it came from gone; nothing extracted is left behind."""
    (tmp_path / "attach").mkdir()
    archive = tmp_path / "attach" / "job.ccap"
    merged = crashcap_json("merge", tmp_path / "runs", "-o", archive)
    assert merged["job_id"] == job["job_id"] and merged["first_failed"] == bad and merged["world_size"] == 2
    assert merged["members"][0] == os.path.basename(job["ranks"][bad]["bundle"]), merged
    assert sorted(merged["members"][:2]) == sorted(os.path.basename(r["bundle"]) for r in job["ranks"])
    assert merged["members"][2:] == ["runs.jsonl"] and merged["archive_bytes"] == os.path.getsize(archive)
    assert crashcap("verify", archive).returncode == 0
    os.rename(tmp_path / "runs", tmp_path / "gone")  # the archive alone, as on another machine
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {"TMPDIR": str(scratch)}
    story = json.loads(crashcap("inspect", archive, "--json", env=env, check=True).stdout)
    assert story["archive"] == str(archive) and len(story["jobs"]) == 1, story
    assert story["jobs"][0]["headline"] == job["headline"] and story["jobs"][0]["first_failed"] == bad
    assert {r["bundle"] for r in story["jobs"][0]["ranks"]} == \
        {f"{archive}:{os.path.basename(r['bundle'])}" for r in job["ranks"]}
    replay = json.loads(crashcap("replay", archive, "--json", env=env, check=True).stdout)
    assert replay["job_id"] == job["job_id"] and replay["rank"] == bad and replay["step"] == 3
    assert [r["replay"]["verdict"] for r in replay["ranks"]] == ["reproduced-bitwise"] * 2, replay
    # One rank by its name in the archive, as the commands print it.
    member = f"{archive}:{merged['members'][1]}"
    text = crashcap("inspect", member, env=env, check=True).stdout
    assert f"bundle     {member}" in text and "rank       " in text, text
    assert crashcap("verify", member, env=env).returncode == 0
    # A report written to a file names the archive's members, never the extraction directory.
    report = tmp_path / "attach" / "report.md"
    crashcap("report", archive, "--no-triage", "-o", report, env=env, check=True)
    written = report.read_text()
    assert f"crashcap replay {archive}:" in written and str(scratch) not in written, written
    assert list(scratch.iterdir()) == []  # every extraction removed
    r = crashcap("pack", archive, "-o", tmp_path / "packed.ccap")
    assert r.returncode != 0 and "is a job archive" in r.stderr, r.stderr


def test_a_rank_of_four_sigkilled_at_step_n_is_named_first_and_the_job_replays_to_it(tmp_path):
    started = time.monotonic()
    r = crashcap("run", "--record", "--nproc", 4, "--hang-timeout", 10, "--dir", tmp_path / "runs", "--", PYTHON, DDP,
                 "--steps", 6, "--fail-rank", 1, "--fail-how", "kill", "--fail-step", 3, cwd=tmp_path, timeout=600)
    assert r.returncode == 128 + signal.SIGKILL, r.stdout + r.stderr
    assert time.monotonic() - started < 300
    job = crashcap_json("inspect", tmp_path / "runs")["jobs"][0]
    ranks = {r["rank"]: r for r in job["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3] and job["first_failed"] == 1, job["headline"]
    assert ranks[1]["how"] == "killed by SIGKILL" and ranks[1]["step"] == 3
    # SIGKILL took rank 1's op ring with it; its progress file kept its newest op (step 3's
    # forward) and its last collective (step 2's all-reduce), which the others went past.
    assert ranks[1]["ops_from_progress"] and ranks[1]["op"].startswith("aten::"), ranks[1]
    assert ranks[1]["last_collective"]["name"] == "gloo:all_reduce" and ranks[1]["last_collective"]["step"] == 2
    assert f"last op {ranks[1]['op']}" in job["headline"], job["headline"]
    # The others computed step 3's backward and issued its all-reduce, where they met rank 1's end.
    assert job["furthest_collective"]["seq"] == ranks[1]["last_collective"]["seq"] + 1, job["furthest_collective"]
    assert f"it never issued #{ranks[1]['last_collective']['seq'] + 1}" in ranks[1]["collective_story"], ranks[1]
    for rank in (0, 2, 3):
        # Each ended on its own (Gloo saw rank 1 go) or was stopped, and each says its last collective.
        assert ranks[rank]["outcome"] in ("failed", "stopped") and ranks[rank]["last_collective"], ranks[rank]
        assert ranks[rank]["from_peer"] or ranks[rank]["outcome"] == "stopped", ranks[rank]
    assert job["headline"].startswith("rank 1 failed first: killed by SIGKILL at step 3"), job["headline"]
    held = _last_step_held(ranks[1]["bundle"])
    replay = _replay_of_the_sigkilled_rank(ranks[1]["bundle"], held)
    if replay is None:
        return
    verdicts = {r["rank"]: r["verdict"] for r in replay["ranks"]}
    if replay["step"] == 3:
        # Step 3's batch reached rank 1's bundle: replayed, rank 1 kills itself again.
        assert verdicts[1] == "reproduced" and "killed by SIGKILL again" in replay["ranks"][1]["error"], replay["ranks"][1]
        assert all(v in ("reproduced", "reproduced-bitwise") for v in verdicts.values()), verdicts
    else:
        # SIGKILL came before the recorder's writer had step 3's batch on disk: the replay ends at
        # the last step rank 1's bundle holds, and says why.
        assert replay["step"] == held and "rank 1 was in step 3" in replay["notes"][0], replay
        assert set(verdicts.values()) == {"reproduced-bitwise"}, verdicts
    # The steps before the kill replayed bit for bit on the ranks that answered (a step whose end
    # SIGKILL kept from rank 1's bundle has no fingerprint to compare).
    for r in replay["ranks"]:
        if r["replay"]:
            assert all(s["bitwise"] for s in r["replay"]["steps"] if s["step"] < 3 and s["recorded_loss"] is not None), \
                r["replay"]["steps"]


def test_the_story_of_a_directory_keeps_two_jobs_apart_and_names_a_missing_rank(tmp_path):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    jobs = []
    for n in range(2):
        runs = tmp_path / f"runs{n}"
        crashcap("run", "--record", "--nproc", 2, "--dir", runs, "--", PYTHON, DDP, "--steps", 4, "--fail-rank", n,
                 "--fail-step", 2, cwd=tmp_path, timeout=600)
        bundles = sorted(glob.glob(str(runs / "crash-*.ccap")))
        assert len(bundles) == 2, bundles
        jobs.append(crashcap_json("inspect", bundles[0])["distributed"]["job_id"])
        for b in bundles:
            os.link(b, mixed / os.path.basename(b))
    assert jobs[0] != jobs[1]
    story = crashcap_json("inspect", mixed)
    assert sorted(j["job_id"] for j in story["jobs"]) == sorted(jobs)
    for j in story["jobs"]:
        # Rank n raised in job n: the others' failure came from it.
        n = jobs.index(j["job_id"])
        assert j["first_failed"] == n, j["headline"]
        assert sorted(r["rank"] for r in j["ranks"]) == [0, 1] and j["missing"] == []
    assert "2 jobs in" in crashcap("inspect", mixed, check=True).stdout

    # One rank's bundle gone (and no run log that saw the job): the story says which.
    gone = next(r for j in story["jobs"] if j["job_id"] == jobs[1] for r in j["ranks"] if r["rank"] == 0)
    os.unlink(gone["bundle"])
    job = next(j for j in crashcap_json("inspect", mixed)["jobs"] if j["job_id"] == jobs[1])
    assert job["missing"] == [0] and [r["rank"] for r in job["ranks"]] == [1]
    # The job cannot replay without it, and says which rank is missing.
    r = crashcap("replay", job["ranks"][0]["bundle"], timeout=300)
    assert r.returncode != 0 and "rank 0 (no bundle)" in r.stderr, r.stdout + r.stderr
    # The other job, whole in the mixed directory, replays: two jobs' bundles do not mix.
    other = next(j for j in story["jobs"] if j["job_id"] == jobs[0])
    replay = crashcap_json("replay", other["ranks"][1]["bundle"])
    assert replay["job_id"] == jobs[0]
    # Rank 0 raised on its own, bit for bit as recorded; rank 1's Gloo error names another port.
    assert replay["ranks"][0]["replay"]["verdict"] == "reproduced-bitwise", replay["ranks"][0]
    assert replay["ranks"][1]["replay"]["verdict"] in ("reproduced", "reproduced-bitwise"), replay["ranks"][1]
    assert "rank 0 gives up at step 2" in replay["ranks"][0]["replay"]["error"]
    assert "rank 0     MISSING" in crashcap("inspect", mixed, check=True).stdout

    # A directory without any job, and --trace on a directory, are told apart from a bundle.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no multi-process job in" in crashcap("inspect", empty, check=True).stdout
    r = crashcap("inspect", mixed, "--trace")
    assert r.returncode != 0 and "is a directory" in r.stderr


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


def test_ranks_that_torch_multiprocessing_spawn_starts_record_tell_one_story_replay_bitwise_and_are_triaged(tmp_path):
    # mp.spawn(train, nprocs=2): each rank is a spawned process running the script's function, not
    # a command line; rank 1's batch at step 3 carries a NaN. Each rank's DataLoader worker is a
    # spawned process too, and records nothing.
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, SPAWN, "--nan-step", 3, cwd=tmp_path,
                 timeout=600)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "trained" not in r.stdout  # stopped at the NaN, as a process crashcap started itself would be
    runs = tmp_path / "runs"
    assert f"next      crashcap inspect {runs}   (the job's story, every rank)" in r.stderr, r.stderr
    assert f"crashcap merge {runs} -o job.ccap   (the job in one file, to attach)" in r.stderr, r.stderr
    assert sorted(p.name.split("-")[0] for p in runs.iterdir()) == ["crash", "crash", "runs.jsonl"], list(runs.iterdir())
    job = crashcap_json("inspect", runs)["jobs"]
    assert len(job) == 1, job
    job = job[0]
    ranks = {r["rank"]: r for r in job["ranks"]}
    assert sorted(ranks) == [0, 1] and job["missing"] == [] and job["first_failed"] == 1, job["headline"]
    assert ranks[1]["classification"] == "nonfinite-loss" and ranks[1]["step"] == 3 and not ranks[1]["from_peer"], (ranks, r.stderr)
    assert ranks[0]["from_peer"] and ranks[0]["step"] == 3, ranks[0]
    for rank in ranks.values():
        story = crashcap_json("inspect", rank["bundle"])
        assert story["distributed"]["world_size"] == 2 and story["distributed"]["backend"] == "gloo"
        facts = story["env"]["facts"]
        assert facts["python.launcher"] == "torch.multiprocessing.spawn" and facts["python.spawn"], facts
    # The replay starts each rank's function again as multiprocessing would have, without a parent.
    replay = crashcap_json("replay", ranks[1]["bundle"])
    assert replay["world_size"] == 2 and replay["step"] == 3, replay
    for r in replay["ranks"]:
        assert r["error"] is None and r["replay"]["verdict"] == "reproduced-bitwise", r
        assert [s["step"] for s in r["replay"]["steps"]] == [0, 1, 2, 3]
    assert replay["ranks"][1]["replay"]["first_nonfinite_op"]["name"] == "aten::addmm"
    # Triage names the rank, its row and the row's dataset index.
    triage = crashcap_json("triage", ranks[0]["bundle"])
    hypotheses = {h["id"]: h for h in triage["hypotheses"]}
    assert hypotheses["invalid-data"]["verdict"] == "confirmed", hypotheses["invalid-data"]
    expected_index = list(DistributedSampler(range(256), num_replicas=2, rank=1, shuffle=True, seed=2))[3 * 8 + 5]
    culprit = triage["culprit"]
    assert culprit["rank"] == 1 and culprit["step"] == 3 and culprit["rows"] == [5], culprit
    assert culprit["dataset_indices"] == [expected_index], culprit


def test_a_spawned_rank_that_raises_records_its_own_error_and_its_peer_replays_to_the_same_end(tmp_path):
    # Rank 1 raises in its forward at step 3 (a label cross_entropy refuses). torch's spawn wrapper
    # catches the exception (it hands the traceback to the launcher and exits 1), so the rank's
    # own recording must keep it; rank 0, waiting in the all-reduce, is stopped by the launcher or
    # fails on Gloo's lost connection.
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, SPAWN, "--bad-label-step", 3, cwd=tmp_path,
                 timeout=600)
    assert r.returncode != 0, r.stdout + r.stderr
    # The launcher's last lines are a warning at exit; the evidence is the rank's exception.
    assert "evidence  IndexError: Target 99 is out of bounds." in r.stderr, r.stderr
    job = crashcap_json("inspect", tmp_path / "runs")["jobs"]
    assert len(job) == 1, job
    job = job[0]
    ranks = {r["rank"]: r for r in job["ranks"]}
    assert sorted(ranks) == [0, 1] and job["first_failed"] == 1, job["headline"]
    first = ranks[1]
    assert (first["how"], first["classification"], first["step"], first["phase"]) == ("raised", "exception", 3, "forward"), first
    assert first["error"] == "IndexError: Target 99 is out of bounds." and first["op"] == "aten::cross_entropy_loss", first
    assert os.path.basename(first["bundle"]).startswith("crash-"), first  # its recorder's bundle, not one crashcap run sealed
    assert ranks[0]["step"] == 3 and (ranks[0]["outcome"] == "stopped" or ranks[0]["from_peer"]), ranks[0]
    # Replayed together: rank 1 raises again, bit for bit; rank 0 ends when rank 1 goes, as it did.
    replay = crashcap_json("replay", first["bundle"])
    verdicts = {r["rank"]: r for r in replay["ranks"]}
    assert verdicts[1]["replay"]["verdict"] == "reproduced-bitwise", verdicts[1]
    assert verdicts[1]["replay"]["error"] == "IndexError: Target 99 is out of bounds."
    assert verdicts[1]["replay"]["steps"][-1]["loss"] is None, verdicts[1]  # it raised before it had one
    assert verdicts[0]["replay"]["verdict"] == "reproduced", verdicts[0]
    assert [s["bitwise"] for s in verdicts[0]["replay"]["steps"][:3]] == [True, True, True], verdicts[0]


@pytest.mark.parametrize("args, why", [
    # A multiprocessing queue among mp.spawn's arguments pickles only while multiprocessing spawns.
    (["--report-queue"], "do not pickle outside multiprocessing"),
    # The rank runs with the launcher's command line, which the fact would carry unredacted.
    (["--api-token", "tok-5ecret-4242"], "the launcher's command line had argv[4] withheld as secret"),
])
def test_a_spawned_rank_that_cannot_be_kept_records_and_its_replay_says_why_it_cannot_run(tmp_path, args, why):
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, SPAWN, "--nan-step", 3, *args,
                 cwd=tmp_path, timeout=600)
    assert r.returncode != 0, r.stdout + r.stderr
    bundles = sorted(glob.glob(str(tmp_path / "runs" / "crash-*.ccap")))
    assert len(bundles) == 2, (bundles, r.stderr)
    for bundle in bundles:
        facts = crashcap_json("inspect", bundle)["env"]["facts"]
        assert "python.spawn" not in facts and why in facts["python.spawn.unrecordable"], facts
        with open(bundle, "rb") as f:
            assert b"5ecret" not in f.read()
    r = crashcap("replay", bundles[0])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "was started by torch.multiprocessing.spawn, and its recording could not keep the function it ran" in r.stderr, \
        r.stderr
    assert why in r.stderr and "--nproc N" in r.stderr, r.stderr


@pytest.mark.parametrize("how", ["nan", "kill"])
def test_ranks_that_torchrun_starts_record_tell_one_story_and_replay(tmp_path, how):
    """torchrun starts each rank as a process of its own (not crashcap run --nproc): each records,
    the story names rank 1 first, a SIGKILLed rank by what torchrun reported of its pid, and the
    job replays, the killed rank killed again."""
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", *TORCHRUN, DDP, "--steps", 6, "--fail-rank", 1,
                 "--fail-how", how, "--fail-step", 3, cwd=tmp_path, timeout=600)
    assert r.returncode != 0, r.stdout + r.stderr
    assert len(glob.glob(str(tmp_path / "runs" / "crash-*.ccap"))) == 2, r.stdout + r.stderr
    jobs = crashcap_json("inspect", tmp_path / "runs")["jobs"]
    assert len(jobs) == 1 and jobs[0]["world_size"] == 2 and jobs[0]["missing"] == [], jobs
    job = jobs[0]
    ranks = {r["rank"]: r for r in job["ranks"]}
    assert job["first_failed"] == 1, job["headline"]
    assert ranks[0]["from_peer"] and not ranks[1]["from_peer"], job["headline"]
    if how == "nan":
        assert ranks[1]["classification"] == "nonfinite-loss" and ranks[1]["step"] == 3
        replay = crashcap_json("replay", ranks[1]["bundle"])
        verdicts = {r["rank"]: r for r in replay["ranks"]}
        assert [verdicts[k]["replay"]["verdict"] for k in (0, 1)] == ["reproduced-bitwise"] * 2, replay
    else:
        # The launcher's exit is not the rank's: torchrun's report names the rank's pid and signal.
        assert ranks[1]["how"] == "killed by SIGKILL" and ranks[1]["classification"] == "signal", ranks[1]
        assert ranks[1]["error"].endswith("(the launcher's report)") and "SIGKILL" in ranks[1]["error"], ranks[1]
        assert ranks[1]["step"] == 3 and ranks[1]["ops_from_progress"], ranks[1]
        held = _last_step_held(ranks[1]["bundle"])
        replay = _replay_of_the_sigkilled_rank(ranks[1]["bundle"], held)
        if replay is None:
            return
        verdicts = {r["rank"]: r for r in replay["ranks"]}
        if replay["step"] == 3:  # step 3's batch reached rank 1's bundle: it kills itself again
            assert verdicts[1]["verdict"] == "reproduced" and "killed by SIGKILL again" in verdicts[1]["error"], replay
        else:  # SIGKILL came first: the replay ends at the last step rank 1's bundle holds, and says why
            assert replay["step"] == held and "rank 1 was in step 3" in replay["notes"][0], replay
            assert {v["verdict"] for v in verdicts.values()} == {"reproduced-bitwise"}, replay
