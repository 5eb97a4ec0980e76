"""Recording an unmodified PyTorch training from PyTorch's own seams (`crashcap run --record`).

``crashcap run --record -- python train.py`` puts crashcap's bootstrap first on the program's
PYTHONPATH (``crashcap/_bootstrap/sitecustomize.py``). When the program imports torch, the
bootstrap calls install(), which watches the training where PyTorch lets anyone watch it:

- ``DataLoader``: each loader gets an ordinal (its place among the loaders the program made); each
  batch an iterator yields with gradients enabled is a step of *the training loader* (the first
  loader iterated that way), recorded before the program sees it, with the dataset indices the
  loader's sampler drew for it (a batch tensor ``index``, unless the batch has its own).
- ``torch.autograd.backward`` (which ``loss.backward()`` calls): the first backward of a one-element
  tensor in a step is the step's loss; crashcap fingerprints it and its gradient norm, and a
  NaN/Inf raises crashcap.NonFiniteError there, before the update, as ``rec.end(loss)`` does.
  ``torch.autograd.grad`` of a one-element tensor for parameters (a training that takes its
  gradients as values) is the same, with the gradients it returned (_seen_grad).
- ``torch.optim.Optimizer``: every optimizer the program makes, in order; its ``step`` counts the
  updates (to tell gradient accumulation). The model is the modules that own the optimizers'
  parameters (found once, at the first step), named as those modules name them.
- LR schedulers and GradScalers made over those optimizers: kept in keyframes.

From those it drives a crashcap.Recorder exactly as the explicit API does, so what a recording
holds, how it seals and how it replays are the same (docs/PYTHON.md). In a replay
(CRASHCAP_REPLAY_REQUEST set) the training loader's iterator yields the recorded batches from the
keyframe on instead, and the process ends after the target step.

What cannot be inferred safely is said in one warning each, kept in the bundle, and the rest is
recorded: several optimizers (kept together), gradient accumulation, a prefetching loop, another
loader iterated with gradients enabled (not recorded), no DataLoader (no steps: the crash, the
environment and the last ops are still recorded), no optimizer (the program updates the weights
itself: the modules whose parameters the first backward() gave gradients are recorded from the
next batch on, under a _ManualUpdate). Several trainings in one process (folds,
phases, in-process trials) are recorded one after another (Observer). The observer never changes what the training computes: it
reads, copies and counts; an error of its own is printed with its traceback and ends the
recording there (Observer.stop), and the training goes on unrecorded.
"""

import atexit
import collections
import functools
import gc
import itertools
import json
import math
import operator
import os
import shutil
import signal
import sys
import threading
import traceback
import weakref

import torch

# crashcap's own modules are imported when first needed, not here: the bootstrap loads this module
# the moment torch's import ends, which may be in the middle of crashcap's own import (a program
# that imports crashcap, which imports torch).
REPLAY_REQUEST_VARIABLE = "CRASHCAP_REPLAY_REQUEST"  # replayer::kReplayRequestVariable


class _Api:
    """crashcap's modules, imported on first use."""

    def __getattr__(self, name):
        from . import _batch, _native, _recorder, _replay, _state
        self._batch, self._native, self._recorder, self._replay = _batch, _native, _recorder, _replay
        self._state = _state
        self.Recorder, self.NonFiniteError = _recorder.Recorder, _recorder.NonFiniteError
        return self.__dict__[name]


_api = _Api()

_observer = None  # the process's observer, once install() ran


def _say(text):
    print(f"crashcap: {text}", file=sys.stderr, flush=True)


class _Roots(torch.nn.Module):
    """Several root modules (and parameters no module owns) as the one model a Recorder takes:
    the modules are children under their class's name ("generator.", "discriminator."), in the
    order the optimizers list their parameters; loose tensors are "loose.<k>". The program's
    modules are only referred to, never changed."""

    def __init__(self, roots, loose):
        super().__init__()
        used = collections.Counter()
        for root in roots:
            base = type(root).__name__.lower() or "module"
            name = base if used[base] == 0 else f"{base}{used[base]}"
            used[base] += 1
            self.add_module(name, root)
        self._loose = list(loose)

    def named_parameters(self, prefix="", recurse=True, *args, **kwargs):
        yield from super().named_parameters(prefix, recurse, *args, **kwargs)
        for k, t in enumerate(self._loose):
            yield f"{prefix}loose.{k}", t


class _Optimizers:
    """Several optimizers as the one a Recorder takes: their parameter groups in order, and one
    state_dict whose parameter indices run on from one optimizer to the next."""

    def __init__(self, optimizers):
        self.optimizers = list(optimizers)
        self._crashcap_kind = "+".join(type(o).__name__.lower() for o in self.optimizers)

    @property
    def param_groups(self):
        return [g for o in self.optimizers for g in o.param_groups]

    def _counts(self):
        return [sum(len(g["params"]) for g in o.param_groups) for o in self.optimizers]

    def state_dict(self):
        state, groups, offset = {}, [], 0
        for o, count in zip(self.optimizers, self._counts()):
            sd = o.state_dict()
            state.update({offset + k: v for k, v in sd["state"].items()})
            for g in sd["param_groups"]:
                groups.append({**g, "params": [offset + i for i in g["params"]]})
            offset += count
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        groups = list(state_dict["param_groups"])
        offset = 0
        for o, count in zip(self.optimizers, self._counts()):
            mine = [{**g, "params": [i - offset for i in g["params"]]} for g in groups[:len(o.param_groups)]]
            groups = groups[len(o.param_groups):]
            state = {k - offset: v for k, v in state_dict["state"].items() if offset <= k < offset + count}
            o.load_state_dict({"state": state, "param_groups": mine})
            offset += count


class _ManualUpdate:
    """The optimizer of a training that makes none: the program updates its weights by its own
    code (`p -= lr * p.grad` under torch.no_grad()). It holds the parameters the first backward()
    gave gradients, in one group with no options and no state: a keyframe keeps their weights,
    and the update itself replays as the program's code."""

    _crashcap_kind = "manual"

    def __init__(self, params):
        self.param_groups = [{"params": list(params)}]

    def state_dict(self):
        return {"state": {}, "param_groups": [{"params": list(range(len(self.param_groups[0]["params"])))}]}

    def load_state_dict(self, state_dict):
        pass  # nothing to give back: the weights are the model's, restored with it


class _Several:
    """Several schedulers (or GradScalers) as one object with a state_dict, kept in keyframes."""

    def __init__(self, objects):
        self.objects = list(objects)

    def state_dict(self):
        return {str(k): o.state_dict() for k, o in enumerate(self.objects)}

    def load_state_dict(self, state):
        for k, o in enumerate(self.objects):
            if str(k) in state:
                o.load_state_dict(state[str(k)])


# The modules the program made (and unpickled, or deep-copied) since install(): where the model is
# looked for first. Weakly held: a module the program drops is gone from it.
_modules_made = weakref.WeakKeyDictionary()  # module -> the order its __init__ ended in
_made_count = itertools.count()


def _module_made(module):
    try:
        _modules_made.setdefault(module, next(_made_count))
    except TypeError:  # a module class whose __slots__ leave no room for a weak reference
        pass


def _all_live_modules():
    """Every live nn.Module, found among all the objects the garbage collector tracks (tens of
    milliseconds in a large program): for the modules made before install() or without calling
    nn.Module.__init__."""
    # By type, not isinstance: isinstance reads __class__, which some objects answer with a warning.
    # A set of the module classes that exist now makes the scan of every live object a lookup each.
    module_types, todo = set(), [torch.nn.Module]
    while todo:
        t = todo.pop()
        if t not in module_types:
            module_types.add(t)
            todo.extend(type.__subclasses__(t))
    return [o for o in gc.get_objects() if type(o) in module_types]


def _roots_owning(modules, optimizer_params):
    """(roots, loose): the modules of `modules` that are no other's child and own the parameters,
    in the order of the parameters they own first; the parameters none of them owns."""
    modules = [m for m in modules if type(m) is not _Roots]
    children = {id(c) for m in modules for c in m._modules.values() if c is not None}
    wanted = {id(p): k for k, p in enumerate(optimizer_params)}
    candidates = []
    for m in modules:
        if id(m) in children:
            continue
        owned = [wanted[id(p)] for p in m.parameters() if id(p) in wanted]
        if owned:
            total = sum(p.numel() for p in m.parameters())
            candidates.append((min(owned), -len(owned), total, type(m).__name__, m, set(owned)))
    candidates.sort(key=lambda c: c[:4])
    roots, covered = [], set()
    for *_, m, owned in candidates:
        if owned - covered:
            roots.append(m)
            covered |= owned
    return roots, [p for k, p in enumerate(optimizer_params) if k not in covered]


