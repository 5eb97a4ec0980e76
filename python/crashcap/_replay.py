"""Replay inside the recorded Python program.

``crashcap replay B`` (and every bisection and triage experiment) runs the recorded command line
again, in the recorded working directory, with CRASHCAP_REPLAY_REQUEST naming a request. There
the program's ``crashcap.Recorder`` records nothing: it becomes the replay's driver. Its
``steps()`` never iterates the loader; it restores the newest keyframe before the target step
(weights, buffers, the optimizer's state_dict, the scheduler's), then yields the recorded batches
from the keyframe's step to the target, with each step's generator states (LibTorch's, Python's
``random``, numpy's) and learning rates restored before it. ``end(loss)`` hands the loss and
gradient norm to the engine, which compares them with the recording bit for bit and probes the
target step op by op. After the target step (or the exception that ends a step) the outcome is
written and the process ends with ``os._exit``: nothing after the loop runs (a ``finally:`` that
saves a checkpoint must not overwrite the real one with replayed weights), and no
``except Exception`` can swallow the end.
"""

import collections
import contextlib
import functools
import hashlib
import json
import operator
import os
import sys
import traceback

import torch

from . import _batch, _native, _state

_replaying = False


def replaying():
    """True in a process that ``crashcap replay`` started to replay a recording: skip side effects
    there (logging services, checkpoint writes)."""
    return _replaying or _native.REPLAY_REQUEST_VARIABLE in os.environ


def take_request():
    """This process's replay request (parsed JSON with its text), or None."""
    global _replaying
    text = _native.take_replay_request()
    os.environ.pop(_native.REPLAY_REQUEST_VARIABLE, None)  # the C++ side unset it; Python's copy too
    if text is None:
        return None
    _replaying = True
    return {"text": text, **json.loads(text)}


def _error(code, message, hint=""):
    """A crashcap error with its code (formats' errorCodeName) and hint, for the outcome."""
    err = _native.Error(message)
    err.code, err.hint = code, hint
    return err


