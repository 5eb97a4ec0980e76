"""`crashcap run --record` over trainings whose DataLoader fails to give the next batch: the crash is
the loading's, after the last step, with the batch's indices; a replay loads that batch again as the
loader does and names its samples that fail (a sample that raises, one of another shape that the
collate cannot stack with the rest, one that kills its worker)."""

import re
import textwrap

from conftest import PYTHON, crashcap, crashcap_json, only_bundle, verdicts


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