def _parameters_with_gradients():
    """The parameters that hold a gradient now, of the live modules that are no other's child: the
    model of a training that updates its weights itself (_ManualUpdate). The modules are taken in
    the order the program made them, each one's parameters in its own order, so that a replay,
    which makes them in the same order, finds the same model with the same names."""
    modules = [m for m in (list(_modules_made) or _all_live_modules()) if type(m) is not _Roots]
    children = {id(c) for m in modules for c in m._modules.values() if c is not None}
    roots = sorted((m for m in modules if id(m) not in children),
                   key=lambda m: (_modules_made.get(m, math.inf), type(m).__name__, sum(p.numel() for p in m.parameters())))
    params, seen = [], set()
    for m in roots:
        for p in m.parameters():
            if p.requires_grad and p.grad is not None and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def _model_of(optimizer_params):
    """(model, description): the modules that own `optimizer_params`, as one nn.Module.

    The roots are the live modules that are no other module's child; of those, the ones owning
    the optimizers' parameters are taken in the order of the parameters they own first. A
    parameter no module owns is kept as a loose tensor. The modules made since install() are
    searched first; all live objects only when they leave a parameter unowned."""
    roots, loose = _roots_owning(list(_modules_made), optimizer_params)
    if loose:
        roots, loose = _roots_owning(_all_live_modules(), optimizer_params)
    if len(roots) == 1 and not loose:
        return roots[0], type(roots[0]).__name__
    words = [type(r).__name__ for r in roots] + ([f"{len(loose)} parameter(s) of no module"] if loose else [])
    return _Roots(roots, loose), " + ".join(words)


