"""A collate function of the program's may put a batch's samples in another order than the sampler
drew them (sorting them by length to pack sequences): the batch's `index` tensor holds the
sampler's order, so a plain replay loads the samples again, collates each alone and finds the row
that holds each; bisect and triage then name the culprit row's own dataset index. match_rows alone
over the collate functions that keep the order, reorder it, or give rows nothing can be matched to."""

import re
import textwrap

import torch
from conftest import PYTHON, crashcap, crashcap_json, only_bundle, triage_json_and_text, verdicts
from torch.utils.data import DataLoader, Dataset, Subset

from crashcap import _replay


def index_values(bundle, step):
    shown = crashcap_json("show", bundle, f"steps/{step}/batch/index", "--full")
    return [int(v) for v in re.findall(r"-?\d+", shown["text"])]


def test_a_collate_that_sorts_by_length_names_the_culprits_dataset_index_not_the_one_drawn_at_its_row(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
        from torch.utils.data import DataLoader, Dataset

        class Sentences(Dataset):
            def __len__(self):
                return 240
            def __getitem__(self, i):
                g = torch.Generator().manual_seed(i)
                n = 3 + (i * 7) % 11
                tokens = torch.randint(1, 50, (n,), generator=g)
                if i == 211:
                    tokens[1] = 50  # one token id past the vocabulary
                return tokens, i % 2

        def by_length(samples):  # longest first, as pack_padded_sequence(enforce_sorted=True) needs
            samples = sorted(samples, key=lambda s: len(s[0]), reverse=True)
            tokens = [s[0] for s in samples]
            return (pad_sequence(tokens, batch_first=True), torch.tensor([len(t) for t in tokens]),
                    torch.tensor([s[1] for s in samples]))

        class Tagger(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(50, 8)
                self.rnn = torch.nn.LSTM(8, 16, batch_first=True)
                self.out = torch.nn.Linear(16, 2)
            def forward(self, x, lengths):
                _, (h, _) = self.rnn(pack_padded_sequence(self.emb(x), lengths, batch_first=True))
                return self.out(h[-1])

        torch.manual_seed(0)
        model = Tagger()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for epoch in range(2):
            for x, lengths, y in DataLoader(Sentences(), batch_size=12, shuffle=True, collate_fn=by_length):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x, lengths), y).backward()
                opt.step()
    """))
    r = crashcap("run", "--record", "--dir", tmp_path / "runs", "--", PYTHON, "train.py", cwd=tmp_path)
    assert r.returncode != 0 and "IndexError" in r.stderr, r.stderr
    bundle = only_bundle(tmp_path / "runs")
    step = crashcap_json("inspect", bundle)["crash"]["step"]
    drawn = index_values(bundle, step)
    assert 211 in drawn, drawn
    replay = crashcap_json("replay", bundle)
    assert replay["verdict"] == "reproduced-bitwise", replay
    order = replay["row_order"]
    assert order["order"] == "reordered" and order["why"] is None, order
    # The rows hold the drawn samples, longest first: the lengths the dataset gives them.
    assert sorted(order["dataset_indices"]) == sorted(drawn), order
    lengths = [3 + (i * 7) % 11 for i in order["dataset_indices"]]
    assert lengths == sorted(lengths, reverse=True), order
    row = order["dataset_indices"].index(211)
    assert drawn[row] != 211, (drawn, order)  # the sampler drew another sample at the culprit's row
    samples = crashcap_json("bisect", "samples", bundle)
    assert samples["rows"] == [row] and samples["dataset_indices"] == [211], samples
    assert samples["row_order"]["order"] == "reordered", samples
    triage, text = triage_json_and_text(bundle)
    assert verdicts(triage)["invalid-data"] == "confirmed", triage["hypotheses"]
    assert triage["culprit"]["rows"] == [row] and triage["culprit"]["dataset_indices"] == [211], triage["culprit"]
    assert "dataset index 211" in text and "collate function reordered" in text, text
    text = crashcap("replay", bundle).stdout
    assert "the collate function reorders the samples" in text, text
    # The attachment keeps the culprit's row, named by the sample it holds; its replay finds it there.
    packed = crashcap_json("pack", bundle, "-o", tmp_path / "row.ccap", "--rows", "culprit")
    assert packed["rows"] == [row], packed
    assert index_values(tmp_path / "row.ccap", step) == [211]
    again = crashcap_json("replay", tmp_path / "row.ccap")
    assert "IndexError" in again["error"] and again["row_order"]["order"] == "sampler", again


# ---- match_rows alone -----------------------------------------------------------------------------

class Sequences(Dataset):
    """Sample i: a sequence of i % 5 + 1 values i*10.., and its label i % 3; `noise` adds a fresh
    random value to each (a random transform)."""

    def __init__(self, n=30, noise=False):
        self.n, self.noise = n, noise

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.arange(i % 5 + 1, dtype=torch.float32) + 10 * i
        return (x + torch.rand(x.shape) if self.noise else x), i % 3


def padded(samples, order=None):
    """Pads the samples into [B, T] with their lengths and labels, in `order` (a key) when given."""
    if order is not None:
        samples = sorted(samples, key=order)
    xs = [s[0] for s in samples]
    return {"x": torch.nn.utils.rnn.pad_sequence(xs, batch_first=True), "lengths": torch.tensor([len(x) for x in xs]),
            "y": torch.tensor([s[1] for s in samples])}


def by_length(samples):
    return padded(samples, order=lambda s: -len(s[0]))


def recorded(loader, indices):
    """The batch as the recording keeps it: its tensors by name, collated from `indices`."""
    return dict(_replay._batch.flatten(loader.collate_fn([loader.dataset[i] for i in indices]))[0])


def test_match_rows_leaves_default_collate_and_loaders_without_batches_alone():
    data = Sequences()
    assert _replay.match_rows(DataLoader(data, batch_size=4), [0, 1, 2, 3], {}) is None
    assert _replay.match_rows(DataLoader(data, batch_size=None, collate_fn=lambda s: s), [0], {}) is None


def test_match_rows_finds_the_sampler_order_when_the_collate_keeps_it():
    loader = DataLoader(Sequences(), batch_size=6, collate_fn=padded)
    indices = [7, 3, 21, 14, 9, 2]
    assert _replay.match_rows(loader, indices, recorded(loader, indices)) == ("sampler", indices, "")


def test_match_rows_follows_a_collate_that_sorts_the_samples():
    loader = DataLoader(Sequences(), batch_size=6, collate_fn=by_length)
    indices = [5, 3, 21, 14, 9, 2]  # lengths 1, 4, 2, 5, 5, 3: two of length 5
    order, rows, why = _replay.match_rows(loader, indices, recorded(loader, indices))
    assert order == "reordered" and why == "", why
    assert rows == [14, 9, 3, 2, 21, 5], rows


def test_match_rows_matches_a_list_of_each_samples_own_tensors_by_its_items():
    # The samples as they are (sequences of their own lengths, no tensor with a row per sample),
    # kept in order, sorted longest first, or with a label tensor beside them.
    indices = [5, 3, 21, 14, 9, 2]  # lengths 1, 4, 2, 5, 5, 3
    kept = DataLoader(Sequences(), batch_size=6, collate_fn=lambda s: [x for x, _ in s])
    assert _replay.match_rows(kept, indices, recorded(kept, indices)) == ("sampler", indices, "")
    longest = DataLoader(Sequences(), batch_size=6,
                         collate_fn=lambda s: sorted((x for x, _ in s), key=lambda x: -len(x)))
    order, rows, why = _replay.match_rows(longest, indices, recorded(longest, indices))
    assert (order, rows, why) == ("reordered", [14, 9, 3, 2, 21, 5], ""), (order, rows, why)
    # A row matches a sample only where shape and values agree: samples that do not come back the
    # same (a random transform) match no row, and the order stays unchecked.
    noisy = DataLoader(Sequences(noise=True), batch_size=6, collate_fn=lambda s: [x for x, _ in s][::-1])
    order, rows, why = _replay.match_rows(noisy, indices, recorded(noisy, indices))
    assert order == "unchecked" and "no tensor of the batch holds the samples" in why, (order, rows, why)
    # torchvision's tuple(zip(*batch)) of (sequence, label) pairs in a batch of 2: "0/0" and "1/0"
    # are two fields' first items, not one sample's; the sequences "0/0" and "0/1" pair the rows
    # (the labels, both 0, could not).
    for order, expected in ((1, ("sampler", [9, 3], "")), (-1, ("reordered", [3, 9], ""))):
        pairs = DataLoader(Sequences(), batch_size=2,
                           collate_fn=lambda s: tuple(zip(*[(x, torch.tensor(y)) for x, y in s[::order]])))
        assert _replay.match_rows(pairs, [9, 3], recorded(pairs, [9, 3])) == expected


def test_match_rows_leaves_out_a_tensor_of_the_batch_that_no_sample_holds():
    def packed(samples):
        b = by_length(samples)
        b["sorted_indices"] = torch.arange(len(samples)) + 100  # the batch's own: no sample alone has it at any row
        return b

    loader = DataLoader(Sequences(), batch_size=4, collate_fn=packed)
    indices = [0, 4, 8, 2]
    order, rows, _ = _replay.match_rows(loader, indices, recorded(loader, indices))
    assert order == "reordered" and rows == [4, 8, 2, 0], rows


def test_match_rows_loads_the_samples_under_a_subset_as_the_recording_named_them():
    data = Sequences()
    subset = Subset(data, list(range(29, -1, -1)))
    loader = DataLoader(subset, batch_size=4, collate_fn=by_length)
    indices = [12, 4, 23, 9]  # dataset indices: what the recording keeps under a Subset
    batch = recorded(DataLoader(data, batch_size=4, collate_fn=by_length), indices)
    order, rows, _ = _replay.match_rows(loader, indices, batch)
    assert order == "reordered" and rows == [4, 9, 23, 12], rows


def test_match_rows_leaves_out_a_tensor_a_random_transform_changes_and_matches_by_the_rest():
    loader = DataLoader(Sequences(noise=True), batch_size=5, collate_fn=by_length)
    indices = [1, 2, 3, 4, 6]  # (length, label): (2, 1), (3, 2), (4, 0), (5, 1), (2, 0)
    order, rows, why = _replay.match_rows(loader, indices, recorded(loader, indices))
    assert order == "reordered" and rows == [4, 3, 2, 1, 6], (order, rows, why)


def test_match_rows_leaves_the_order_unchecked_when_no_tensor_comes_back_the_same():
    def only_x(samples):
        return by_length(samples)["x"]

    loader = DataLoader(Sequences(noise=True), batch_size=5, collate_fn=only_x)
    indices = [1, 2, 3, 4, 6]
    order, rows, why = _replay.match_rows(loader, indices, recorded(loader, indices))
    assert order == "unchecked" and rows == [] and "random transform" in why, why


def test_match_rows_leaves_the_order_unchecked_when_samples_are_alike():
    class Alike(Sequences):
        def __getitem__(self, i):
            return torch.ones(i % 2 + 1), 0  # two kinds of sample

    loader = DataLoader(Alike(), batch_size=4, collate_fn=lambda s: padded(s, order=lambda x: len(x[0])))
    indices = [1, 2, 3, 4]  # lengths 2, 1, 2, 1: the rows hold 2, 4, 1, 3 or 4, 2, 3, 1
    order, rows, why = _replay.match_rows(loader, indices, recorded(loader, indices))
    assert order == "unchecked" and rows == [] and "rows 0, 1, 2, 3 match several of the samples" in why, why


def test_match_rows_pairs_the_rows_it_can_and_leaves_open_those_alike_samples_share():
    class Labelled(Sequences):
        def __getitem__(self, i):
            return torch.ones(i % 3 + 1), (9 if i == 7 else 0)  # sample 7 alone has its label

    loader = DataLoader(Labelled(), batch_size=5, collate_fn=by_length)
    indices = [3, 7, 2, 4, 6]  # lengths 1, 2, 3, 2, 1: rows hold 2, then 7 and 4 (by label), then 3 and 6
    order, rows, why = _replay.match_rows(loader, indices, recorded(loader, indices))
    assert order == "partial" and rows == [2, 7, 4, -1, -1], (order, rows)
    assert "rows 3, 4 match several of the samples" in why, why


def test_held_samples_pairs_a_row_with_the_sample_only_it_matches():
    # Row 0 matches samples 0 and 1; row 1 only sample 1: so row 0 holds sample 0.
    candidates = torch.tensor([[True, False, False], [True, True, False], [False, False, True]])
    assert _replay._held_samples(candidates) == [0, 1, 2]
    # No pairing: samples 0 and 1 both need row 0.
    assert _replay._held_samples(torch.tensor([[True, False], [True, False]])) is None


def test_match_rows_says_when_loading_the_samples_again_raises():
    class Gone(Sequences):
        def __getitem__(self, i):
            raise FileNotFoundError(f"sample {i}")

    loader = DataLoader(Gone(), batch_size=2, collate_fn=by_length)
    batch = recorded(DataLoader(Sequences(), batch_size=2, collate_fn=by_length), [0, 1])
    order, rows, why = _replay.match_rows(loader, [0, 1], batch)
    assert order == "unchecked" and "FileNotFoundError: sample 0" in why, why


def test_match_rows_compares_nan_with_nan():
    class OneNan(Sequences):
        def __getitem__(self, i):
            x = torch.ones(3)
            if i == 3:
                x[0] = float("nan")
            return x, 0  # only the NaN tells sample 3 from the others

    loader = DataLoader(OneNan(), batch_size=4, collate_fn=lambda s: padded(s[::-1]))
    order, rows, why = _replay.match_rows(loader, [17, 8, 26, 3], recorded(loader, [17, 8, 26, 3]))
    assert (order, rows) == ("partial", [3, -1, -1, -1]), (order, rows, why)


def test_match_rows_does_not_take_the_sampler_order_for_one_that_alike_samples_allow():
    # A random transform changes x, so only the labels are compared; the collate sorts by label,
    # stably, and then reverses each label's run: rows 0 and 1 hold label 0 in the other order.
    def by_label_reversed(samples):
        return padded(sorted(samples[::-1], key=lambda s: s[1]))

    loader = DataLoader(Sequences(noise=True), batch_size=4, collate_fn=by_label_reversed)
    indices = [0, 3, 1, 4]  # labels 0, 0, 1, 1; lengths 1, 4, 2, 5 (the lengths tell them apart)
    order, rows, _ = _replay.match_rows(loader, indices, recorded(loader, indices))
    assert (order, rows) == ("reordered", [3, 0, 4, 1]), (order, rows)

    def labels_only(samples):
        return {"y": by_label_reversed(samples)["y"], "x": by_label_reversed(samples)["x"]}

    class SameLength(Sequences):
        def __getitem__(self, i):
            return torch.rand(2), i % 3

    loader = DataLoader(SameLength(), batch_size=4, collate_fn=labels_only)
    indices = [0, 3, 1, 4]
    order, rows, why = _replay.match_rows(loader, indices, recorded(loader, indices))
    assert order == "unchecked" and "rows 0, 1, 2, 3 match several" in why, (order, rows, why)


def test_match_rows_finds_the_rows_of_a_time_first_batch_as_long_as_it_is_wide():
    def time_first(samples):
        samples = sorted(samples, key=lambda s: -len(s[0]))
        return torch.nn.utils.rnn.pad_sequence([s[0] for s in samples]), torch.tensor([s[1] for s in samples])

    loader = DataLoader(Sequences(), batch_size=5, collate_fn=time_first)
    indices = [5, 9, 12, 0, 23]  # lengths 1, 5, 3, 1, 4: [5, 5] padded, as long as the batch is wide
    batch = recorded(loader, indices)
    assert batch["0"].shape == (5, 5), batch["0"].shape
    order, rows, _ = _replay.match_rows(loader, indices, batch)
    assert (order, rows) == ("reordered", [9, 23, 12, 5, 0]), (order, rows)
