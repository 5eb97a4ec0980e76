"""The pieces of a Python training's state the recorder keeps, kept and given back exactly."""

import collections
import dataclasses
import importlib
import json
import random
import sys

import numpy
import pytest
import torch

from crashcap import _batch, _state


def test_a_nested_batch_is_flattened_to_named_tensors_and_rebuilt_with_its_shape():
    x, y, ids = torch.randn(4, 3), torch.arange(4), torch.tensor([7, 8, 9, 10])
    batch = {"inputs": (x, {"ids": ids, "names": ["a", "b"]}), "label": y, 3: [y, None, 1.5]}
    tensors, structure = _batch.flatten(batch)
    names = [n for n, _ in tensors]
    assert names == ["inputs/0", "inputs/1/ids", "label", "3/0"]
    back = _batch.rebuild(structure, dict(tensors))
    assert isinstance(back["inputs"], tuple) and back["inputs"][1]["names"] == ["a", "b"]
    assert back["inputs"][0] is x and back[3][1] is None and back[3][2] == 1.5
    assert list(back) == ["inputs", "label", 3]


def test_a_flat_dict_batch_needs_no_structure_and_a_bare_tensor_is_named_batch():
    tensors, structure = _batch.flatten({"image": torch.zeros(2), "label": torch.ones(2)})
    assert structure == "" and [n for n, _ in tensors] == ["image", "label"]
    tensors, structure = _batch.flatten(torch.zeros(2))
    assert [n for n, _ in tensors] == ["batch"] and torch.equal(_batch.rebuild(structure, dict(tensors)), torch.zeros(2))


def test_keys_that_would_collide_or_break_a_name_get_names_of_their_own():
    tensors, structure = _batch.flatten({"a/b": torch.zeros(1), "a_b": torch.ones(1)})
    assert [n for n, _ in tensors] == ["a_b", "a_b~1"]
    back = _batch.rebuild(structure, dict(tensors))
    assert torch.equal(back["a/b"], torch.zeros(1)) and torch.equal(back["a_b"], torch.ones(1))


Pair = collections.namedtuple("Pair", ["x", "y"])


@dataclasses.dataclass(frozen=True)
class Features:
    x: torch.Tensor
    lengths: torch.Tensor
    source: str = "train"


class Encoding(collections.UserDict):  # the shape of transformers' BatchEncoding
    def __getattr__(self, name):
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name)


class Batch:  # a class of the program's own, its parts as attributes
    def __init__(self, x, y):
        self.x, self.y = x, y


class Rows(list):  # a list subclass: an instance has a __dict__, its parts are its items
    pass


class Slotted:
    __slots__ = ("x",)

    def __init__(self, x):
        self.x = x


def test_batches_of_the_program_s_own_classes_are_rebuilt_as_those_classes():
    x, y = torch.randn(4, 3), torch.arange(4)
    batch = {"pair": Pair(x, y), "features": Features(x, y), "encoding": Encoding(input_ids=y, mask=x),
             "ordered": collections.OrderedDict([("b", y), ("a", x)]), "own": Batch(x, y)}
    tensors, structure = _batch.flatten(batch)
    # A namedtuple's parts are named by its fields, as a dict's by its keys.
    assert [n for n, _ in tensors] == ["pair/x", "pair/y", "features/x", "features/lengths", "encoding/input_ids",
                                       "encoding/mask", "ordered/b", "ordered/a", "own/x", "own/y"]
    assert list(_batch.tensors_of(batch)) == [t for _, t in tensors]
    back = _batch.rebuild(structure, dict(tensors))
    assert type(back["pair"]) is Pair and back["pair"].y is y
    assert type(back["features"]) is Features and back["features"].lengths is y and back["features"].source == "train"
    assert type(back["encoding"]) is Encoding and back["encoding"].input_ids is y
    assert type(back["ordered"]) is collections.OrderedDict and list(back["ordered"]) == ["b", "a"]
    assert type(back["own"]) is Batch and back["own"].x is x
    # A class the replayed program does not have (here: a name no module holds) is the plain
    # container; a root mapping of another class is not the flat dict form.
    assert _batch.rebuild(structure.replace("test_state:Pair", "gone:Pair"), dict(tensors))["pair"] == (x, y)
    tensors, structure = _batch.flatten(collections.OrderedDict([("x", x)]))
    assert structure and type(_batch.rebuild(structure, dict(tensors))) is collections.OrderedDict
    # A subclass of a built-in container keeps its items (as that container), not its empty __dict__.
    tensors, structure = _batch.flatten({"rows": Rows([x, y])})
    assert [n for n, _ in tensors] == ["rows/0", "rows/1"] and list(_batch.tensors_of({"rows": Rows([x, y])})) == [x, y]
    rows = _batch.rebuild(structure, dict(tensors))["rows"]
    assert type(rows) is list and len(rows) == 2 and rows[0] is x and rows[1] is y