class Observer:
    """Watches one process's training (or its trainings, one after another) and drives a
    crashcap.Recorder from it.

    A process may train more than once (the folds of a cross-validation, a fine-tuning phase, the
    trials of a study): a **training** begins at the first batch drawn with gradients enabled
    while an optimizer exists that no earlier training had; an optimizer made after a training
    began marks the end of that training, and the next batch begins the next one, recorded anew.
    Trainings are counted the same way in a replay, which runs the earlier ones as the program
    runs them and replays the recorded one."""

    def __init__(self, policy, replay):
        self.pid = os.getpid()
        self.policy = dict(policy)
        # `crashcap run --record` removes a recording that ends clean unless --keep-recording
        # ("keep_recording": false): closing it need not wait for the disk.
        self.keep_clean = bool(self.policy.pop("keep_recording", True))
        self.replay = replay            # True: this process serves a replay request
        self.launch_facts = []          # how to start this process again when its command line cannot (_spawn.py)
        self.quiet = bool(self.policy.get("quiet", False))
        self.lock = threading.RLock()
        self.optimizers = []            # weakrefs, in the order the program made them
        self.claimed = 0                # optimizers[:claimed] belong to trainings that began already
        self.schedulers = []            # (weakref scheduler, weakref optimizer)
        self.scalers = []               # weakrefs
        self.loaders = 0                # DataLoaders made so far (the next one's ordinal)
        self.training = -1              # the current training's number (-1: none began yet)
        self.training_over = False      # an optimizer was made since the current training began
        self.training_loader = None     # the ordinal of the loader whose batches are the current training's steps
        self.training_dataset = None    # a weakref to that loader's dataset: a loader made anew over it takes over
        self.training_loader_done = False  # the training loader's last iteration ran to its end
        self.training_iterator = None   # a weakref to the iterator that gave the training loader's last batch
        self.worker_death = None        # (the error, batches_in_flight) of the SIGCHLD handler's report of a training worker
        # (ordinal, dataset indices, error, batches, batch) of a loader other than the training's,
        # taken between steps since the last step's batch: the batch the program took from it last,
        # its iteration not run to its end (error None; `batch` itself, kept in a crash's bundle:
        # other_loader_batch), or the batch (and those its workers drew ahead) it raised the error
        # loading (other_loader_note)
        self.other_loader = None
        # itertools.cycle over a loader (_ObservedCycle): how many were made, and (id(batch),
        # (ordinal, dataset indices, dataset)) of the loader's last batch while any exists: a batch
        # the cycle hands out again is a step again, of the samples it held the first time
        self.cycles = 0
        self.last_batch = None
        self.rec = None
        self.capture_only = False       # self.rec records a training without a DataLoader (no steps)
        self.stopped_dir = None         # the recording stop() closed, until its training ends
        self.loaderless_backwards = 0   # backward() calls before any training began
        self.batch_before_optimizer = False  # a DataLoader batch came before any optimizer was made
        self.manual_update = None       # the _ManualUpdate of a training that makes no optimizer
        self.manual_looked = False      # its parameters were looked for (at the first backward() after a batch)
        self.gradients_by = "backward()"  # how the training takes its gradients, as the warnings name it
        self.failed = None              # why the observer stopped (None while it runs)
        self.said = set()               # the warnings said (one each)
        self.pending_warnings = []      # said before the recording began: kept in it when it does
        self.keep_going = self.policy.get("nonfinite") == "record"
        self._reset_steps()
        self.replay_steps = None        # in a replay: the recorded batches, in place of the training loader's
        self.replay_training = None     # in a replay: the number of the training recorded

    def _reset_steps(self):
        self.step = 0                   # the next step's index
        self.in_flight = None           # the step in flight
        self.in_flight_from = None      # (the iteration its batch came from, whether it was the first batch of it)
        self.ended = False              # its loss was fingerprinted
        self.backwards = 0              # backward() calls of the step in flight
        self.updates = 0                # optimizer steps of the step in flight
        self.updated = None             # the ids of the optimizers that stepped in it
        self.sealed_nonfinite = False   # with keep_going: the first non-finite loss's bundle is sealed
        self.freed_graph = None         # (roots, step, call) of the last backward() or grad() that freed its graph

    # ---- bookkeeping ------------------------------------------------------------------------

    def here(self):
        """Whether this is the process that installed the observer (not a forked worker)."""
        return self.failed is None and os.getpid() == self.pid

    def warn(self, key, text):
        """Says `text` once (per `key`); kept in the bundle's run status once a recording runs."""
        if key in self.said:
            return
        self.said.add(key)
        if self.rec is not None and self.rec._native is not None:
            self.rec.warn(text)  # printed by the native recorder (unless quiet)
            return
        if not self.quiet:
            _say(f"warning: {text}")
        self.pending_warnings.append(text)

    def stop(self, error):
        """An error of crashcap's own: stop observing, say so once, let the training go on."""
        if self.failed is not None:
            return
        self.failed = f"{type(error).__name__}: {error}"
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
        _say(f"stopped recording this training after an error of crashcap's own ({self.failed}); "
             f"the training goes on unrecorded. Please report it with the traceback above.")
        # The recording ends here, closed as a clean one: a crash from now on is in a step it does
        # not hold, and sealed into it would be told as a crash of its last step.
        if self.replay:
            return
        rec, self.rec = self.rec, None
        self.in_flight = None  # no step of this training is recorded from now on
        self.freed_graph = None
        if rec is None:
            return
        try:
            rec.warn(f"recording stopped after an error of crashcap's own ({self.failed})", _print=False)
        except Exception as e:
            _say(f"could not note the stop in the recording: {type(e).__name__}: {e}")
        try:
            rec.close()
        except Exception as e:
            _say(f"could not close the recording: {type(e).__name__}: {e}")
        if rec._native is not None:
            self.stopped_dir = rec.recording_dir  # for end_training(remove=True): a clean recording

    def live(self, refs):
        return [o for o in (r() for r in refs) if o is not None]

    def _new_optimizers(self):
        """The live optimizers no training has claimed yet."""
        return self.live(self.optimizers[self.claimed:])

    # ---- the seams --------------------------------------------------------------------------

    def on_optimizer(self, optimizer):
        if self.manual_update is not None and self.training < 0 and optimizer is not self.manual_update:
            # An optimizer after all (made after the first backward()): it is the training's, not
            # the stand-in that backward() made.
            self.optimizers = [r for r in self.optimizers if r() is not self.manual_update]
            self.manual_update = None
        self.optimizers.append(weakref.ref(optimizer))
        if self.training >= 0 and not self.training_over:
            self.training_over = True
            if not self.replay and self.rec is not None and not self.capture_only:
                self.warn(f"new-training-{self.training}",
                          f"an optimizer ({type(optimizer).__name__}) was made after training {self.training} began "
                          f"(step {self.step}): a new training (the next fold, the next phase?) begins at its first "
                          f"batch and is recorded anew")

    def on_scheduler(self, scheduler):
        optimizer = getattr(scheduler, "optimizer", None)
        if optimizer is not None and all(s() is not scheduler for s, _ in self.schedulers):
            self.schedulers.append((weakref.ref(scheduler), weakref.ref(optimizer)))

    def on_scaler(self, scaler):
        if all(s() is not scaler for s in self.scalers):
            self.scalers.append(weakref.ref(scaler))

    def begins_training(self):
        """Whether a batch drawn now (gradients enabled) begins a training: an optimizer exists
        that no training has claimed, and none is under way or the one under way is over."""
        return (self.training < 0 or self.training_over) and bool(self._new_optimizers())

    def on_batch(self, ordinal, indices, batch, dataset=None, iteration=None):
        """A batch the loader `ordinal` (over `dataset`) yielded: a step when it is the training loader's.
        `iteration`: (the iteration it came from, a number per iterator and epoch; whether it is the
        iteration's first batch)."""
        # The training loader's batches (the hot path) are not another loader's: tested first.
        if ordinal != self.training_loader and ordinal >= 0 and self._between_steps():
            self.other_loader = (ordinal, indices, None, None, batch)  # a validation loader's, as a rule
        if not torch.is_grad_enabled():
            return
        if self.replay:
            if self.training < 0 and ordinal >= 0 and not self.optimizers:
                self.batch_before_optimizer = True  # as when it recorded: a backward() may make a _ManualUpdate
            return
        if self.capture_only and self._new_optimizers() or self.begins_training():
            self._finish()
            self.end_training()  # the last training's recording stays (the supervisor keeps or drops it)
            if not self._start(ordinal):
                return
            self.training_dataset = _weak(dataset)
        elif self.rec is None:
            if self.training < 0 and ordinal >= 0:
                self.batch_before_optimizer = True
                self.warn("no-optimizer", "a DataLoader batch came before any torch.optim optimizer was made, so there "
                          "is no model to record yet; recording begins at the first batch after one is made (with none, after "
                          "the first backward() shows which parameters train)")
            return
        elif self._takes_over(ordinal, dataset):
            # A loader made anew for the training (one per epoch: a new sampler, batch size, or
            # subset of the data): the training goes on from it.
            self.training_loader, self.training_dataset = ordinal, _weak(dataset)
        elif ordinal != self.training_loader:
            self.warn("loaders", f"a second DataLoader (#{ordinal}) is iterated with gradients enabled; its batches "
                      f"are not recorded (the steps are DataLoader #{self.training_loader}'s). Iterate validation "
                      f"loaders under torch.no_grad()")
            return
        # A step that ran backward() without an update leaves gradients a keyframe cannot hold. A
        # training that updates its weights itself is taken to do it in every step.
        manual = self.manual_update is not None and self.rec.optimizer is self.manual_update
        accumulating = self.in_flight is not None and self.backwards > 0 and self.updates == 0 and not manual
        if self.in_flight is not None:
            if self.backwards == 0:
                # The step in flight trained on none of its batch. A program that leaves its loop
                # (`break`: the batch it drew last is left unused) or skips a batch in it does that,
                # and replays it alike. A loop that draws a batch ahead (a prefetcher) does it too,
                # at the first batch of each iteration: the only case said.
                came, first = self.in_flight_from or (None, False)
                if first and iteration is not None and iteration[0] == came:
                    self.warn("prefetch", f"DataLoader #{ordinal} gave a second batch before step {self.in_flight}, "
                              f"the first of its iteration, ran backward(): a loop that draws a batch ahead (a "
                              f"prefetcher) computes each step on the batch drawn before it, so the recorded batch of a "
                              f"step may be its successor's; replay and triage then name the wrong rows (a loop that "
                              f"skips its first batch does the same, and is recorded right)")
            elif self.updates == 0 and not manual:
                self.warn("accumulation", f"step {self.in_flight} ran {self.gradients_by} without an optimizer step: "
                          f"gradient accumulation? Each batch is recorded as a step, and keyframes wait for the step after "
                          f"an update (a keyframe holds no gradients)")
        self.training_loader_done = False
        self._finish()
        extra, rows = _sample_rows(batch, indices)
        step = self.step
        self.other_loader = None
        self.in_flight, self.ended, self.backwards, self.updates = step, False, 0, 0
        self.in_flight_from = iteration
        self.step += 1
        self.rec._native.hold_keyframes(accumulating)
        self.rec.begin(step, batch, _extra=extra, _rows=rows)

    def _takes_over(self, ordinal, dataset):
        """Whether loader `ordinal`, made after the training loader, is the training's next one: it
        is over the same dataset, or the training loader's iteration has ended and the model is in
        training mode (a validation loop iterated with gradients enabled runs the model in eval
        mode, as a rule; it stays a second loader, and is said so)."""
        if self.training_loader is None or ordinal <= self.training_loader:
            return False
        if dataset is not None and self.training_dataset is not None and self.training_dataset() is dataset:
            return True
        return self.training_loader_done and _in_training_mode(self.rec.model)

    def on_loading_failed(self, ordinal, own, indices, batches, error):
        """The training loader raised `error` instead of giving the next step's batch (the
        dataset's __getitem__, a collate function, a worker that died): the step in flight ran to
        its end, and the failure, when `error` (or one raised from it) ends the program, is the
        loading's. `own`: the batch's indices into the loader's dataset (what a replay loads);
        `indices`: the same in the data under any Subset (what triage names); None unknown.
        `batches`: (how many batches they hold, how many of them are the awaited batch's): when a
        worker died, they run on with the batches the workers drew ahead."""
        if self.rec is None or self.replay:
            return
        if ordinal != self.training_loader:
            if ordinal >= 0 and self._between_steps():
                self.other_loader = (ordinal, indices, error, batches, None)
            return
        self._finish()
        self.rec._loading_failure = (self.step - 1, ordinal, own, indices, batches, error)

    def _between_steps(self):
        """Whether a training loader's steps are recorded and none is in flight: where another
        loader's batches (a validation pass's) are no step's, and the replay of the steps does not
        run the code that takes them. A second loader iterated inside a step (zip(labelled,
        unlabelled)) is part of that step."""
        return (self.rec is not None and not self.replay and not self.capture_only and self.training_loader is not None
                and self.rec._step is None)

    def loader_ended(self, ordinal):
        """An iterator of loader `ordinal` ran to its end."""
        if ordinal == self.training_loader:
            self.training_loader_done = True
        elif self.other_loader is not None and self.other_loader[0] == ordinal and self.other_loader[2] is None:
            self.other_loader = None

    def training_parameters(self):
        """The ids of the trainable parameters of the training being recorded; None before one is."""
        if self.rec is None or self.capture_only:
            return None
        return {id(p) for g in self.rec.optimizer.param_groups for p in g["params"] if p.requires_grad}

    def on_backward(self, tensors, by="backward()"):
        """After a backward() (or the torch.autograd.grad() call `by` names): the step's loss, when it
        is the step's first backward of a one-element tensor."""
        self.gradients_by = by
        if self.batch_before_optimizer and self.training < 0 and not self.optimizers and not self.manual_looked:
            self.manual_looked = True  # once: a model of bare tensors is not looked for at every backward()
            self._manual_training()
        if self.rec is None or self.capture_only:
            if self.training < 0 and not self.replay:
                # Its crash is recorded from the first backward on; one backward (a sanity check
                # before the loop) is not yet a training without a DataLoader: the second says so.
                self.loaderless_backwards += 1
                if self.rec is None:
                    self._start(None)
                if self.loaderless_backwards == 2 and self.batch_before_optimizer and not self.optimizers:
                    self.warn("no-model", f"{by} runs on DataLoader batches, but no torch.optim optimizer was made "
                              "and no nn.Module's parameters got gradients (a model of bare tensors?): crashcap has "
                              "no model to record, and records nothing of this training. Keep its parameters in an "
                              "nn.Module, or give them to a torch.optim optimizer")
                elif self.loaderless_backwards == 2:
                    came = ("no DataLoader batch came with gradients enabled since the optimizer was made (those "
                            "before it were drawn ahead: a list of the loader's batches, trained on from the list, is "
                            "one way), so crashcap sees no step begin" if self.batch_before_optimizer else
                            "no DataLoader batch came before it with gradients enabled: this training makes its own "
                            "batches")
                    self.warn("no-loader", f"{by} runs, but {came}, and records no steps (no batches, weights or "
                              "replay); it keeps the crash with its Python traceback, the last ops and the "
                              "environment. To record its steps, use crashcap.Recorder's `with rec.step(i, ...)` "
                              "(docs/PYTHON.md)")
            return
        if self.in_flight is None:
            return
        self.backwards += 1
        if self.ended:
            if self.backwards == 2:
                self.warn("backwards", f"step {self.in_flight} ran {by} more than once; the first one's loss is "
                          f"the step's fingerprint, and a later one's NaN/Inf loss is the step's failure as the "
                          f"first one's would be")
            self._later_backward(tensors)
            return
        if not isinstance(tensors, torch.Tensor) or tensors.numel() != 1:
            return
        self.ended = True
        if self.keep_going and not self.sealed_nonfinite and tensors.device.type == "cpu":
            value = float(tensors.detach().reshape(()))
            if not math.isfinite(value):
                # --nonfinite record: the first non-finite loss still leaves a bundle at its step,
                # as the raise policy's would; the training goes on, into a fresh recording.
                self.sealed_nonfinite = True
                self.rec._native.fail("nonfinite", "NonFiniteError",
                                      f"non-finite loss at step {self.in_flight}: {value} (recorded; the training "
                                      f"went on: --nonfinite record)", _api._recorder._stack_here(), "forward")
        self.rec.end(tensors)  # a NonFiniteError here is the training's, not crashcap's

    def on_graph_freed(self, tensors, by, frees):
        """After a backward() (or the grad() call `by` names) that `frees` its graph's saved values:
        its roots, held until the next such call (its nodes, not the values it freed), so that a later
        one that fails going through them can say which graph it reached. A call that keeps its graph
        (retain_graph; create_graph unless retain_graph=False) frees nothing and leaves the hold."""
        if frees:
            self.freed_graph = (_graph_roots(tensors), self.in_flight, by)

    def freed_graph_note(self, tensors, by):
        """A backward() (or the grad() call `by` names) failed on a graph whose saved values were
        freed: how much of the graph the last one freed it reached, and where it went in; None where
        it reached none of it."""
        if self.freed_graph is None:
            return None
        roots, step, freed_by = self.freed_graph
        old = _graph_nodes(roots)
        entries, _ = _graph_nodes(_graph_roots(tensors), stop=old)
        if not entries:
            return None
        if step is None:
            whose = f"the {freed_by} before it"
        elif step == self.in_flight:
            whose = f"this step's (step {step}'s) earlier {freed_by}"
        else:
            whose = f"step {step}'s {freed_by}"
        started = [node for node, parent in entries.values() if parent is None]
        if started:  # a root of this call is a node of the freed graph: the same tensor, again
            return (f"crashcap: this {by} starts from a tensor whose graph {whose} already went through and "
                    f"freed (at its node {type(started[0]).__name__}): the same loss given to backward() twice? "
                    f"Call it once, or pass retain_graph=True to the earlier call if twice is meant")
        shared = _graph_nodes([node for node, _ in entries.values()])
        where = ", ".join(f"{type(node).__name__} (from {type(parent).__name__})"
                          for node, parent in list(entries.values())[:3])
        holders = (_program_names_holding(entries.keys())  # a tensor this call went into the freed graph by
                   or _program_names_holding(old.keys() - {id(root) for root in roots}))  # the loss is no carrier
        return (f"crashcap: this {by} reached {len(shared)} node{'' if len(shared) == 1 else 's'} of the "
                f"graph that {whose} freed, entering it at {where}: a tensor made before that call and used "
                f"again since still holds its graph{holders} (an RNN's hidden state carried from step to step, a "
                f"running total of losses, a generator's output that a discriminator's backward() went through). "
                f"Detach it where it is kept (h = h.detach(), fake.detach()), keep a number (loss.item()), or pass "
                f"retain_graph=True to the earlier call if going through the graph twice is meant")

    def _manual_training(self):
        """backward() ran on a DataLoader batch and no optimizer exists: the program updates its
        weights itself. The parameters that backward() gave gradients are the training's, under a
        _ManualUpdate, and recording begins at the next batch (as for an optimizer made inside the
        loop); the same happens in a replay, which takes the recorded batches over from there."""
        params = _parameters_with_gradients()
        if not params:
            return
        self.manual_update = _ManualUpdate(params)
        self.on_optimizer(self.manual_update)

    def _later_backward(self, loss):
        """A backward() of the step after the one that ended it: a non-finite loss here fails the step
        (a second loss backpropagated apart, a GAN's generator after its discriminator), as it would
        at the first; else the update would carry it into the weights unrecorded."""
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.device.type != "cpu":
            return
        if self.replay:
            self.rec._replay.later_backward(loss)
            return
        value = float(loss.detach().reshape(()))
        if math.isfinite(value) or self.sealed_nonfinite:
            return
        step = self.in_flight
        text = f"non-finite loss at step {step}: {value} (its backward() #{self.backwards}"
        if self.updates:
            text += f", after {self.updates} optimizer step{'s' if self.updates > 1 else ''} on its batch"
        text += "; the first one's loss was finite)"
        text += (" (recorded; the training went on: --nonfinite record)" if self.keep_going else
                 " (crashcap stopped the step before optimizer.step(); --nonfinite record lets the training go on)")
        self.sealed_nonfinite = True
        self.rec._native.fail("nonfinite", "NonFiniteError", text, _api._recorder._stack_here(), "forward")
        if not self.keep_going:
            raise _api.NonFiniteError(text)  # the training's, as the first backward's would be

    def before_optimizer_step(self, optimizer):
        """In a replay, before an update: the target step, left open for its later backward() calls,
        ends here, before the update changes the weights."""
        replay = getattr(self.rec, "_replay", None) if self.rec is not None else None
        if self.in_flight is not None and replay is not None:
            replay.before_update()

    def on_optimizer_step(self, optimizer):
        if self.in_flight is not None:
            self.updates += 1
            if self.updates == 1:
                self.updated = {id(optimizer)}
            elif id(optimizer) not in self.updated:
                self.updated.add(id(optimizer))
            elif not self.replay:
                self._updated_again(optimizer)
            # The step's computation ends with its update: what the loop runs after it (the
            # scheduler, a validation pass, a checkpoint, logging) is between steps, and a crash
            # there is after the step, not in it. Of several optimizers, which updates last is
            # not known: the step stays in flight until the next batch.
            if self.rec is not None and not self.replay and self.rec.optimizer is optimizer:
                self.rec._finish_step()

    def _updated_again(self, optimizer):
        self.warn("updates", f"{type(optimizer).__name__}.step() ran again in step {self.in_flight} before "
                  f"DataLoader #{self.training_loader} gave another batch: a loop that updates the weights more than "
                  f"once on a batch (one batch drawn for many updates, an inner loop) has every update on it recorded "
                  f"as step {self.in_flight}; its replay ends at the step's first update, so a failure after a later "
                  f"one is recorded, but does not reproduce")

    def _finish(self):
        if self.rec is not None and self.in_flight is not None and not self.replay:
            self.rec._finish_step()
        self.in_flight = None

    # ---- trainings one after another in one process ------------------------------------------

    def new_training(self, directory):
        """Ends the training recorded so far and records the next one into `directory`
        (crashcap.optuna's trials in one process): only the optimizers, schedulers and loaders
        made from now on are the new training's."""
        self._finish()
        self.end_training(remove=True)
        self.policy["directory"] = directory
        self.claimed = len(self.optimizers)
        self.training_over = True
        self.failed = None
        self.said, self.pending_warnings = set(), []
        self._reset_steps()

    def end_training(self, remove=False):
        """Closes the recording of the training that ended; with `remove`, a clean one's recording
        is removed (the trials of a study in one process)."""
        rec, self.rec = self.rec, None
        stopped, self.stopped_dir = self.stopped_dir, None
        self.training_loader = None
        self.training_iterator = self.worker_death = self.other_loader = None
        self.freed_graph = None
        if rec is None or rec._native is None:
            if remove and stopped and os.path.isdir(stopped):  # closed clean by stop(): nothing crashed in it
                shutil.rmtree(stopped, ignore_errors=True)
            return
        crashed = bool(rec.crash_bundle)
        directory = rec.recording_dir
        if remove or self.capture_only:
            rec._durable_close = False  # removed below unless it crashed (the bundle is sealed apart)
        rec.close()
        if (remove or self.capture_only) and not crashed and directory and os.path.isdir(directory):
            shutil.rmtree(directory, ignore_errors=True)
        self.capture_only = False

    def fail(self, exc):
        """Records `exc` as the training's crash; the bundle ("" when nothing was recording)."""
        if self.rec is None or self.rec._native is None:
            return ""
        return self.rec.fail(exc) or self.rec.crash_bundle  # a NaN loss sealed its bundle when it raised

    def crash_step(self):
        return self.in_flight

    # ---- the recorder -----------------------------------------------------------------------

    def _training(self):
        """(model, optimizer, scheduler, scaler, words) of the training about to begin: its
        optimizers are those no earlier training claimed. None without one."""
        optimizers = self._new_optimizers()
        if not optimizers:
            return None
        if len(optimizers) == 1:
            optimizer = optimizers[0]
        else:
            optimizer = _Optimizers(optimizers)
            self.warn("optimizers", f"{len(optimizers)} optimizers ({', '.join(type(o).__name__ for o in optimizers)}): "
                      f"the recording keeps them all; each step's fingerprint is the loss of its first backward()")
        params = [p for o in optimizers for g in o.param_groups for p in g["params"]]
        model, words = _model_of(params)
        ours = {id(o) for o in optimizers}
        schedulers = [s for s, o in ((s(), o()) for s, o in self.schedulers) if s is not None and id(o) in ours]
        scalers = [s for s in self.live(self.scalers) if getattr(s, "_enabled", True)]
        scheduler = schedulers[0] if len(schedulers) == 1 else (_Several(schedulers) if schedulers else None)
        scaler = scalers[0] if len(scalers) == 1 else (_Several(scalers) if scalers else None)
        return model, optimizer, scheduler, scaler, words

    def _begin_training(self):
        """The optimizers no training had become the new training's."""
        self.claimed = len(self.optimizers)
        self.training += 1
        self.training_over = False
        self._reset_steps()

    def _start(self, ordinal):
        """Starts recording the training whose steps come from DataLoader `ordinal` (None: a
        training without one, whose crash only is recorded). False when there is no optimizer."""
        training = self._training()
        if training is None:
            return False
        model, optimizer, scheduler, scaler, words = training
        if ordinal is not None:
            self._begin_training()
            self.training_loader = ordinal
            if optimizer is self.manual_update:
                self.warn("manual-update", f"{self.gradients_by} ran on a DataLoader batch and no torch.optim optimizer was made: "
                          f"the program updates the weights itself? crashcap records {words} (the modules whose "
                          f"parameters got gradients) as the model, from this batch on; a keyframe holds their "
                          f"weights, and not what the update keeps of its own (a momentum buffer, a learning rate "
                          f"computed from its counters)")
        self.capture_only = ordinal is None
        facts = [("python.capture", "observed"), ("python.observed.loader", "none" if ordinal is None else str(ordinal)),
                 ("python.observed.training", str(self.training)), ("python.observed.model", words)]
        facts += self.launch_facts
        policy = {k: v for k, v in self.policy.items() if k != "directory"}
        if scaler is not None and "check_gradients" not in policy:
            # A GradScaler's scaled gradients overflow to Inf by design (it skips that update and
            # lowers the scale): only a non-finite loss stops the step.
            policy["check_gradients"] = False
        self.rec = _api.Recorder(self.policy.get("directory") or None, model=model, optimizer=optimizer,
                                 scheduler=scheduler, grad_scaler=scaler, _facts=facts, _observed=True, **policy)
        self.rec._durable_close = self.keep_clean and not self.capture_only
        for text in self.pending_warnings:
            self.rec.warn(text, _print=False)  # said already
        self.pending_warnings = []
        # A training that made its optimizer after its loader's first batch (a lazy module sized by
        # a forward pass) is recorded from its next batch on, as said; until then only its crash is
        # kept, and that is no training "without a DataLoader" to announce.
        if self.rec._native is not None and not self.quiet and not (ordinal is None and self.batch_before_optimizer):
            source = f"from DataLoader #{ordinal}" if ordinal is not None else "(its crash only: no DataLoader)"
            which = f"training {self.training} of this process" if self.training > 0 else "this training"
            _say(f"recording {which} {source}: model {words}, optimizer "
                 f"{getattr(optimizer, '_crashcap_kind', type(optimizer).__name__)}, into {self.rec.recording_dir}")
        return True

    # ---- replay -----------------------------------------------------------------------------

    def replay_iter(self, ordinal, loader):
        """DataLoader.__iter__ in a replay, gradients enabled: the recorded batches when this loader
        begins the recorded training (or is its loader); None for the loader's own (the trainings
        before the recorded one run as the program runs them)."""
        if self.replay_steps is not None:
            if ordinal != self.training_loader:
                return None
            self.rec._replay.loader = loader  # the training loader iterated again (another epoch)
            return self.replay_steps
        if not self.begins_training():
            return None
        training = self._training()  # before the claim: the optimizers it claims
        self._begin_training()
        if self.replay_training is None:
            self.replay_training = _recorded_training()
        if self.training != self.replay_training:
            return None
        self.replay_steps = self._replay_iterator(ordinal, training, loader)
        return self.replay_steps

    def _replay_iterator(self, ordinal, training, loader):
        model, optimizer, scheduler, scaler, _ = training
        self.rec = _api.Recorder(None, model=model, optimizer=optimizer, scheduler=scheduler, grad_scaler=scaler,
                                 _observed=True)
        driver = self.rec._replay
        if driver is None:
            raise RuntimeError("the replay request was taken before the training loop (by another crashcap.Recorder?)")
        recorded = driver.session.environment_fact("python.observed.loader")
        if recorded and recorded != str(ordinal):
            driver._refuse(_api._replay._error(
                "invalid-argument", f"the recording's steps came from DataLoader #{recorded}, and this run's training "
                f"{self.training} iterates DataLoader #{ordinal} first: the program makes its loaders in another order "
                f"than when it recorded"))
        self.training_loader = ordinal
        driver.loader = loader  # what a loading crash's replay loads the batch that never came with
        driver.observed = True
        return self._replayed(self.rec.steps(None))

    def _replayed(self, steps):
        for step, batch in steps:
            self.in_flight, self.ended, self.backwards, self.updates = step, False, 0, 0
            yield batch