def _end(code):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Driver:
    """The replay, driven by the program's own loop through its Recorder."""

    def __init__(self, request, recorder):
        self.request = request
        self.rec = recorder
        self.session = None
        self.current = None        # the step in flight
        self._update_lrs = []      # the recorded update's learning rates for the step in flight, when set after its batch
        self.restored = False
        self._pending = None       # steps rec.steps() has still to yield
        self.loader = None         # the training's DataLoader, when the observer drives the replay
        self.observed = False      # the observer drives it: it sees every backward() and update
        self._open = False         # the target step waits for its later backward() calls (later_backward)
        self._target_batch = None  # the target step's recorded batch tensors, by name, and
        self._target_indices = []  # its index tensor's dataset indices (match_rows)
        self._previous_hook = sys.excepthook
        sys.excepthook = self._excepthook
        try:
            model = recorder.model
            self.session = _native.DrivenReplay(request["text"], list(model.named_parameters()),
                                                list(model.named_buffers()))
            self._check_sources()
        except Exception as e:
            self._refuse(e)

    # ---- failures before the loop ---------------------------------------------------------------

    def _refuse(self, exc):
        code = getattr(exc, "code", None) or ("invalid-argument" if isinstance(exc, (ValueError, TypeError)) else "internal")
        message = str(exc) if isinstance(exc, _native.Error) else f"{type(exc).__name__}: {exc}"
        ok = _native.write_replay_error(self.request["text"], code, message, getattr(exc, "hint", "") or "")
        _end(3 if ok else 1)

    def _check_sources(self):
        """The recorded source files must be the ones here, or the replay runs other code; and the
        torch the recording ran on is named when this one differs."""
        changed = []
        for path, sha256, size in self.session.sources():
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError as e:
                changed.append(f"{path} ({e.strerror.lower()})")
                continue
            if hashlib.sha256(data).hexdigest() != sha256:
                changed.append(f"{path} (changed since the recording)")
        if changed and not self.request.get("options", {}).get("allow_changed_sources", False):
            raise _error("invalid-argument", "the program's source files differ from the recording's: " + "; ".join(changed),
                         ("replay with the sources the recording ran (the bundle keeps them as program/sources/<path>; "
                          "`crashcap inspect B --json` lists them), or pass --allow-changed-source to replay the changed code"))
        for c in changed:
            self.session.note(f"source file {c}: replayed with --allow-changed-source")
        recorded = self.session.environment_fact("python.torch_version")
        if recorded and recorded != torch.__version__:
            self.session.note(f"torch {torch.__version__} here, {recorded} in the recording")

    # ---- the loop ---------------------------------------------------------------------------

    def _restore(self):
        """The keyframe: weights and buffers (the engine), the optimizer and scheduler (here)."""
        if self.restored:
            return
        self.restored = True
        s = self.session
        s.restore_model()
        docs = {name.rsplit("/", 1)[-1]: name for name in s.keyframe_documents()}
        if "optimizer" not in docs:
            raise _error("not-found", f"keyframe {s.keyframe} holds no optimizer state (the recorder could not read "
                         f"it; its warning is in `crashcap inspect`): replay would start from a fresh optimizer")
        if "optimizer" in docs:
            prefix = f"keyframes/{s.keyframe}/optimizer/"
            _state.restore_optimizer(self.rec.optimizer, s.read_text(docs["optimizer"]).decode(),
                                     lambda name: s.read_tensor(prefix + name))
        for name, obj in (("scheduler", self.rec.scheduler), ("grad_scaler", self.rec.grad_scaler)):
            if obj is not None and name in docs:
                _state.restore_document(obj, s.read_text(docs[name]).decode())
        if "modules" in docs:
            _state.restore_module_modes(self.rec.model, s.read_text(docs["modules"]).decode())

    def _begin(self, step):
        if step == self.session.target and self.session.wants_keyframe:
            # The state the target step starts from, kept as the recorder keeps a keyframe (the
            # engine writes it only when every step so far replayed bit for bit).
            tensors, documents = self.rec._keyframe(step)
            self.session.write_keyframe(tensors, documents)
        batch, structure, lrs, self._update_lrs, generators = self.session.begin_step(step)
        if step == self.session.target and self.request.get("side") == "reference":
            self._widen_other_modules()
        if step == self.session.target and may_reorder(self.loader):
            self._target_indices = self.session.rows_to_match()
            if self._target_indices:
                # Its rows as recorded, for match_rows (the program may change its batch in place).
                self._target_batch = {name: t.detach().cpu().clone() for name, t in batch}
        self.current = step
        groups = self.rec.optimizer.param_groups
        for group, lr in zip(groups, lrs):
            group["lr"] = lr
        for device, name in generators:
            if device == "python":
                _state.restore_python_generator(self.session.read_tensor(name))
            elif device == "numpy":
                _state.restore_numpy_generator(self.session.read_tensor(name))
        return batch, structure

    def _widen_other_modules(self):
        """The float64 reference of an ops bisection: at the target step the engine has widened the
        model's parameters and buffers and the default dtype; the float32 state of the program's
        other modules is widened with them, or a loss's own tensors (CrossEntropyLoss(weight=...))
        stay float32 beside float64 logits and the step cannot run. float16 and bfloat16 modules
        are kept narrow on purpose (a frozen teacher): they stay as they are, as does a tensor that
        belongs to no module (a bare weight tensor given to a functional loss). This process serves
        the reference alone and ends after the target step."""
        from . import _observe  # the scan that finds every live module without isinstance
        model = self.rec.model
        own = {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()}
        with torch.no_grad():
            for module in _observe._all_live_modules():
                if module is model:
                    continue
                try:  # a module never given nn.Module.__init__ has no parameters to list
                    tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
                except Exception:
                    continue
                for t in tensors:
                    if id(t) in own or t.dtype != torch.float32:
                        continue
                    own.add(id(t))
                    t.grad = None
                    t.data = t.data.to(torch.float64)

    def steps(self):
        """The recorded steps, keyframe to target. A program that leaves its loop and calls
        rec.steps() again (once per epoch) goes on where it left off."""
        try:
            self._restore()
            if self._pending is None:
                self._pending = list(self.session.steps())
        except Exception as e:
            self._refuse(e)
        while self._pending:
            step = self._pending.pop(0)
            try:
                batch, structure = self._begin(step)
                if structure and json.loads(structure).keys() == {"opaque"}:
                    raise _error("unsupported", f"the batch of step {step} was recorded without its structure "
                                 f"({json.loads(structure)['opaque']}), so replay cannot rebuild it")
                batch = _batch.rebuild(structure, dict(batch))
            except Exception as e:
                self._refuse(e)
            self.session.start_probe()
            yield step, batch
        self._finish()

    @contextlib.contextmanager
    def step(self, step, batch):
        """The ``with rec.step(i, ...)`` form: the program makes its own batches, so the steps before
        the keyframe run as the program runs them (their results are overwritten by the keyframe),
        and from the keyframe on the recorded batch is copied into the program's tensors in place."""
        if step < self.session.keyframe:
            yield
            return
        try:
            if step not in self.session.steps():
                raise _error("invalid-argument", f"step {step} is not among the recorded steps this replay runs "
                             f"({self.session.keyframe}..{self.session.target})")
            self._restore()
            recorded, _ = self._begin(step)
            recorded = dict(recorded)
            tensors, _ = _batch.flatten(batch)
            with torch.no_grad():
                for name, t in tensors:
                    src = recorded.get(name)
                    if (self.request.get("side") == "reference" and src is not None and src.shape == t.shape
                            and src.dtype == torch.float64 and t.is_floating_point() and t.dtype != torch.float64):
                        t.data = src  # the float64 reference of an ops bisection widens the target step's batch
                        continue
                    if src is None or src.shape != t.shape or src.dtype != t.dtype:
                        raise _error(
                            "unsupported", f"the program's batch tensor '{name}' of step {step} is {list(t.shape)} {t.dtype}, the "
                            f"recording's " + (f"{list(src.shape)} {src.dtype}" if src is not None else "has none") +
                            ": a `with rec.step()` loop replays only whole, unchanged batches (replay a subset of "
                            "rows with a loop over rec.steps(loader))")
                    t.copy_(src)
        except Exception as e:
            self._refuse(e)
        self.session.start_probe()
        try:
            yield
        except Exception as e:
            self.fail(e)
            raise
        if step == self.session.target:
            self._finish()  # the block ended without rec.end(loss): no fingerprint to compare

    def end(self, loss):
        if self.current is None:
            return
        # The learning rates the recorded update used, where the program set them after taking the
        # batch: from its own counters, which count from the keyframe here, not from step 0.
        for group, lr in zip(self.rec.optimizer.param_groups, self._update_lrs):
            group["lr"] = lr
        over = self.session.end_step(loss, self.observed)
        if self.current == self.session.target:
            if not over:
                self._open = True  # a recorded non-finite loss the first backward() did not give
                return
            self._target_over()

    def later_backward(self, loss):
        """A backward() of the target step after its first (the observer's): the step ends at the
        first whose loss is non-finite."""
        if self._open and self.session.later_backward(loss):
            self._target_over()

    def before_update(self):
        """The program is about to update its weights: a target step still open ends here, before
        the update, with no later loss that was non-finite."""
        if self._open:
            self._target_over()

    def _target_over(self):
        self._open = False
        if self.loader is not None:
            # A loading crash: the batch after the target step is loaded here and now, not when
            # the program would ask for it, so that nothing after the step runs (its update, a
            # checkpoint it saves, a collective other ranks no longer join).
            self._load_batch()
        self._match_rows()  # after: the load draws the random numbers it drew when recording
        self._finish()

    def _load_batch(self):
        """Loads the batch the recording failed to load again as the program's loader loads it
        and, when it fails, finds the samples that do (load_again)."""
        load = self.session.batch_to_load()
        if load is None:
            return
        own, indices, search = load
        try:
            error, culprits, by = load_again(self.loader, own, indices, search)
        except Exception as e:  # crashcap's own
            self._refuse(_error("internal", f"crashcap could not load the batch after step {self.session.target} again: "
                                f"{type(e).__name__}: {e}"))
        self.session.batch_loaded(error, culprits, by)

    def _match_rows(self):
        """Once the target step has ended: which row of its batch holds which sample, when the
        loader's collate function may have reordered the samples the sampler drew (match_rows)."""
        if self.loader is None or self._target_batch is None:
            return
        try:
            found = match_rows(self.loader, self._target_indices, self._target_batch)
            if found is not None:
                self.session.rows_matched(*found)
        except Exception as e:  # crashcap's own: the rows stay unchecked, the replay's verdict stands
            self.session.rows_matched("unchecked", [], f"crashcap could not match them: {type(e).__name__}: {e}")

    def fail(self, exc):
        if self.current is not None:
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            self.session.step_failed(text)
            if self.current == self.session.target:
                self._match_rows()
        self._finish()

    def _excepthook(self, kind, value, tb):
        if self.session is not None and isinstance(value, Exception):
            self.fail(value)
        self._previous_hook(kind, value, tb)

    def _finish(self):
        ok = self.session.finish_and_write()
        _end(0 if ok else 1)


