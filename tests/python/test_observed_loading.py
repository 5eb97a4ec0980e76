"""`crashcap run --record` over trainings whose DataLoader fails to give the next batch: the crash is
the loading's, after the last step, with the batch's indices; a replay loads that batch again as the
loader does and names its samples that fail (a sample that raises, one of another shape that the
collate cannot stack with the rest, one that kills its worker); and load_again alone over the ways a
loader fetches a batch (a dataset's __getitems__, a loader without batches, a Subset)."""

import os
import re
import signal
import textwrap

import torch
from conftest import PYTHON, crashcap, crashcap_json, only_bundle, verdicts

from crashcap import _replay


def test_a_dataset_that_raises_in_a_worker_is_a_loading_failure_that_replay_loads_again_and_names_the_sample(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Records(Dataset):
            def __len__(self):
                return 96
            def __getitem__(self, i):
                if i == 37:
                    raise ValueError(f"corrupt record {i}")
                return torch.full((4,), float(i) / 96), i % 3

        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in DataLoader(Records(), batch_size=8, num_workers=2):  # 37 in the fifth batch
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    """))
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode != 0 and "python-exception" in r.stderr, r.stderr
    bundle = only_bundle(tmp_path / "runs")
    crash = crashcap_json("inspect", bundle)["crash"]
    # The step before ran to its end; the batch after it never came, and its indices hold 37.
    assert crash["phase"] == "loading" and crash["error"].endswith("ValueError: corrupt record 37"), crash
    indices = re.search(r"loading the batch after step (\d+), of dataset indices \[([\d, ]+)\]", crash["error"])
    assert indices and int(indices.group(1)) == crash["step"] == 3, crash["error"]
    assert crash["loading_indices"] == crash["loading_dataset_indices"] == list(range(32, 40)), crash
    # The replay runs the recorded steps, then loads that batch again with the program's dataset:
    # the same error, and the one sample that raises alone.
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    # Loaded in a worker, as the loader did: its error comes back as the loader re-raises it.
    assert replay["error"].endswith("ValueError: corrupt record 37") and "worker process" in replay["error"], replay
    load = replay["batch_load"]
    assert load["culprits"] == [{"position": 5, "index": 37, "dataset_index": 37,
                                 "error": "ValueError: corrupt record 37"}], load
    assert load["culprits_by"] == "loaded alone", load
    triage = crashcap_json("triage", bundle)
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    assert triage["culprit"]["dataset_indices"] == [37] and triage["culprit"]["phase"] == "loading", triage["culprit"]
    assert triage["culprit"]["rows"] is None, triage["culprit"]  # step 3's recorded rows are not the batch
    # The recorded batch of step 3 is not the one that failed: its rows are not bisected.
    r = crashcap("bisect", "samples", bundle)
    assert r.returncode != 0 and "the loading of the batch after step 3" in r.stderr, r.stderr


def test_an_iterable_dataset_that_raises_is_a_loading_failure_triage_says_it_could_not_load_again(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, IterableDataset, get_worker_info

        class Stream(IterableDataset):
            def __iter__(self):
                info = get_worker_info()
                for k in range(info.id, 96, info.num_workers):
                    if k == 37:
                        raise ValueError(f"corrupt record {k}")
                    yield torch.full((4,), float(k) / 96), k % 3

        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in DataLoader(Stream(), batch_size=8, num_workers=2):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    """))
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode != 0 and "python-exception" in r.stderr, r.stderr
    bundle = only_bundle(tmp_path / "runs")
    assert crashcap_json("inspect", bundle)["crash"]["phase"] == "loading"
    # No sampler indices to load the batch again by: the replay runs the steps and says so.
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "not-reproduced" and replay["batch_load"] is None, replay
    assert all(s["bitwise"] for s in replay["steps"]), replay["steps"]
    triage = crashcap_json("triage", bundle)
    hypotheses = {h["id"]: h for h in triage["hypotheses"]}
    for name in ("invalid-data", "config-dependent", "nondeterminism"):
        h = hypotheses[name]
        assert h["verdict"] == "inconclusive", h
        assert any("could not load that batch again" in e and "ValueError: corrupt record 37" in e
                   for e in h["evidence"]), h
        assert not any("does not reproduce" in e or "ran clean" in e for e in h["evidence"]), h
    assert hypotheses["loss-numerics"]["verdict"] == "refuted", hypotheses["loss-numerics"]
    # Settings and ops could not bear on a batch that never came: those experiments did not run.
    assert {e["name"] for e in triage["experiments"]} & {"bisect-config", "bisect-ops"} == set(), triage["experiments"]