def _recorded_training():
    """The number of the training the replayed recording holds (python.observed.training; 0 for
    a recording made before trainings were counted)."""
    try:
        with open(os.environ[REPLAY_REQUEST_VARIABLE]) as f:
            bundle = json.load(f)["bundle"]
        return int(_api._native.bundle_fact(bundle, "python.observed.training") or 0)
    except (OSError, KeyError, ValueError):
        return 0


def _refuse_replay(code, message, hint=""):
    """Ends a replay that cannot begin, with its reason as the outcome."""
    request = _api._replay.take_request()
    if request is not None:
        _api._native.write_replay_error(request["text"], code, message, hint)
    _api._replay._end(3)


def quiet_dataloader_workers():
    """DataLoader worker processes (forked: they inherit LibTorch's op callbacks) run their ATen ops
    without RecordFunction: crashcap records none of a worker's ops, and with its callback
    registered every op of every sample would pay for it (measured: 2.6 against 2.1 us for a small
    op). A spawned worker starts the original function."""
    from torch.utils.data._utils import worker
    loop = worker._worker_loop
    if getattr(loop, "_crashcap_quiet", False):
        return

    @functools.wraps(loop)
    def _worker_loop(*args, **kwargs):
        _api._native.stop_observing_ops_in_this_thread()
        return loop(*args, **kwargs)

    _worker_loop._crashcap_quiet = True
    worker._worker_loop = _worker_loop