# ---- which row holds which sample --------------------------------------------------------------

def match_rows(loader, indices, recorded):
    """Which row of the recorded batch `recorded` (tensors by name) holds each of the samples at
    dataset `indices`, drawn by `loader`'s sampler in that order. None when the loader's collation
    keeps the order (default_collate, or one sample a batch); else (order, dataset index of each
    row, why) for DrivenReplay.rows_matched: "sampler", "reordered", "partial" (-1 for a row left
    open) or "unchecked".

    Each sample is loaded again and collated alone. A tensor of the batch is compared when each
    sample alone has it too, with one row at a dimension where the batch has len(indices): a
    sample's row is compared with a row of the batch over the extent both have (a row padded to
    the batch's longest sample keeps its own values first), NaN equal to NaN. When each sample is
    at its own row in every tensor compared, the order is the sampler's: another pairing those
    tensors allow would only swap samples alike in all of them. Otherwise each sample is compared
    with every row (up to _MATCH_BUDGET values). When the rows are the samples in some order,
    each row of a tensor that holds them matches a sample and each sample a row; a tensor where
    one does not is left out: it holds the batch, not its samples (a PackedSequence's
    sorted_indices), or the samples do not come back the same (a random transform). The rows are
    then paired with the samples as every pairing the tensors kept allow pairs them
    (_held_samples): "sampler" or "reordered" when all are; "partial" when rows that match
    several samples alike in every tensor kept are left open (-1); "unchecked" when none is, or
    no pairing is possible."""
    if not may_reorder(loader):
        return None
    collate, n = loader.collate_fn, len(indices)
    try:
        samples = _fetch(_indexed_dataset(loader.dataset), indices)
        flat = [_batch.flatten(collate([x])) for x in samples]
        alone = [dict(tensors) for tensors, _ in flat]
    except Exception as e:
        return "unchecked", [], f"loading the samples again and collating each alone raised {_error_text(e).splitlines()[-1]}"
    # A PackedSequence's tensors have no row per sample, whatever their sizes: its data interleaves
    # the rows' time steps, its batch_sizes counts rows per time step, its indices permute the rows.
    packed = set()
    for _, structure in flat[:1]:
        _packed_tensors(json.loads(structure) if structure else None, packed)
    compared = []  # (batch tensor, its samples' tensors alone, the dimension of its rows)
    for name, batch_tensor in recorded.items():
        if name == "index" or name in packed or not isinstance(batch_tensor, torch.Tensor):
            continue
        alone_tensors = [a.get(name) for a in alone]
        d = _row_dimension(batch_tensor, alone_tensors, n)
        if d is not None:
            compared.append((batch_tensor, [t.detach().cpu() for t in alone_tensors], d))
    items = _item_tensors(recorded, alone, n, packed)
    if not compared and not items:
        return "unchecked", [], "no tensor of the batch holds one row per sample as the collate function gives each alone"
    # Each sample at its own row in every tensor: whatever other pairing those tensors allow pairs
    # samples alike in all of them, so each row holds its sample's data. The common case, and n
    # comparisons, not n*n.
    if (all(bool(_candidates(b, a, d, own_rows=True).all()) for b, a, d in compared)
            and all(_same(rows[i], a) for rows, samples in items for i, a in enumerate(samples))):
        return "sampler", list(indices), ""
    elements = max([b.numel() // n for b, _, _ in compared]
                   + [max(t.numel() for t in batch_items) for batch_items, _ in items]) * n * n
    if elements > _MATCH_BUDGET:
        return "unchecked", [], (f"the samples are not each at their own row, and comparing every sample with every row "
                                 f"({elements:.3g} values) is over crashcap's budget ({_MATCH_BUDGET:.3g})")
    together = None
    for candidates in [_candidates(b, a, d) for b, a, d in compared] + [_item_candidates(b, a) for b, a in items]:
        if not (bool(candidates.any(dim=0).all()) and bool(candidates.any(dim=1).all())):
            continue  # the batch's own (no sample alone has it at a row), or samples that changed
        together = candidates if together is None else together & candidates
    if together is None:
        return "unchecked", [], ("no tensor of the batch holds the samples as the collate function gives each alone (a "
                                 "random transform, or a collate function that changes the samples)")
    held = _held_samples(together)
    if held is None:
        return "unchecked", [], ("the rows and the samples loaded again and collated alone cannot be paired in every "
                                 "tensor of the batch that holds them")
    if held == list(range(n)):
        return "sampler", list(indices), ""
    if all(i >= 0 for i in held):
        return "reordered", [indices[i] for i in held], ""
    several = [r for r, i in enumerate(held) if i < 0]
    why = (f"row{'s' if len(several) > 1 else ''} {_rows_text(several)} match{'' if len(several) > 1 else 'es'} "
           f"several of the samples loaded again (samples alike in every tensor compared)")
    if len(several) == n:
        return "unchecked", [], why
    return "partial", [indices[i] if i >= 0 else -1 for i in held], why


def _packed_tensors(node, out):
    """The names of the tensors under the PackedSequences of a batch's structure node, into `out`."""
    if isinstance(node, dict):
        if node.get("type") == "torch.nn.utils.rnn:PackedSequence":
            _tensor_names(node, out)
            return
        for value in node.values():
            _packed_tensors(value, out)
    elif isinstance(node, list):
        for value in node:
            _packed_tensors(value, out)


def _tensor_names(node, out):
    if isinstance(node, dict):
        if isinstance(node.get("tensor"), str):
            out.add(node["tensor"])
        for value in node.values():
            _tensor_names(value, out)
    elif isinstance(node, list):
        for value in node:
            _tensor_names(value, out)


def _held_samples(candidates):
    """The sample each row holds (-1 when the candidates leave it open), from [sample, row]
    booleans, in every pairing of rows with samples they allow: a row one sample alone matches
    holds it, and so does a row that alone matches a sample; each such pair takes that sample
    and that row from the others' candidates, which may leave another one alone. None when no
    pairing is possible (a row, or a sample, left with no candidate)."""
    n = candidates.shape[0]
    samples_of = [set() for _ in range(n)]  # of each row
    rows_of = [set() for _ in range(n)]     # of each sample
    for i, r in candidates.nonzero().tolist():
        samples_of[r].add(i)
        rows_of[i].add(r)
    held = [-1] * n

    def pair(r, i):
        held[r] = i
        for other in samples_of[r] - {i}:
            rows_of[other].discard(r)
        for other in rows_of[i] - {r}:
            samples_of[other].discard(i)
        samples_of[r], rows_of[i] = {i}, {r}

    progress = True
    while progress:
        if any(not s for s in samples_of) or any(not s for s in rows_of):
            return None
        progress = False
        for r in range(n):
            if held[r] < 0 and len(samples_of[r]) == 1:
                pair(r, next(iter(samples_of[r])))
                progress = True
        for i in range(n):
            if len(rows_of[i]) == 1:
                (r,) = rows_of[i]
                if held[r] < 0:
                    pair(r, i)
                    progress = True
    return held


def may_reorder(loader):
    """The loader collates batches of samples with a function of the program's, which may put
    them in another order than the sampler drew them (default_collate keeps it)."""
    return (loader is not None and loader.batch_sampler is not None
            and loader.collate_fn is not torch.utils.data.default_collate)


def _rows_text(rows, most=8):
    text = ", ".join(str(r) for r in rows[:most])
    return text + (f" and {len(rows) - most} more" if len(rows) > most else "")


def _indexed_dataset(dataset):
    """The dataset the batch's `index` tensor indexes: under the loader's Subsets as far as their
    indices are integers (as the recorder mapped them)."""
    while isinstance(dataset, torch.utils.data.Subset):
        try:
            if len(dataset.indices):
                operator.index(dataset.indices[0])
        except TypeError:
            break
        dataset = dataset.dataset
    return dataset


# Most values match_rows compares (samples times rows times a row's values, of its largest tensor)
# when the samples are not each at their own row.
_MATCH_BUDGET = 2e9


def _row_dimension(batch_tensor, alone, n):
    """The dimension of `batch_tensor` that holds its n rows, one per sample, where each of the
    samples' tensors `alone` (collated alone) has one; None when there is none."""
    if any(not isinstance(a, torch.Tensor) or a.dim() != batch_tensor.dim() or a.dtype != batch_tensor.dtype
           for a in alone):
        return None
    for d in range(batch_tensor.dim()):
        if batch_tensor.shape[d] == n and all(a.shape[d] == 1 for a in alone):
            return d
    return None


def _item_tensors(recorded, alone, n, skip):
    """The tensors of a list in the batch of one item per row whose items are each row's own (a
    collate's per-sample targets, or the samples as they are): [(the n rows' tensors, the samples'
    tensors alone)], one pair per place in the item. Found by name: where each sample collated
    alone has a tensor under item 0 of a list ("1/0/boxes"), the batch has one under each of its n
    items ("1/0/boxes" ... "1/7/boxes")."""
    out = []
    if not alone or n < 2:
        return out
    for name in alone[0]:
        if name in skip or not isinstance(alone[0][name], torch.Tensor):
            continue
        parts = name.split("/")
        for k, part in enumerate(parts):
            # A sample collated alone has only item 0 of such a list: a "1" beside it marks a field.
            if part != "0" or "/".join(parts[:k] + ["1"] + parts[k + 1:]) in alone[0]:
                continue
            names = ["/".join(parts[:k] + [str(r)] + parts[k + 1:]) for r in range(n)]
            rows = [recorded.get(m) for m in names]
            samples = [a.get(name) for a in alone]
            if all(isinstance(t, torch.Tensor) for t in rows + samples):
                out.append(([t.detach().cpu() for t in rows], [t.detach().cpu() for t in samples]))
                break
    return out


def _equal_values(a, b):
    """Elementwise a == b (broadcast), NaN equal to NaN."""
    same = a == b
    if a.is_floating_point() or a.is_complex():
        same |= a.isnan() & b.isnan()
    return same


def _same(a, b):
    """Whether two tensors hold the same values in the same shape, NaN equal to NaN."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(_equal_values(a, b).all())


def _item_candidates(rows, alone):
    """[sample, row] booleans: row r's own tensor `rows[r]` is sample i's `alone[i]`."""
    n = len(rows)
    out = torch.zeros(n, n, dtype=torch.bool)
    for i, a in enumerate(alone):
        for r, t in enumerate(rows):
            out[i, r] = _same(t, a)
    return out


def _candidates(batch_tensor, alone, d, own_rows=False):
    """[sample, row] booleans: row r of `batch_tensor` (along d) holds sample i's one row of
    `alone[i]` over the extent both have, NaN equal to NaN; with `own_rows`, [sample] booleans of
    each sample against its own row only."""
    n = batch_tensor.shape[d]
    rows = batch_tensor.detach().cpu().movedim(d, 0)
    out = torch.zeros(n, n, dtype=torch.bool) if not own_rows else torch.zeros(n, dtype=torch.bool)
    for i, a in enumerate(alone):
        a = a.movedim(d, 0)
        r = rows[i:i + 1] if own_rows else rows
        for k in range(1, a.dim()):
            extent = min(a.shape[k], r.shape[k])
            a, r = a.narrow(k, 0, extent), r.narrow(k, 0, extent)
        same = _equal_values(r, a)
        same = same.reshape(same.shape[0], -1).all(dim=1)
        out[i] = same[0] if own_rows else same
    return out


# ---- a batch that failed to load --------------------------------------------------------------

def _error_text(exc):
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def load_again(loader, own, indices, search=True):
    """Loads the batch the sampler drew as `own` (into loader.dataset; `indices`: the same samples
    in the data under its Subsets) as the loader does: in a worker when it has workers. Returns
    (error text or "", [(position, error text)] of the samples that fail, how they were found);
    with `search` false, only whether it fails. The samples that fail: those that raise loaded
    alone (each in a worker like the loader's, which a sample that kills its worker ends alone, or
    in this process when the loader has no workers); else those that raise collated alone; else,
    of those whose structure (types, shapes, dtypes) differs from the most common one, each that
    the rest collate without and not with (both in this process)."""
    dataset = _dataset_of(loader.dataset, own, indices)
    collate = loader.collate_fn
    batched = loader.batch_sampler is not None  # the loader's auto-collation: a list of samples a batch
    workers = loader.num_workers > 0
    try:
        if workers:
            _load_in_a_worker(loader, dataset, indices)
        elif batched:
            collate(_fetch(dataset, indices))
        else:
            for i in indices:  # one sample a batch
                collate(dataset[i])
        return "", [], ""
    except Exception as e:
        error = _error_text(e)
        # A worker's death is raised in other words depending on where this process was when the
        # loader saw it ("exited unexpectedly" while it waited): the loader's report says how the
        # worker ended, as the recording's crash text does beside the error it raised.
        report = getattr(e, "_crashcap_worker_report", None)
        if report and report not in error:
            error = f"(the DataLoader reports: {report})\n{error}"
    if not search:
        return error, [], ""
    samples, culprits = {}, []
    for position, sample, failed in (_each_in_a_worker(loader, dataset, indices) if workers
                                     else _each_here(dataset, indices)):
        if failed is None:
            samples[position] = sample
        else:
            culprits.append((position, failed))
    if culprits or not batched:
        return error, culprits, "loaded alone" if culprits else ""
    for position, x in samples.items():
        try:
            collate([x])
        except Exception as e:
            culprits.append((position, _error_text(e)))
    if culprits:
        return error, culprits, "collated alone"
    shapes = {position: _structure(x) for position, x in samples.items()}
    common, _ = collections.Counter(shapes.values()).most_common(1)[0]
    rest = [samples[p] for p in samples if shapes[p] == common]
    try:
        collate(rest)
    except Exception:
        return error, [], ""
    for position, x in samples.items():
        if shapes[position] != common:
            try:
                collate(rest + [x])
            except Exception as e:
                culprits.append((position, _error_text(e)))
    return error, culprits, "collated with the rest" if culprits else ""


def _dataset_of(dataset, own, indices):
    """The dataset `indices` index: under the loader's Subsets as far as the recording mapped `own`
    through them (it stops at one whose indices are not integers); all the way down when this
    loader's Subsets do not map them so (a loader made anew each epoch over another Subset)."""
    base, mapped = dataset, list(own)
    try:
        while isinstance(base, torch.utils.data.Subset):
            mapped = [operator.index(base.indices[i]) for i in mapped]
            base = base.dataset
    except (TypeError, IndexError):
        pass
    if mapped == list(indices):
        return base
    while isinstance(dataset, torch.utils.data.Subset):  # Subset[i] is its dataset[indices[i]]
        dataset = dataset.dataset
    return dataset


def worker_died(exc):
    """The loader's exception says a worker process ended (a signal, the OOM killer), not what it
    raised: the DataLoader's own words, or the broken pipe that often comes first."""
    text = str(exc)
    return isinstance(exc, (ConnectionError, EOFError)) or "exited unexpectedly" in text or "killed by signal" in text


def _collate_one(collate, batch):
    """A loader without auto-collation's fetch: its collate function over its one sample."""
    return collate(batch[0])


def _alone(batch):
    """A collate function that keeps the sample as it was loaded: loading alone is the test."""
    return batch


def _worker_loader(loader, dataset, batches, collate):
    """A DataLoader that loads `batches` (lists of indices) as `loader`'s workers do, in one worker:
    get_worker_info() is set there, worker_init_fn has run, and default_collate stacks into shared
    memory (a batch of unequal tensors fails there with another message than in this process)."""
    return torch.utils.data.DataLoader(dataset, batch_sampler=batches, collate_fn=collate, num_workers=1,
                                       prefetch_factor=1,  # one batch in flight: a death is that batch's
                                       worker_init_fn=loader.worker_init_fn,
                                       multiprocessing_context=loader.multiprocessing_context, timeout=loader.timeout)


def _load_in_a_worker(loader, dataset, indices):
    """The batch as a worker of `loader` loads it; its error comes back as the loader re-raises it."""
    if loader.batch_sampler is not None:
        batches, collate = [list(indices)], loader.collate_fn
    else:  # one sample a batch, collated alone
        batches, collate = [[i] for i in indices], functools.partial(_collate_one, loader.collate_fn)
    with torch.no_grad():  # not a training loader: the replay leaves it to load
        it = iter(_worker_loader(loader, dataset, batches, collate))
        try:
            for _ in it:
                pass
        except Exception as e:
            if worker_died(e):  # while its worker is registered: the loader's own word on how it ended
                e._crashcap_worker_report = _state.dataloader_worker_failure(e)
            raise
        finally:
            del it  # its worker stops


def _each_in_a_worker(loader, dataset, indices):
    """(position, sample, None) or (position, None, error text) for each of `indices` loaded alone
    in a worker like the loader's. A worker that dies is the error of the sample it was loading (one
    worker loads them in order), and a new one goes on from the next."""
    out, start = [], 0
    while start < len(indices):
        with torch.no_grad():
            it = iter(_worker_loader(loader, dataset, [[i] for i in indices[start:]], _alone))
            try:
                for position in range(start, len(indices)):
                    start = position + 1
                    try:
                        out.append((position, next(it)[0], None))
                    except StopIteration:
                        start = len(indices)
                        break
                    except Exception as e:  # as the loader re-raises it: the worker's error is its last line
                        text = _error_text(e).splitlines()[-1]
                        if worker_died(e):  # and how it ended, in the loader's words
                            report = _state.dataloader_worker_failure(e)
                            out.append((position, None, f"{text}; the DataLoader reports: {report}"
                                        if report and report not in text else text))
                            break  # this worker is gone: a new one for the rest
                        out.append((position, None, text))
            finally:
                del it
    return out


def _fetch(dataset, indices):
    """The samples at `indices` as the loader's fetcher takes them from a map-style dataset: in one
    call to its __getitems__ when it has one, else one dataset[i] each."""
    getitems = getattr(dataset, "__getitems__", None)
    return getitems(list(indices)) if getitems else [dataset[i] for i in indices]


def _each_here(dataset, indices):
    """(position, sample, None) or (position, None, error text) for each of `indices` loaded in this
    process."""
    out = []
    for position, i in enumerate(indices):
        try:
            out.append((position, _fetch(dataset, [i])[0], None))
        except Exception as e:
            out.append((position, None, _error_text(e)))
    return out


def _structure(x, depth=0):
    """What default_collate needs to agree across samples: types, keys, lengths, tensor shapes and
    dtypes; not the values."""
    if depth > 8:
        return type(x).__name__
    if isinstance(x, torch.Tensor):
        return ("tensor", str(x.dtype), tuple(x.shape))
    shape = getattr(x, "shape", None)
    if shape is not None and hasattr(x, "dtype"):  # a numpy array or scalar
        return (type(x).__name__, str(x.dtype), tuple(shape))
    if isinstance(x, dict):
        return ("dict", tuple((k, _structure(v, depth + 1)) for k, v in sorted(x.items(), key=lambda kv: repr(kv[0]))))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_structure(v, depth + 1) for v in x))
    return type(x).__name__