def test_a_namedtuple_whose_field_names_would_not_name_its_parts_is_named_by_places():
    # A tuple subclass whose _fields do not match its items (or are not names of parts) is
    # named as a plain tuple: its items' places.
    class Odd(tuple):
        _fields = ("a",)
    tensors, structure = _batch.flatten({"odd": Odd((torch.zeros(1), torch.ones(1)))})
    assert [n for n, _ in tensors] == ["odd/0", "odd/1"] and '"fields"' not in structure
    Slashed = collections.namedtuple("Slashed", ["a", "b"])
    Slashed._fields = ("a/b", "c")
    tensors, structure = _batch.flatten(Slashed(torch.zeros(1), torch.ones(1)))
    assert [n for n, _ in tensors] == ["0", "1"]


def test_what_a_batch_holds_that_cannot_be_rebuilt_is_named():
    tensors, structure = _batch.flatten({"x": torch.zeros(2), "slotted": Slotted(torch.ones(2))})
    assert [n for n, _ in tensors] == ["x"]
    parts = _batch.opaque_parts(json.loads(structure))
    assert len(parts) == 1 and parts[0][0] == "batch['slotted']" and "Slotted" in parts[0][1], parts
    tensors, structure = _batch.flatten(Pair(torch.zeros(2), Slotted(torch.ones(2))))
    assert [n for n, _ in tensors] == ["x"]
    assert [p for p, _ in _batch.opaque_parts(json.loads(structure))] == ["batch.y"]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))


def _train(model, opt, steps):
    for _ in range(steps):
        loss = model(torch.randn(6, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


class Lion(torch.optim.Optimizer):
    """A custom optimizer (not in torch.optim) with tensor and plain state."""

    def __init__(self, params, lr=1e-3):
        super().__init__(params, {"lr": lr, "betas": (0.9, 0.99)})

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            for p in g["params"]:
                s = self.state[p]
                s.setdefault("m", torch.zeros_like(p))
                s["count"] = s.get("count", 0) + 1
                s["m"].mul_(g["betas"][0]).add_(p.grad, alpha=1 - g["betas"][0])
                p.add_(s["m"].sign(), alpha=-g["lr"])


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    lambda ps: torch.optim.RMSprop(ps, lr=1e-2, centered=True, momentum=0.5),
    lambda ps: torch.optim.Adagrad(ps, lr=1e-2),
    lambda ps: Lion(ps),
], ids=["sgd", "adam-amsgrad", "adamw", "rmsprop", "adagrad", "custom"])
def test_any_optimizers_state_round_trips_and_the_next_steps_match_bit_for_bit(make):
    a = _model()
    opt_a = make(a.parameters())
    _train(a, opt_a, 3)
    names = _state.parameter_names(a, opt_a)
    tensors, doc = _state.optimizer_keyframe(opt_a, names)
    stored = {n: t.clone() for n, t in tensors}
    b = _model()
    b.load_state_dict(a.state_dict())
    opt_b = make(b.parameters())
    _state.restore_optimizer(opt_b, doc, lambda n: stored[n])
    torch.manual_seed(5)
    _train(a, opt_a, 2)
    torch.manual_seed(5)
    _train(b, opt_b, 2)
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), n


def test_an_optimizer_over_parameters_the_model_lacks_is_refused_with_the_parameter_named():
    model, other = _model(), torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(list(model.parameters()) + list(other.parameters()), lr=0.1)
    with pytest.raises(ValueError, match=r"parameter 6 of group 0 \(shape \[3, 3\]\) is not a parameter of the model"):
        _state.parameter_names(model, opt)


def test_python_and_numpy_generators_are_kept_and_restored_exactly():
    random.seed(3)
    numpy.random.seed(4)
    random.gauss(0, 1)  # leaves a cached gaussian in random's state
    numpy.random.standard_normal()
    states = dict(_state.python_generators())
    want = (random.random(), random.gauss(0, 1), numpy.random.rand(), numpy.random.standard_normal())
    random.seed(99)
    numpy.random.seed(99)
    _state.restore_python_generator(states["python"])
    _state.restore_numpy_generator(states["numpy"])
    assert (random.random(), random.gauss(0, 1), numpy.random.rand(), numpy.random.standard_normal()) == want