def _replay_never_began():
    """At exit in a replay whose loop never came: the reason, as the replay's outcome."""
    if _observer.rec is None and not _api._recorder._user_recorder_made and REPLAY_REQUEST_VARIABLE in os.environ:
        _refuse_replay("invalid-argument", f"the program ended without iterating a DataLoader with gradients enabled "
                       f"(it made {_observer.loaders}), so crashcap had no training loop to replay the recording in",
                       "run the replay with the arguments and files the recording ran with (`crashcap inspect B` "
                       "shows its command line); the program may have stopped early, before its training loop")


def _holds_rows(tensor, rows):
    """Whether `tensor` holds `rows` samples in its first or second dimension (the rule the
    recorder applies to find each tensor's rows: formats::rowDimensions; a [1, N] tensor is one
    broadcast row, not N samples)."""
    if tensor.dim() > 0 and tensor.size(0) == rows:
        return True
    return tensor.dim() > 1 and tensor.size(0) > 1 and tensor.size(1) == rows


def _in_training_mode(model):
    """Whether the model's modules are in training mode (model.train()), not eval."""
    modules = [m for m in model.modules() if not isinstance(m, _Roots)]
    return any(m.training for m in modules) if modules else True


def _weak(obj):
    """A weak reference to `obj`, or None (None, or an object that takes none)."""
    try:
        return weakref.ref(obj) if obj is not None else None
    except TypeError:
        return None


def _guarded(fn):
    """Runs an observer seam; an error of crashcap's own stops the observer, never the training.
    crashcap.NonFiniteError (the training's loss) passes through."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if _observer is None or not _observer.here():
            return None
        with _observer.lock:  # the stop too: no other thread is in a seam while it closes the recording
            if _observer.failed is not None:  # stopped while this thread waited for the lock
                return None
            try:
                return fn(*args, **kwargs)
            except _api.NonFiniteError:
                raise
            except Exception as e:
                if _raised_by_a_signal_handler(e):
                    raise  # the program's, raised in crashcap's code only because the signal came then
                _observer.stop(e)
                return None
    return run


_handler_codes = set()  # the code of each signal handler the program installed since crashcap's install


def _add_handler_codes(handler, codes, depth=0):
    """The code objects a call of signal handler `handler` runs first: a function's or method's; a
    callable object's __call__ (a framework's handler that calls several in turn); a
    functools.partial's function; a decorated function's __wrapped__."""
    if handler is None or depth > 4:
        return
    code = getattr(handler, "__code__", None)
    if code is not None:
        codes.add(code)
    elif callable(handler) and not isinstance(handler, type):
        _add_handler_codes(getattr(type(handler), "__call__", None), codes, depth + 1)
    _add_handler_codes(getattr(handler, "func", None), codes, depth + 1)
    _add_handler_codes(getattr(handler, "__wrapped__", None), codes, depth + 1)


def _raised_by_a_signal_handler(error):
    """Whether a Python signal handler of the program raised `error` (the DataLoader's SIGCHLD
    handler raises a worker's death; a cluster's preemption handler, its own error). A handler runs
    wherever the main thread is when the signal comes, in crashcap's seams too: its error is the
    training's, not crashcap's. The handlers are those installed now and every one the program
    installed since crashcap began (a handler that puts the default back before it raises)."""
    codes = set(_handler_codes)
    for number in signal.valid_signals():
        try:
            _add_handler_codes(signal.getsignal(number), codes)
        except (ValueError, OSError):
            continue
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


def _take_index(iterator):
    """The sampler's draw for the batch the iterator gives (or failed to give) now; None unknown."""
    queue = getattr(iterator, "_crashcap_indices", None)
    return queue.popleft() if queue else None


def _underlying_indices(dataset, indices):
    """`indices` into `dataset`, as indices into the dataset under its Subsets (random_split, a
    fold): the samples' places in the data the program loads, not in a view of it."""
    try:
        while isinstance(dataset, torch.utils.data.Subset):
            indices = [operator.index(dataset.indices[i]) for i in indices]
            dataset = dataset.dataset
    except (TypeError, IndexError):
        pass  # a Subset whose indices are not plain integers: its own places
    return indices


def _seen_failure(iterator, error):
    index = _take_index(iterator)
    # A worker that died (a signal, the OOM killer) may have been loading any batch the workers had
    # drawn ahead, not the one awaited: those are kept too.
    queue = getattr(iterator, "_crashcap_indices", None)
    ahead = list(queue) if queue and _api._replay.worker_died(error) else []
    _loading_failed(iterator, index, ahead, error)


@_guarded
def _loading_failed(iterator, index, ahead, error):
    own = _indices_of(iterator, index, underlying=False)
    batches, first = 1, len(own or ())
    if own is not None:
        more, count = _drawn_batches(iterator, ahead)
        own, batches = own + more, batches + count
    _observer.on_loading_failed(getattr(iterator, "_crashcap_loader", -1), own,
                                None if own is None else _underlying_indices(getattr(iterator, "_dataset", None), own),
                                (batches, first), error)