def test_a_sample_of_another_shape_that_fails_the_collate_of_a_subset_is_named_by_its_dataset_index(tmp_path):
    # Every sample loads, and each collates alone: the batch fails only together, in default_collate,
    # which stacks one tensor of 5 values among tensors of 4. The loader is made anew each epoch over
    # a random_split Subset, and the sample is named by its index in the data under it.
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, Dataset, random_split

        class Features(Dataset):
            def __len__(self):
                return 120
            def __getitem__(self, i):
                return {"x": torch.full((5 if i == 50 else 4,), float(i) / 120), "y": i % 3}

        torch.manual_seed(0)
        train, _ = random_split(Features(), [100, 20], generator=torch.Generator().manual_seed(1))
        with open("split.txt", "w") as f:
            f.write(" ".join(map(str, train.indices)))
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for epoch in range(3):
            for b in DataLoader(train, batch_size=10, shuffle=True, num_workers=2):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(b["x"]), b["y"]).backward()
                opt.step()
        print("trained: sample 50 is not in the training split")
    """))
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode != 0 and "trained:" not in r.stdout, r.stdout + r.stderr
    bundle = only_bundle(tmp_path / "runs")
    crash = crashcap_json("inspect", bundle)["crash"]
    assert crash["phase"] == "loading" and "stack expects each tensor to be equal size" in crash["error"], crash
    # The sampler drew places in the Subset; the crash keeps them and the samples' places under it.
    split = [int(i) for i in (tmp_path / "split.txt").read_text().split()]
    assert [split[i] for i in crash["loading_indices"]] == crash["loading_dataset_indices"], crash
    assert 50 in crash["loading_dataset_indices"], crash
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    load = replay["batch_load"]
    assert [c["dataset_index"] for c in load["culprits"]] == [50], load
    culprit = load["culprits"][0]
    assert crash["loading_dataset_indices"][culprit["position"]] == 50, load
    assert crash["loading_indices"][culprit["position"]] == culprit["index"] == split.index(50), load
    assert load["culprits_by"] == "collated with the rest", load
    assert "stack expects each tensor to be equal size" in load["culprits"][0]["error"], load
    triage = crashcap_json("triage", bundle)
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    assert triage["culprit"]["dataset_indices"] == [50], triage["culprit"]


def test_a_sample_that_kills_its_worker_is_found_in_the_awaited_batch_or_those_the_workers_drew_ahead(tmp_path):
    # A crash in native decoding kills the worker loading sample 377; the loop was awaiting an earlier
    # batch, perhaps, since workers load ahead: every batch in flight is kept, and the replay loads
    # each of their samples in a worker of its own (one that dies would take the replay down).
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import os, signal, time, torch
        from torch.utils.data import DataLoader, Dataset

        class Decoded(Dataset):
            def __len__(self):
                return 400
            def __getitem__(self, i):
                if i == 377:
                    os.kill(os.getpid(), signal.SIGSEGV)
                time.sleep(0.001)  # decoding takes time: the loop waits in the loader, where a worker's death is seen
                return torch.full((6,), i / 400.0), torch.tensor([i / 200.0])

        model = torch.nn.Linear(6, 1)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for x, y in DataLoader(Decoded(), batch_size=32, num_workers=2):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    """))
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode != 0, r.stderr
    bundle = only_bundle(tmp_path / "runs")
    crash = crashcap_json("inspect", bundle)["crash"]
    assert crash["phase"] == "loading" and "Segmentation fault" in crash["error"], crash
    assert 377 in crash["loading_dataset_indices"], crash
    # No shuffle: each batch holds 32 consecutive indices, the awaited one first, then those drawn ahead.
    awaited = crash["loading_indices"][:32]
    assert awaited == list(range(awaited[0], awaited[0] + 32)), crash
    if 377 not in awaited:
        assert "batches its workers drew ahead" in crash["error"], crash["error"]
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] in ("reproduced", "reproduced-bitwise"), replay  # a pid in the error text
    load = replay["batch_load"]
    assert [c["dataset_index"] for c in load["culprits"]] == [377] and load["culprits_by"] == "loaded alone", load