def test_each_steps_python_generator_state_is_the_state_then_however_it_moved():
    # Read at every step, the state is given again as the last step's tensor when it has not
    # moved; each way it can move (a draw, a cached Gaussian made and used, a seed, a setstate)
    # must give the state of that moment.
    generators = _state._Generators()
    random.seed(1)

    def kept():
        tensor = dict(generators())["python"]
        state = random.getstate()
        random.seed(12345)
        _state.restore_python_generator(tensor)
        assert random.getstate() == state
        return tensor

    first = kept()
    assert kept() is first  # unchanged: not built again
    if sys.implementation.name == "cpython":
        assert generators._python_words, "random's words are read in place on CPython"
    moves = [random.random, lambda: random.gauss(0, 1), lambda: random.gauss(0, 1), lambda: random.seed(7),
             lambda: random.setstate(first_state), lambda: random.getrandbits(64)]
    first_state = random.getstate()
    seen = [first]
    for move in moves:
        move()
        seen.append(kept())
        assert kept() is seen[-1]
    states = [t.tolist() for t in seen]
    assert all(a != b for a, b in zip(states, states[1:])), "every move was seen"


def test_a_schedulers_state_is_a_json_document_and_comes_back():
    opt = torch.optim.SGD(_model().parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=50)
    for _ in range(7):
        opt.step()
        sched.step()
    doc = _state.state_document(sched)
    assert doc is not None
    opt2 = torch.optim.SGD(_model().parameters(), lr=0.1)
    sched2 = torch.optim.lr_scheduler.OneCycleLR(opt2, max_lr=1.0, total_steps=50)
    _state.restore_document(sched2, doc)
    assert sched2.last_epoch == sched.last_epoch and sched2.get_last_lr() == sched.get_last_lr()


def test_a_keyframes_modes_keep_frozen_parameters_and_which_hold_a_dense_gradient():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    model(torch.randn(2, 3)).sum().backward()
    model[0].requires_grad_(False)
    model[1].bias.grad = None
    doc = _state.module_modes(model)
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    fresh[1].weight.grad = torch.ones_like(fresh[1].weight)  # one left from before: zeroed
    _state.restore_module_modes(fresh, doc)
    assert [p.requires_grad for p in fresh.parameters()] == [False, False, True, True]
    grads = [p.grad for p in fresh.parameters()]
    assert grads[3] is None and all(g is not None and not g.any() for g in grads[:3])
    # A keyframe written before these were kept leaves them as they are.
    older = torch.nn.Linear(3, 4)
    _state.restore_module_modes(older, json.dumps({"eval": []}))
    assert older.weight.requires_grad and older.weight.grad is None


def test_a_sparse_gradient_is_not_brought_back_dense():
    # An Embedding(sparse=True) under SparseAdam: a dense zero gradient would make the next
    # backward's dense, and SparseAdam refuse it.
    embed = torch.nn.Embedding(10, 3, sparse=True)
    embed(torch.tensor([1, 2])).sum().backward()
    assert embed.weight.grad.is_sparse
    doc = _state.module_modes(embed)
    fresh = torch.nn.Embedding(10, 3, sparse=True)
    _state.restore_module_modes(fresh, doc)
    assert fresh.weight.grad is None
    fresh(torch.tensor([3])).sum().backward()
    torch.optim.SparseAdam(fresh.parameters()).step()  # sparse, as recorded


def test_the_program_sources_read_before_a_fork_take_in_what_was_imported_since(tmp_path, monkeypatch):
    # The observer reads them before a DataLoader forks its workers; the recording that begins at
    # the first batch takes that reading, with the files of the modules imported after it.
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before, after = tmp_path / "own_before_fork.py", tmp_path / "own_after_fork.py"
    before.write_text("X = 1\n")
    after.write_text("Y = 2\n")
    try:
        importlib.import_module("own_before_fork")
        _state.prepare_before_fork()
        read_then = {path: sha for path, sha, *_ in _state._sources_read_early[2]}
        before.write_text("X = 10\n")  # changed after the reading: the early reading still holds X = 1
        importlib.import_module("own_after_fork")
        early = _state.program_sources(early=True)
        assert _state._sources_read_early is None, "taken once"
        shas = {path: sha for path, sha, *_ in early}
        assert len(shas) == len(early), early
        assert shas["own_before_fork.py"] == read_then["own_before_fork.py"], "the early reading, not a new one"
        assert "own_after_fork.py" in shas and "own_after_fork.py" not in read_then
        now = {path: sha for path, sha, *_ in _state.program_sources()}
        assert now["own_before_fork.py"] != shas["own_before_fork.py"] and set(now) == set(shas)
        # The module that was newest at the reading is gone: the reading cannot say what came
        # after it, and everything is read anew.
        _state.prepare_before_fork()
        newest = _state._sources_read_early[1]
        del sys.modules[newest[0]]
        try:
            anew = {path: sha for path, sha, *_ in _state.program_sources(early=True)}
        finally:
            sys.modules[newest[0]] = newest[1]
        assert anew["own_before_fork.py"] == now["own_before_fork.py"]
    finally:
        _state._sources_read_early = None
        for name in ("own_before_fork", "own_after_fork"):
            sys.modules.pop(name, None)