def _drawn_batches(iterator, draws):
    """The indices into the loader's dataset of the batches the sampler drew as `draws`, one after
    another, as far as each is known, and how many batches they are."""
    own, batches = [], 0
    for draw in draws:
        more = _indices_of(iterator, draw, underlying=False)
        if more is None:
            break
        own, batches = own + more, batches + 1
    return own, batches


def batches_in_flight(rec, exc):
    """When `exc` is, or came from, the error the DataLoader's SIGCHLD handler raised for a dead
    worker of the training loader that `rec` records: (the loader's ordinal, the indices into its
    dataset of the batches its workers drew ahead and the loop has not had yet, the same in the
    data under any Subset, how many batches they are; None, None, 0 when those are not known);
    else None. A worker that dies while the loop runs a step (not waiting in the loader) is seen by
    that handler, which raises in the step: the sample that killed it is in one of these batches,
    not in the step's. They are taken as the handler raises (_seen_worker_death), while the loop's
    iterator lives: by the time the error ends the program, it is gone. Another error of the step,
    raised while a worker lay dead, is the step's."""
    observer = _observer
    if observer is None or rec is None or observer.rec is not rec or observer.worker_death is None:
        return None
    error, drawn = observer.worker_death
    return drawn if _api._recorder._in_chain(error, exc) else None


def _other_loader(rec, exc):
    """The observer's other_loader when the crash of the training `rec` by `exc`, between its
    steps, owes to it (other_loader_note); None when it owes nothing to another loader."""
    observer = _observer
    if observer is None or rec is None or observer.rec is not rec or observer.other_loader is None:
        return None
    if rec._step is not None:
        return None  # a step's crash: the other loader's batch came before that step began
    error = observer.other_loader[2]
    if error is not None and not _api._recorder._in_chain(error, exc):
        return None
    return observer.other_loader


def other_loader_batch(rec, exc):
    """The batch the program took last from the other loader the crash owes to (other_loader_note),
    for the bundle, as the training's batches are kept: (the loader's number, its tensors and their
    structure as flatten() gives them, with its samples' dataset indices as "index" where its rows
    are theirs, and its number of samples, -1 unknown). None when the crash owes nothing to a batch
    taken from another loader (one that failed to load has no batch)."""
    other = _other_loader(rec, exc)
    if other is None or other[2] is not None or other[4] is None:
        return None
    ordinal, indices, _, _, batch = other
    extra, rows = _sample_rows(batch, indices)
    tensors, structure = _api._batch.flatten(batch, extra)
    return ordinal, tensors, structure, -1 if rows is None else rows


def _sample_rows(batch, indices):
    """(extra, rows) for recording `batch`, whose sampler drew the dataset `indices` (None: not
    known): where they are its samples, each tensor's rows are found by their count (or each
    sample's own tensors, in a list of one item per sample, by the item) and each row's dataset
    index is kept beside them as "index" (made only when kept); else ((), None)."""
    if indices is not None and (any(_holds_rows(t, len(indices)) for t in _api._batch.tensors_of(batch))
                                or _api._batch.holds_samples(batch, len(indices))):
        return (("index", lambda: torch.tensor(indices, dtype=torch.int64)),), len(indices)
    return (), None


def other_loader_note(rec, exc, shown=64):
    """What a crash of the training `rec` between its steps owes to a DataLoader other than the
    training's (a validation loader's), for the crash's text; None when nothing. Its batches are no
    step's, and a replay of the steps does not run the code that takes them; what is known is which
    samples it was on: the batch it raised `exc` (or the error `exc` came from) loading, with those
    its workers drew ahead when one died, else the batch the program took from it last, its
    iteration not run to its end (a loop over it running, or left with `break`)."""
    other = _other_loader(rec, exc)
    if other is None:
        return None
    ordinal, indices, error, batches, _ = other
    observer = _observer

    def listed(part):
        more = f", … ({len(part)} in all)" if len(part) > shown else ""
        return f"[{', '.join(str(i) for i in part[:shown])}{more}]"

    where = f"DataLoader #{ordinal} (not the training's #{observer.training_loader})"
    tail = "; a replay of the steps does not run the code that takes its batches"
    if error is not None:
        if not indices:
            return f"{where} raised it while loading a batch whose dataset indices are not known{tail}"
        count, first = batches or (1, len(indices))
        ahead = (f", with the {count - 1} batch{'es' if count > 2 else ''} its workers drew ahead, of dataset indices "
                 f"{listed(indices[first:])} (the worker that died may have been loading any of them)"
                 if count > 1 else "")
        return f"{where} raised it while loading its batch of dataset indices {listed(indices[:first])}{ahead}{tail}"
    samples = f"of dataset indices {listed(indices)}" if indices else "(its dataset indices are not known)"
    return (f"the last batch the program took before the crash came from {where}, {samples}, and that loader's "
            f"iteration had not run to its end (a validation pass?){tail}")


@_guarded
def _seen_worker_death(error):
    drawn = None if _observer.replay else _loading_ahead(_observer, _api._state.worker_death_pids(str(error)))
    if drawn is not None:
        _observer.worker_death = (error, drawn)


def _loading_ahead(observer, pids):
    """batches_in_flight() of the training loader's live iterator, when one of `pids` is its
    worker and it has drawn batches the loop has not had; else None."""
    iterator = observer.training_iterator() if observer.training_iterator is not None else None
    if iterator is None or getattr(iterator, "_crashcap_loader", -1) != observer.training_loader:
        return None
    workers = {getattr(w, "pid", None) for w in getattr(iterator, "_workers", None) or ()}
    if not workers & set(pids):
        return None  # another loader's worker (a validation loader's): not the training's batches
    draws = list(getattr(iterator, "_crashcap_indices", None) or ())
    if not draws:
        return None  # no batch was being loaded (idle persistent workers, the epoch's last batch given)
    own, batches = _drawn_batches(iterator, draws)
    if not batches:  # an IterableDataset's (its sampler draws no indices): the loading's all the same
        return iterator._crashcap_loader, None, None, 0
    return iterator._crashcap_loader, own, _underlying_indices(getattr(iterator, "_dataset", None), own), batches


def _indices_of(iterator, index, underlying=True):
    """The dataset indices of the batch the sampler drew as `index`, in the data under any Subset
    (`underlying=False`: in the loader's own dataset); None when they are not known. A loader that
    hands batches out as they come (in_order=False, torch 2.6) breaks the pairing of each batch
    with the index drawn for it: none then."""
    if index is None or not getattr(iterator, "_in_order", True):
        return None
    indices = _dataset_indices(index)
    if indices is None or not underlying:
        return indices
    return _underlying_indices(getattr(iterator, "_dataset", None), indices)


def _dataset_indices(index):
    """The sampler's draw for one batch as a list of ints (numpy's and torch's included), or None
    (an IterableDataset's None, a custom sampler's tuples or strings)."""
    items = list(index) if isinstance(index, (list, tuple)) else [index]
    try:
        out = [operator.index(i) for i in items if not isinstance(i, bool)]
    except TypeError:
        return None
    return out if out and len(out) == len(items) else None


_iterations = itertools.count()  # a number for each iteration of a loader: per iterator, and per epoch of one


@_guarded
def _seen_batch(iterator, batch):
    if _api._recorder._user_recorder_made:
        return  # the program records itself
    iteration = getattr(iterator, "_crashcap_iteration", None)
    first = getattr(iterator, "_crashcap_first", False)
    iterator._crashcap_first = False
    ordinal = getattr(iterator, "_crashcap_loader", -1)
    indices, dataset = _indices_of(iterator, _take_index(iterator)), getattr(iterator, "_dataset", None)
    _observer.on_batch(ordinal, indices, batch, dataset, None if iteration is None else (iteration, first))
    if _observer.cycles:
        _observer.last_batch = (id(batch), (ordinal, indices, dataset))
    if ordinal == _observer.training_loader and ordinal >= 0:
        _observer.training_iterator = weakref.ref(iterator)
        _observer.worker_death = None  # a death the program caught, and went on from


_cycle = getattr(itertools.cycle, "_crashcap_real", itertools.cycle)  # not the bootstrap's stand-in


class _ObservedCycle(_cycle):
    """itertools.cycle, as the program gets it: over a DataLoader (or one's iterator), the same
    items in the same order (the base class keeps the first pass's items and hands them out
    again), and each batch handed out again is told to the observer as the loader's batch it
    was, a step of the samples it held the first time. A step-based loop over cycle(loader) trains
    on the first epoch's batches over and over; without this its later steps would look like
    backward() calls of the loader's last batch. Over anything else: itertools.cycle itself."""

    def __new__(cls, iterable, /):
        from torch.utils.data import dataloader
        if (_observer is None or not _observer.here()
                or not isinstance(iterable, (dataloader.DataLoader, dataloader._BaseDataLoaderIter))):
            return _cycle(iterable)
        with _observer.lock:
            _observer.cycles += 1
        self = super().__new__(cls, iterable)
        self._crashcap_held = {}  # id(batch): what the observer was told of it the first time (the cycle keeps it alive)
        self._crashcap_pass = None  # (the iteration number of this pass, id of the first batch)
        return self

    def __next__(self):
        item = super().__next__()
        _seen_cycled(self, item)
        return item