def test_a_worker_that_dies_while_the_loop_runs_a_step_is_the_loading_s_failure_not_the_step_s(tmp_path):
    # The loop is in step 8 (a slow step: a checkpoint, a validation pass) when the worker loading
    # sample 377 dies; the DataLoader's SIGCHLD handler raises its death there, in the step. The
    # step did not fail: the crash is the loading's, with the batches the workers were loading.
    # Files order the two processes: the worker dies only once the loop is in step 8, and the step
    # goes on until the worker has ended (in a replay, the worker is long gone).
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import os, signal, time, torch
        from torch.utils.data import DataLoader, Dataset

        class Decoded(Dataset):
            def __len__(self):
                return 400
            def __getitem__(self, i):
                if i == 377:
                    while not os.path.exists("in_step"):
                        time.sleep(0.01)
                    with open("dying.part", "w") as f:
                        f.write(str(os.getpid()))
                    os.rename("dying.part", "dying")  # whole, as the loop reads it
                    os.kill(os.getpid(), signal.SIGSEGV)
                return torch.full((6,), i / 400.0), torch.tensor([i / 200.0])

        def ended(pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
            except OSError:
                return True

        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
        for i, (x, y) in enumerate(DataLoader(Decoded(), batch_size=32, num_workers=2)):
            opt.zero_grad()
            loss = torch.nn.functional.smooth_l1_loss(model(x), y)
            if i == 8:
                open("in_step", "w").close()
                deadline = time.monotonic() + 120
                while not os.path.exists("dying"):
                    if time.monotonic() > deadline:
                        raise SystemExit("no worker came to sample 377 while step 8 waited")
                    time.sleep(0.01)
                pid, deadline = int(open("dying").read()), time.monotonic() + 120
                while not ended(pid) and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(0.2)
            loss.backward()
            opt.step()
        print("trained")
    """))
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode != 0 and "trained" not in r.stdout, r.stdout + r.stderr
    assert "signal_handling.py" in r.stderr, r.stderr  # raised by the loader's SIGCHLD handler, in the step
    crash = crashcap_json("inspect", only_bundle(tmp_path / "runs"))["crash"]
    assert crash["phase"] == "loading" and crash["step"] == 8, crash
    assert "Segmentation fault" in crash["error"] and "died while step 8 ran" in crash["error"], crash["error"]
    # No shuffle: the batches drawn ahead and not yet given to the loop, from batch 9 (index 288) on.
    drawn = crash["loading_dataset_indices"]
    assert drawn == crash["loading_indices"] == list(range(288, 288 + len(drawn))) and 377 in drawn, crash
    replay = crashcap_json("replay", only_bundle(tmp_path / "runs"))
    assert replay["verdict"] in ("reproduced", "reproduced-bitwise"), replay
    load = replay["batch_load"]
    assert [c["dataset_index"] for c in load["culprits"]] == [377] and load["culprits_by"] == "loaded alone", load
    assert "Segmentation fault" in load["error"] and "Segmentation fault" in load["culprits"][0]["error"], load


# ---- load_again alone: the loader's own ways of fetching a batch, without a recording ----------

class _Samples(torch.utils.data.Dataset):
    """96 samples of 4 values; `bad` raise, `odd` have 3 values (the collate cannot stack them)."""

    def __init__(self, bad=(), odd=(), kill=()):
        self.bad, self.odd, self.kill = set(bad), set(odd), set(kill)

    def __len__(self):
        return 96

    def __getitem__(self, i):
        if i in self.bad:
            raise ValueError(f"corrupt record {i}")
        if i in self.kill:
            os.kill(os.getpid(), signal.SIGSEGV)
        return torch.full((3 if i in self.odd else 4,), float(i)), i % 3


class _Batched(_Samples):
    """A dataset that fetches a batch in one call, as the loader asks it to when it can."""

    def __init__(self, **faults):
        super().__init__(**faults)
        self.calls = 0

    def __getitem__(self, i):
        raise AssertionError("the loader's fetcher calls __getitems__ when the dataset has one")

    def __getitems__(self, indices):
        self.calls += 1
        return [_Samples.__getitem__(self, i) for i in indices]


def test_a_crash_while_the_program_iterates_another_loader_names_that_loader_s_samples(tmp_path):
    # A validation pass over a Subset of the data after each epoch, under no_grad: its loader's
    # batches are no step's. Sample 237 (the Subset's 37th) has a label beyond the 4 classes, or
    # raises in the validation loader's worker; or the validation ends and the checkpoint fails; or
    # the training draws a second loader's batch in each step (zip) and the step fails.
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import sys
        import torch
        from torch.utils.data import DataLoader, Dataset, Subset

        class Data(Dataset):
            def __len__(self):
                return 320
            def __getitem__(self, i):
                if i == 237 and sys.argv[1] == "raise":
                    raise ValueError(f"corrupt record {i}")
                return torch.full((8,), i / 320), 9 if i == 237 and sys.argv[1] == "label" else i % 4

        data = Data()
        train = DataLoader(Subset(data, range(200)), batch_size=20, shuffle=True, num_workers=2)
        val = DataLoader(Subset(data, range(200, 320)), batch_size=16, num_workers=1)
        model = torch.nn.Linear(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        unlabelled = DataLoader(Subset(data, range(200)), batch_size=20)  # as many batches as the training's
        for epoch in range(2):
            for k, ((x, y), (u, _)) in enumerate(zip(train, unlabelled)):
                opt.zero_grad()
                if sys.argv[1] == "zip" and k == 3:
                    raise RuntimeError("the consistency loss failed")
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            with torch.no_grad():
                total = sum(torch.nn.functional.cross_entropy(model(x), y).item() for x, y in val)
            if sys.argv[1] == "checkpoint":
                raise OSError("no space left for the checkpoint")
    """))

    def crash_of(case, phase="between-steps", step=9):  # between steps: after the epoch's 10 steps
        runs = tmp_path / f"runs-{case}"
        r = crashcap("run", "--record", "--dir", runs, "--", PYTHON, "train.py", case, cwd=tmp_path)
        assert r.returncode != 0, r.stderr
        crash = crashcap_json("inspect", only_bundle(runs))["crash"]
        assert crash["phase"] == phase and crash["step"] == step, crash
        return crash

    crash = crash_of("label")
    assert crash["error"].endswith("IndexError: Target 9 is out of bounds."), crash
    # The batch of the data's 232..247 (the Subset's third), which the validation had taken last.
    assert ("the last batch the program took before the crash came from DataLoader #1 (not the training's #0), of "
            f"dataset indices {list(range(232, 248))}, and that loader's iteration had not run to its end"
            in crash["error"]), crash["error"]
    # That batch itself is in the bundle, and triage judges its rows: row 5, sample 237, holds the
    # target the error names, outside the loss's 4 classes.
    bundle = only_bundle(tmp_path / "runs-label")
    assert crash["other_batch"] == {"loader": 1, "tensors": ["crash/batch/0", "crash/batch/1", "crash/batch/index"]}, crash
    assert [int(v) for v in re.findall(r"-?\d+", crashcap_json("show", bundle, "crash/batch/index")["text"])] == \
        list(range(232, 248))
    triage = crashcap_json("triage", bundle)
    invalid = next(h for h in triage["hypotheses"] if h["id"] == "invalid-data")
    assert invalid["verdict"] == "confirmed", invalid
    assert any("row 5 of crash/batch/1 is 9, outside 0..3: the error says target 9 is out of bounds" in e
               and e.endswith("; dataset index 237") for e in invalid["evidence"]), invalid
    assert (triage["culprit"]["loader"], triage["culprit"]["rows"], triage["culprit"]["dataset_indices"]) == (1, [5], [237])
    crash = crash_of("raise")
    assert crash["error"].endswith("ValueError: corrupt record 237"), crash
    assert crash["other_batch"] is None, crash  # a batch that failed to load is no batch
    assert (f"DataLoader #1 (not the training's #0) raised it while loading its batch of dataset indices "
            f"{list(range(232, 248))}; a replay" in crash["error"]), crash["error"]
    # The validation ran to its end: the checkpoint's error is not put on its samples.
    crash = crash_of("checkpoint")
    assert crash["error"].endswith("OSError: no space left for the checkpoint") and "DataLoader #1" not in crash["error"], crash
    assert crash["other_batch"] is None, crash  # let go of when the validation's iteration ended
    # The second loader's batch is part of the step that failed: not a loop the replay leaves out.
    crash = crash_of("zip", phase="forward", step=3)
    assert crash["error"].endswith("RuntimeError: the consistency loss failed") and "DataLoader #1" not in crash["error"], crash
    assert crash["other_batch"] is None, crash