@_guarded
def _seen_cycled(cycle, item):
    if _api._recorder._user_recorder_made:
        return  # the program records itself
    key, held = id(item), cycle._crashcap_held
    seen, _observer.last_batch = _observer.last_batch, None  # told once: no later item matches it by a reused id
    if key not in held:
        if seen is not None and seen[0] == key:  # the loader gave it just now: its first pass
            held[key] = seen[1]
            if cycle._crashcap_pass is None:
                cycle._crashcap_pass = (None, key)
        return
    ordinal, indices, dataset = held[key]
    first = key == cycle._crashcap_pass[1]
    if first:
        cycle._crashcap_pass = (next(_iterations), key)
    _observer.on_batch(ordinal, indices, item, dataset, (cycle._crashcap_pass[0], first))


def _replay_takes_over(iterator):
    """In a replay, the recorded batches from this batch of a live iteration on, when the recording
    began here: the optimizer was made after the iteration began (after a forward pass sized a lazy
    module), so the recording began at the first batch after it (on_batch), not with the iteration."""
    ordinal = getattr(iterator, "_crashcap_loader", None)
    ref = getattr(iterator, "_crashcap_loader_ref", None)
    loader = ref() if ref is not None else None
    if (ordinal is None or ordinal < 0 or loader is None or not _observer.here() or not torch.is_grad_enabled()
            or _api._recorder._user_recorder_made):
        return None
    try:
        with _observer.lock:
            if _observer.replay_steps is not None or not _observer.begins_training():
                return None
            steps = _observer.replay_iter(ordinal, loader)
    except Exception as e:  # crashcap's own: the replay cannot go on, and says why
        _refuse_replay("internal", f"crashcap could not drive the replay: {type(e).__name__}: {e}")
    iterator._crashcap_replayed = steps
    return steps


@_guarded
def _seen_end(iterator):
    _observer.loader_ended(getattr(iterator, "_crashcap_loader", -1))


def _graph_roots(tensors):
    """The autograd nodes a backward() over `tensors` (one or a sequence) starts from."""
    tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    return [t.grad_fn for t in tensors if isinstance(t, torch.Tensor) and t.grad_fn is not None]


def _program_names_holding(nodes):
    """', as `fake` does (File "train.py", line 12, in <module>)': the variables of the program's
    innermost frame (the first outside torch and crashcap) whose tensor's own graph node is one of
    `nodes`, in a tuple, list or dict value too; "" where none is."""
    skip = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(__file__) + os.sep)
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
    if frame is None:
        return ""
    names = []
    for name, value in frame.f_locals.items():
        values = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else [value]
        if any(isinstance(v, torch.Tensor) and v.grad_fn is not None and id(v.grad_fn) in nodes for v in values):
            names.append(f"`{name}`")
    if not names:
        return ""
    return (f", as {', '.join(names[:4])} {'does' if len(names) == 1 else 'do'} (File \"{frame.f_code.co_filename}\", "
            f"line {frame.f_lineno}, in {frame.f_code.co_name})")


def _graph_nodes(roots, stop=None, limit=1_000_000):
    """The autograd nodes reachable from `roots`, by id, leaves' gradient accumulators left out (a
    parameter's is in every step's graph). With `stop` (such a dict), the walk does not go into its
    nodes: (the nodes of `stop` it reached, each with the node it came from; the nodes it went
    through)."""
    seen, entries = {}, {}
    todo = [(node, None) for node in roots]
    while todo and len(seen) < limit:
        node, parent = todo.pop()
        if id(node) in seen or id(node) in entries or type(node).__name__ == "AccumulateGrad":
            continue
        if stop is not None and id(node) in stop:
            entries[id(node)] = (node, parent)
            continue
        seen[id(node)] = node
        todo.extend((n, node) for n, _ in node.next_functions if n is not None)
    return seen if stop is None else (entries, seen)


@_guarded
def _seen_freed_graph(tensors, error, by="backward()"):
    """backward() raised: where it failed on a graph an earlier backward() freed, the error says so."""
    if "backward through the graph a second time" not in str(error):
        return
    try:
        note = _observer.freed_graph_note(tensors, by)
    except Exception:  # a hint only: an error of its own must not stop the recording of the crash under way
        return
    if note is None:
        return
    if hasattr(error, "add_note"):  # Python 3.11: printed under the error, and kept with it in the bundle
        error.add_note(note)
    else:
        _observer.warn("freed-graph", note[len("crashcap: "):])


@_guarded
def _seen_backward(tensors, by="backward()", frees=True):
    _observer.on_graph_freed(tensors, by, frees)
    if not _api._recorder._user_recorder_made or _observer.rec is not None:
        _observer.on_backward(tensors, by)


@_guarded
def _seen_grad(outputs, inputs, grads, keeps_graph, frees):
    """After torch.autograd.grad(): a training that takes its gradients so, and sets them or updates
    with them itself, ends its step here as at backward(), when the output is one element and the
    inputs are the training's parameters (all of them, once its optimizers are known). Left alone:
    a call that keeps its graph (`keeps_graph`: create_graph, for a higher derivative, a gradient
    penalty, a meta-learner's inner loop; or retain_graph, for a backward() or grad() still to come,
    as an adaptive loss weight's gradient for the last layer is), one for a part of the parameters
    (another model's, a copy's) and one for inputs that are no parameters (a saliency map): each is
    a part of a computation, not the step's gradients. While crashcap reads the step's gradient
    norm (and, in a training with no optimizer, which parameters train) those parameters hold the
    gradients the call returned; their own .grad is theirs again before the program goes on."""
    _observer.on_graph_freed(outputs, "torch.autograd.grad()", frees)
    if keeps_graph:
        return
    outputs = (outputs,) if torch.overrides.is_tensor_like(outputs) else outputs
    inputs = (inputs,) if torch.overrides.is_tensor_like(inputs) else inputs
    if len(outputs) != 1 or not isinstance(outputs[0], torch.Tensor) or outputs[0].numel() != 1:
        return  # not a loss: on_backward would not take it either
    pairs = [(p, g) for p, g in zip(inputs, grads) if isinstance(p, torch.nn.Parameter)]
    ids = {id(p) for p, _ in pairs}
    if not pairs or len(ids) != len(pairs):
        return
    if any(g is not None and g.shape != p.shape for p, g in pairs):
        return  # is_grads_batched: a batch of vector-Jacobian products, not the step's gradients
    training = _observer.training_parameters()
    if training is not None and not training <= ids:
        return
    held = [p.grad for p, _ in pairs]
    try:
        for p, g in pairs:
            p.grad = g
        _seen_backward(outputs[0], "torch.autograd.grad()")
    finally:
        for (p, _), own in zip(pairs, held):
            p.grad = own


# ---- install ---------------------------------------------------------------------------------