def test_a_token_past_the_vocabulary_in_a_validation_batch_is_named_though_the_embedding_left_the_op_ring(tmp_path):
    # A recurrent language model: its backward and what runs after it push the step's embedding out
    # of the op ring, which keeps the last calls of the ops with an index domain beside it. The
    # held-out text's sample 57 has token 130 of a vocabulary of 100; its batch of 25 is no step's
    # (the steps' batches are 32), and the embedding takes each sequence but its last token.
    (tmp_path / "lm.py").write_text(textwrap.dedent("""
        import torch, torch.nn as nn, torch.nn.functional as F
        from torch.utils.data import DataLoader

        V = 100
        g = torch.Generator().manual_seed(1)
        text, held = torch.randint(0, V, (256, 17), generator=g), torch.randint(0, V, (100, 17), generator=g)
        held[57, 9] = 130
        emb, rnn, out = nn.Embedding(V, 16), nn.GRU(16, 32, batch_first=True), nn.Linear(32, V)
        params = [*emb.parameters(), *rnn.parameters(), *out.parameters()]
        opt = torch.optim.Adam(params, lr=1e-3)
        def logits(t):
            return out(rnn(emb(t[:, :-1]))[0])
        for t in DataLoader(text, batch_size=32, shuffle=True):
            loss = F.cross_entropy(logits(t).reshape(-1, V), t[:, 1:].reshape(-1))
            opt.zero_grad(); loss.backward(); opt.step()
        with torch.no_grad():
            for t in DataLoader(held, batch_size=25):
                F.cross_entropy(logits(t).reshape(-1, V), t[:, 1:].reshape(-1))
    """))
    runs = tmp_path / "runs"
    r = crashcap("run", "--record", "--dir", runs, "--", PYTHON, "lm.py", cwd=tmp_path)
    assert r.returncode != 0 and "index out of range in self" in r.stderr, r.stderr
    bundle = only_bundle(runs)
    story = crashcap_json("inspect", bundle, "--ops", 1000)
    assert (story["crash"]["phase"], story["crash"]["other_batch"]["loader"]) == ("between-steps", 1), story["crash"]
    assert not any(op["name"] == "aten::embedding" for op in story["last_ops"]), "the ring still holds the embedding"
    triage = crashcap_json("triage", bundle)
    invalid = next(h for h in triage["hypotheses"] if h["id"] == "invalid-data")
    assert invalid["verdict"] == "confirmed", invalid
    assert any("row 7 of crash/batch/batch holds 130, outside 0..99: the embedding (aten::embedding) has 100 rows" in e
               and e.endswith("; dataset index 57") for e in invalid["evidence"]), invalid
    assert (triage["culprit"]["loader"], triage["culprit"]["rows"], triage["culprit"]["dataset_indices"]) == (1, [7], [57])


def test_load_again_fetches_through_getitems_and_names_the_sample_that_raises_in_it():
    dataset = _Batched(bad=[21])
    loader = torch.utils.data.DataLoader(dataset, batch_size=8)
    indices = list(range(16, 24))
    error, culprits, by = _replay.load_again(loader, indices, indices)
    assert "corrupt record 21" in error
    assert culprits == [(5, "ValueError: corrupt record 21")] and by == "loaded alone", culprits
    assert dataset.calls == 1 + len(indices)  # the batch, then each sample alone
    assert _replay.load_again(loader, indices, indices, search=False) == (error, [], "")
    assert _replay.load_again(loader, list(range(8)), list(range(8))) == ("", [], "")


def test_load_again_of_a_loader_without_batches_loads_each_sample_as_its_own_in_a_worker():
    # batch_size=None: the sampler draws one index a "batch", and the collate function converts the
    # sample alone; the recording keeps the indices drawn ahead of the one that failed.
    loader = torch.utils.data.DataLoader(_Samples(bad=[40]), batch_size=None, num_workers=2)
    indices = [38, 39, 40, 41]
    error, culprits, by = _replay.load_again(loader, indices, indices)
    assert "corrupt record 40" in error, error
    assert culprits == [(2, "ValueError: corrupt record 40")] and by == "loaded alone", culprits