def install(policy=None, replay=False):
    """Patches the seams (once per process). `policy`: the Recorder's keywords and `directory`."""
    global _observer
    if _observer is not None:
        return _observer
    _observer = Observer(policy or {}, replay)
    quiet_dataloader_workers()  # before the first loader starts its workers
    if replay:
        atexit.register(_replay_never_began)
    from torch.utils.data import dataloader as dl

    loader_init = dl.DataLoader.__init__

    @functools.wraps(loader_init)
    def DataLoader_init(self, *args, **kwargs):
        loader_init(self, *args, **kwargs)
        if _observer.here():
            object.__setattr__(self, "_crashcap_ordinal", _observer.loaders)
            _observer.loaders += 1

    dl.DataLoader.__init__ = DataLoader_init
    # A step-based loop over cycle(loader) (_ObservedCycle): through the bootstrap's stand-in, which
    # a program that imported it before torch holds.
    # (An observer installed without it, in a study's own process, leaves itertools.cycle alone.)
    if getattr(itertools.cycle, "_crashcap_real", None) is not None:
        itertools.cycle.make = _ObservedCycle

    # Modules, as they are made: the model is found among them (_model_of) without a scan of every
    # live object. __setstate__ is how unpickling and copy.deepcopy (an EMA copy) make them.
    for name in ("__init__", "__setstate__"):
        method = torch.nn.Module.__dict__.get(name)
        if method is not None and not getattr(method, "_crashcap_observed", False):
            setattr(torch.nn.Module, name, _after_call(method, _module_made))  # subclasses reach it through super()

    loader_iter = dl.DataLoader.__iter__

    @functools.wraps(loader_iter)
    def DataLoader_iter(self):
        ordinal = getattr(self, "_crashcap_ordinal", None)
        if (_observer.replay and _observer.here() and torch.is_grad_enabled() and ordinal is not None
                and not _api._recorder._user_recorder_made):
            try:
                with _observer.lock:
                    steps = _observer.replay_iter(ordinal, self)
            except Exception as e:  # crashcap's own: the replay cannot go on, and says why
                _refuse_replay("internal", f"crashcap could not drive the replay: {type(e).__name__}: {e}")
            if steps is not None:
                return steps
        if (not _observer.replay and _observer.here() and torch.is_grad_enabled() and ordinal is not None
                and self.num_workers > 0 and not _api._recorder._user_recorder_made):
            # The training's recording may begin at this loader's first batch, after its workers
            # are forked: what it reads of the program's modules is read now, before the fork.
            try:
                with _observer.lock:
                    if _observer.begins_training():
                        _api._state.prepare_before_fork()
            except Exception as e:  # the recording does it when it begins
                if _raised_by_a_signal_handler(e):
                    raise  # the program's

        return loader_iter(self)

    dl.DataLoader.__iter__ = DataLoader_iter

    # A signal handler the program installs is known as one when what it raises comes through
    # crashcap's code (_raised_by_a_signal_handler), even after it has put the default back.
    install_handler = signal.signal

    @functools.wraps(install_handler)
    def signal_signal(signalnum, handler):
        previous = install_handler(signalnum, handler)
        try:
            _add_handler_codes(handler, _handler_codes)
        except Exception:
            pass
        return previous
    signal.signal = signal_signal

    # The DataLoader's SIGCHLD handler raises a worker's death wherever the main thread is; the
    # batches its workers were loading are taken then, while the loop's iterator lives.
    from torch.utils.data._utils import signal_handling
    worker_check = getattr(signal_handling, "_error_if_any_worker_fails", None)
    if worker_check is not None:
        def error_if_any_worker_fails():
            try:
                worker_check()
            except RuntimeError as e:
                _seen_worker_death(e)
                raise
        signal_handling._error_if_any_worker_fails = error_if_any_worker_fails

    base = dl._BaseDataLoaderIter
    iter_init, next_index, reset, next_ = base.__init__, base._next_index, base._reset, base.__next__

    @functools.wraps(iter_init)
    def Iter_init(self, loader, *args, **kwargs):
        self._crashcap_loader = getattr(loader, "_crashcap_ordinal", -1)
        # A replay keeps the loader alive with its iterator: one made in the `for` statement itself
        # is gone by its second batch otherwise, where the replay may take the recorded batches
        # over (_replay_takes_over), and the replay needs the loader then.
        self._crashcap_loader_ref = (lambda: loader) if _observer.replay else weakref.ref(loader)
        self._crashcap_indices = collections.deque()
        self._crashcap_iteration, self._crashcap_first = next(_iterations), True
        iter_init(self, loader, *args, **kwargs)

    @functools.wraps(next_index)
    def Iter_next_index(self):
        index = next_index(self)
        queue = getattr(self, "_crashcap_indices", None)
        if queue is not None and len(queue) < 4096:
            queue.append(index)
        return index

    @functools.wraps(reset)
    def Iter_reset(self, *args, **kwargs):
        queue = getattr(self, "_crashcap_indices", None)
        if queue is not None:
            queue.clear()  # a persistent worker pool starting another epoch
            self._crashcap_iteration, self._crashcap_first = next(_iterations), True
        return reset(self, *args, **kwargs)

    @functools.wraps(next_)
    def Iter_next(self):
        replayed = getattr(self, "_crashcap_replayed", None)
        if replayed is None and _observer.replay:
            replayed = _replay_takes_over(self)
        if replayed is not None:
            return next(replayed)
        try:
            batch = next_(self)
        except StopIteration:
            _seen_end(self)
            raise
        except BaseException as e:
            _seen_failure(self, e)  # the batch whose index was drawn never came (a worker's error)
            raise
        _seen_batch(self, batch)
        return batch

    base.__init__, base._next_index, base._reset, base.__next__ = Iter_init, Iter_next_index, Iter_reset, Iter_next

    backward = torch.autograd.backward

    @functools.wraps(backward)
    def autograd_backward(tensors, *args, **kwargs):
        tensors = tensors if torch.overrides.is_tensor_like(tensors) else tuple(tensors)  # a generator, read once
        try:
            result = backward(tensors, *args, **kwargs)
        except RuntimeError as e:
            _seen_freed_graph(tensors, e)
            raise
        try:
            # backward(tensors, grad_tensors, retain_graph, create_graph, ...)
            retain = kwargs.get("retain_graph", args[1] if len(args) > 1 else None)
            create = kwargs.get("create_graph", args[2] if len(args) > 2 else False)
            _seen_backward(tensors, frees=not (create if retain is None else retain))
        except _api.NonFiniteError as e:
            raise e.with_traceback(None) from None  # raised where backward() was called, not in crashcap
        return result

    torch.autograd.backward = autograd_backward

    grad = torch.autograd.grad

    @functools.wraps(grad)
    def autograd_grad(outputs, inputs, *args, **kwargs):
        # Sequences once, as grad() itself takes them: a generator (model.parameters()) is read
        # by both grad() and crashcap.
        outputs = outputs if torch.overrides.is_tensor_like(outputs) else tuple(outputs)
        inputs = inputs if torch.overrides.is_tensor_like(inputs) else tuple(inputs)
        try:
            result = grad(outputs, inputs, *args, **kwargs)
        except RuntimeError as e:
            _seen_freed_graph(outputs, e, "torch.autograd.grad()")
            raise
        try:
            # grad(outputs, inputs, grad_outputs, retain_graph, create_graph, ...)
            retain = kwargs.get("retain_graph", args[1] if len(args) > 1 else None)
            create = kwargs.get("create_graph", args[2] if len(args) > 2 else False)
            _seen_grad(outputs, inputs, result, retain or create, not (create if retain is None else retain))
        except _api.NonFiniteError as e:
            raise e.with_traceback(None) from None  # raised where grad() was called, not in crashcap
        return result

    torch.autograd.grad = autograd_grad

    optimizer_init = torch.optim.Optimizer.__init__

    @functools.wraps(optimizer_init)
    def Optimizer_init(self, *args, **kwargs):
        optimizer_init(self, *args, **kwargs)
        cls = type(self)
        if not getattr(cls.step, "_crashcap_observed", False):
            cls.step = _observed_step(cls.step)
        _on_optimizer(self)

    torch.optim.Optimizer.__init__ = Optimizer_init

    # Schedulers and GradScalers: torch 2 has LRScheduler beside _LRScheduler, and GradScaler in
    # torch.amp too; a class patched twice (a subclass calling its base) is seen once.
    lr = torch.optim.lr_scheduler
    for name in ("LRScheduler", "_LRScheduler", "ReduceLROnPlateau"):
        if hasattr(lr, name):
            _after_init(getattr(lr, name), _on_scheduler)
    for module in ("torch.cuda.amp", "torch.amp"):
        if hasattr(sys.modules.get(module), "GradScaler"):
            _after_init(sys.modules[module].GradScaler, _on_scaler)
    return _observer


@_guarded
def _on_optimizer(optimizer):
    _observer.on_optimizer(optimizer)


@_guarded
def _on_scheduler(scheduler):
    _observer.on_scheduler(scheduler)


@_guarded
def _on_scaler(scaler):
    _observer.on_scaler(scaler)


@_guarded
def _on_optimizer_step(optimizer):
    _observer.on_optimizer_step(optimizer)


@_guarded
def _before_optimizer_step(optimizer):
    _observer.before_optimizer_step(optimizer)


_step_depth = threading.local()


def _observed_step(step):
    @functools.wraps(step)
    def observed(self, *args, **kwargs):
        depth = getattr(_step_depth, "n", 0)
        if depth == 0 and _observer is not None and _observer.replay:
            _before_optimizer_step(self)
        _step_depth.n = depth + 1
        try:
            result = step(self, *args, **kwargs)
        finally:
            _step_depth.n = depth
        if depth == 0:
            _on_optimizer_step(self)
        return result
    observed._crashcap_observed = True
    return observed


def _after_call(method, seen):
    """`method`, then seen(self); marked so that it is wrapped once."""

    @functools.wraps(method)
    def observed(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        seen(self)
        return result
    observed._crashcap_observed = True
    return observed


def _after_init(cls, seen):
    """Calls seen(instance) after `cls`'s own __init__ (once, however often it is asked)."""
    init = cls.__dict__.get("__init__")
    if init is not None and not getattr(init, "_crashcap_observed", False):
        cls.__init__ = _after_call(init, seen)


def recording_exceptions(fn):
    """`fn`, whose exception is recorded as the training's crash on its way out. For the function a
    rank that torch.multiprocessing.spawn started runs: torch's wrapper around it catches the
    exception, sends its traceback to the launcher and exits 1, so sys.excepthook never sees it."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            try:
                # As the excepthook is called: again if a signal handler (the DataLoader's, as a
                # worker goes) raises into it.
                _api._native.call_despite_signals(_api._recorder.record_uncaught, e)
            except Exception as inner:
                print(f"crashcap: could not record the crash: {inner}", file=sys.stderr)
            raise
    return run


def start_from_environment(spawned=None):
    """Called by the bootstrap once torch is imported: records when `crashcap run --record` asked
    for it (CRASHCAP_OBSERVE: the policy as JSON), or serves a replay request. `spawned`: (function,
    rank, arguments) when torch.multiprocessing.spawn started this process to run them, which its
    recording keeps so that a replay can start it again (crashcap/_spawn.py)."""
    replay = REPLAY_REQUEST_VARIABLE in os.environ
    text = os.environ.get("CRASHCAP_OBSERVE")
    if not replay and text is None:
        return None
    policy = {}
    if text:
        try:
            policy = json.loads(text)
        except ValueError as e:
            _say(f"CRASHCAP_OBSERVE is not JSON ({e}); recording with the default policy")
    observer = install(policy, replay)
    if spawned is not None:
        from . import _spawn
        observer.launch_facts = _spawn.launch_facts(*spawned)
    return observer