def test_load_again_names_a_sample_the_rest_collate_without_and_one_that_kills_its_worker():
    odd = torch.utils.data.DataLoader(_Samples(odd=[9]), batch_size=4)
    error, culprits, by = _replay.load_again(odd, [8, 9, 10, 11], [8, 9, 10, 11])
    assert "stack expects each tensor to be equal size" in error, error
    assert [c[0] for c in culprits] == [1] and by == "collated with the rest", culprits
    killed = torch.utils.data.DataLoader(_Samples(kill=[13]), batch_size=4, num_workers=2)
    error, culprits, by = _replay.load_again(killed, [12, 13, 14, 15], [12, 13, 14, 15])
    assert _replay.worker_died(RuntimeError(error)), error
    assert [c[0] for c in culprits] == [1] and by == "loaded alone", culprits  # the others load after it
    # How the worker ended, in the loader's words, whichever words it raised the death in.
    assert "Segmentation fault" in error and "Segmentation fault" in culprits[0][1], (error, culprits)


def test_load_again_indexes_the_data_under_a_subset_as_the_recording_mapped_it():
    data = _Samples(bad=[70])
    split = torch.utils.data.Subset(data, list(range(60, 96)))
    loader = torch.utils.data.DataLoader(split, batch_size=4)
    # The recording drew 8..11 of the split, the samples 68..71 of the data.
    error, culprits, by = _replay.load_again(loader, [8, 9, 10, 11], [68, 69, 70, 71])
    assert culprits == [(2, "ValueError: corrupt record 70")], (error, culprits)
    # A loader made anew over another split: the recorded data indices are taken in the data itself.
    other = torch.utils.data.DataLoader(torch.utils.data.Subset(data, list(range(0, 36))), batch_size=4)
    error, culprits, by = _replay.load_again(other, [8, 9, 10, 11], [68, 69, 70, 71])
    assert culprits == [(2, "ValueError: corrupt record 70")], (error, culprits)
