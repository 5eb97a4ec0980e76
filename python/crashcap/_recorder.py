"""crashcap.Recorder: the flight recorder for a PyTorch training written in Python."""

import atexit
import contextlib
import functools
import json
import os
import signal
import sys
import threading
import traceback
import weakref

import torch

from . import _batch, _native, _observe, _state

NonFiniteError = _native.NonFiniteError
Error = _native.Error
NonFiniteError.__module__ = Error.__module__ = "crashcap"  # as the user imports them


def _stack_here():
    """The Python stack of the training thread, innermost first, without crashcap's own frames."""
    frames = [f for f in traceback.extract_stack() if os.path.dirname(f.filename) != os.path.dirname(__file__)]
    return [f'File "{f.filename}", line {f.lineno}, in {f.name}' + (f": {f.line}" if f.line else "")
            for f in reversed(frames)][:128]

_active = None  # the Recorder whose crashes sys.excepthook records (one per process)
# Recorders not closed yet, closed at exit; weakly held, so a program that trains again (the next
# fold, the next trial) frees the last Recorder with its model.
_open = weakref.WeakSet()


@atexit.register
def _close_all():
    for rec in list(_open):
        rec.close()

_user_recorder_made = False  # a Recorder the program made itself: `crashcap run --record` then stands aside


def _exception_type_name(exc):
    t = type(exc)
    return t.__qualname__ if t.__module__ in ("builtins", "__main__") else f"{t.__module__}.{t.__qualname__}"


def _exception_text(e):
    return "".join(traceback.format_exception_only(type(e), e)).strip()


def _in_chain(error, exc, limit=8):
    """Whether `error` is `exc` or one it was raised from or while handling."""
    seen, e = set(), exc
    while e is not None and id(e) not in seen and len(seen) < limit:
        if e is error:
            return True
        seen.add(id(e))
        e = e.__cause__ if e.__cause__ is not None else e.__context__
    return False


def _chain_text(exc, limit=8, cause_chars=2000):
    """The exception's text after those it was raised from or while handling, in the order and
    with the words Python prints them (without their frames): the last line is the exception's.
    Each earlier one is cut to `cause_chars`, so that the record's own cut (it keeps the start
    of a long text) never takes the exception's own line."""
    parts, seen, e = [], set(), exc
    while e is not None and id(e) not in seen and len(seen) < limit:
        seen.add(id(e))
        text = _exception_text(e)
        parts.append(text if e is exc or len(text) <= cause_chars else text[:cause_chars] + " …")
        if e.__cause__ is not None:
            parts.append("The above exception was the direct cause of the following exception:")
            e = e.__cause__
        elif e.__context__ is not None and not e.__suppress_context__:
            parts.append("During handling of the above exception, another exception occurred:")
            e = e.__context__
        else:
            e = None
    if len(parts) % 2 == 0:  # the chain was cut: its last relation has no exception before it
        parts.pop()
    return "\n\n".join(reversed(parts))


def _describe(exc, notes=()):
    """(kind, type, text, stack) of an exception, as the crash record keeps it: the text as
    Python prints it (the exceptions it came from first, then its own), after `notes`, and the
    traceback innermost frame first."""
    text = "\n".join([f"({n})" for n in notes] + [_chain_text(exc)])
    frames = traceback.extract_tb(exc.__traceback__)
    stack = [f'File "{f.filename}", line {f.lineno}, in {f.name}' + (f": {f.line}" if f.line else "")
             for f in reversed(frames)]
    kind = "nonfinite" if isinstance(exc, NonFiniteError) else "exception"
    return kind, _exception_type_name(exc), text, stack[:128]


class _SignalHandlersDeferred:
    """Python-level signal handlers wait while a crash is recorded. The DataLoader's SIGCHLD
    handler raises as soon as a worker dies, which is often the moment the training's own error
    (the worker's, passed on, or a broken pipe to it) is being recorded: run then, it would abandon
    the recording half way. run_pending() runs the handlers of the signals that came so far and
    keeps what they raised, for the record; on exit the handlers are put back, those of signals
    that came since run, and what they raised is raised (a KeyboardInterrupt or SystemExit first,
    else the first exception), as it would have been without crashcap, only later. Only the main
    thread runs Python handlers and can swap them."""

    def __init__(self):
        self.handlers, self.pending, self.raised = {}, [], []

    def _defer(self, signum, frame):
        self.pending.append(signum)

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            for number in signal.valid_signals():
                handler = signal.getsignal(number)
                if callable(handler):
                    signal.signal(number, self._defer)  # runs a handler already pending first: it may raise
                    self.handlers[number] = handler
        except BaseException:
            self._put_back()
            raise
        return self

    def run_pending(self):
        """Runs the deferred handlers now, one signal at a time, each once; returns what they
        raised (a KeyboardInterrupt or SystemExit too: kept, and raised on exit, after the
        recording)."""
        raised, done = [], set()
        while self.pending:
            number = self.pending.pop(0)
            if number in done:
                continue
            done.add(number)
            try:
                self.handlers[number](number, None)
            except BaseException as e:
                raised.append(e)
        self.raised += raised
        return raised

    def _put_back(self):
        # signal.signal runs the handlers of pending signals before it changes one, and a handler
        # put back already may raise there: that must not leave a later signal deferred for good.
        for number, handler in self.handlers.items():
            for _ in range(3):
                try:
                    signal.signal(number, handler)
                    break
                except BaseException as e:  # a handler run on the way (Ctrl-C again): kept for the exit
                    self.raised.append(e)

    def __exit__(self, kind, value, tb):
        self._put_back()
        self.run_pending()
        if value is None and self.raised:
            # A KeyboardInterrupt or SystemExit (the user stopping the run) before any other.
            raise next((e for e in self.raised if not isinstance(e, Exception)), self.raised[0])
        return False


def _excepthook(kind, value, tb):
    record_uncaught(value)
    _previous_excepthook(kind, value, tb)


def record_uncaught(value):
    """Records `value`, an exception that ends the program, as the active Recorder's crash (none
    active: nothing). What sys.excepthook does first; also called for an exception that a wrapper
    catches before the hook could see it (torch.multiprocessing.spawn's, in a rank)."""
    rec = _active() if _active is not None else None
    if rec is not None and isinstance(value, Exception):
        # A signal handler may raise before the recording began (tried again) or after it ended
        # (the training's own error is what is reported: its exception is dropped).
        error = None
        for _ in range(3):
            try:
                rec.fail(value)
                error = None
                break
            except Exception as e:
                error = e
                if getattr(value, "_crashcap_bundle", None) is not None:
                    # Recorded, with it: the training's own error is the one this hook reports.
                    print(f"crashcap: while the crash was recorded, a signal handler raised "
                          f"{_exception_type_name(e)}: {e}", file=sys.stderr)
                    error = None
                    break
        if error is not None:  # the hook must still report the training's own error
            print(f"crashcap: could not record the crash: {error}", file=sys.stderr)


_previous_excepthook = sys.__excepthook__  # the hook crashcap's replaced, set when it is installed
# What sys.excepthook is: _excepthook called from C, tried again when a signal handler raises into it.
_guarded_excepthook = functools.partial(_native.call_despite_signals, _excepthook)


class Recorder:
    """Records a Python training: every step's batch, generator states and learning rates,
    keyframes of the weights, buffers and optimizer state, the last ATen ops, and the crash,
    sealed into ``<directory>/crash-<time>-<pid>.ccap`` when the training fails.

    ::

        rec = crashcap.Recorder("runs/crashes", model=model, optimizer=optimizer)
        for step, batch in rec.steps(loader):
            loss = loss_fn(model(batch["image"]), batch["label"])
            loss.backward()
            rec.end(loss)                 # raises crashcap.NonFiniteError on a NaN/Inf loss
            optimizer.step()
            optimizer.zero_grad()

    When ``crashcap replay`` runs the program again to replay a recording, the same code replays
    it: ``steps()`` yields the recorded batches from the keyframe on instead of the loader's, and
    the process ends after the replayed step (``crashcap.replaying()`` is True there).

    directory: where crash bundles go ("" or None: $CRASHCAP_DIR, which ``crashcap run`` sets).
    model: the torch.nn.Module trained; optimizer: its torch.optim optimizer (any class).
    scheduler, grad_scaler: kept in keyframes when given.
    program: opt-in, a TorchScript module (``torch.jit.script``) whose forward takes the batch's
    tensors in order (a tensor; a tuple's or list's items; a dict's values, nested ones flattened)
    and returns the loss, and which the loop calls for its loss; its parameters are the
    optimizer's. The recording then replays in crashcap without Python (docs/PYTHON.md).
    keyframe_every (steps, or "auto", the default: chosen from what keyframes cost),
    keyframe_budget (with "auto": the share of the step time keyframes may cost, 0.01),
    retain_segments, retain_bytes, op_trace_depth, nonfinite ("raise" | "record"),
    check_gradients, zstd_level, queue_bytes, crash_guard, kernel_trace, quiet: the recorder's
    policy (docs/RECORDING.md).
    """

    def __init__(self, directory=None, model=None, optimizer=None, *, scheduler=None, grad_scaler=None, program=None,
                 _facts=(), _observed=False, **policy):
        global _active, _previous_excepthook, _user_recorder_made
        if not isinstance(model, torch.nn.Module):
            raise TypeError("crashcap.Recorder needs model=<the torch.nn.Module being trained>")
        if optimizer is None or not hasattr(optimizer, "param_groups") or not hasattr(optimizer, "state_dict"):
            raise TypeError("crashcap.Recorder needs optimizer=<its torch.optim optimizer>")
        known = {"keyframe_every", "keyframe_budget", "retain_segments", "retain_bytes", "op_trace_depth", "nonfinite", "check_gradients",
                 "zstd_level", "queue_bytes", "crash_guard", "kernel_trace", "all_environment_variables", "quiet"}
        unknown = sorted(set(policy) - known)
        if unknown:
            raise TypeError(f"crashcap.Recorder got unknown options {unknown}; known: {sorted(known)}")
        self.model, self.optimizer, self.scheduler, self.grad_scaler = model, optimizer, scheduler, grad_scaler
        if not _observed:
            _user_recorder_made = True
        # Keyframes hold the state by the names replay will look it up by: the program's, when
        # the step is given as TorchScript (which wraps the model, so its names may be prefixed).
        state = model
        if program is not None:
            _state.require_script_module(program)
            state = program
        self._names = _state.parameter_names(state, optimizer, "program" if program is not None else "model")
        kind, groups = _state.optimizer_spec(optimizer, self._names)
        archive = _state.torchscript_archive(program, kind, groups) if program is not None else None
        # False where the recording is removed when the run ends clean (the observer under
        # `crashcap run --record`): close() then does not wait for the disk.
        self._durable_close = True
        self._step = None            # the native step in flight
        self._step_index = None
        self._next_step = 0
        self._said_opaque = False  # a batch part kept only as text is said once
        # (step, loader ordinal, dataset indices or None, the error): the training's loader raised
        # the error while it loaded the batch of the step after `step` (crashcap run --record's
        # observer sets it; fail() names the loading only for that error or one raised from it).
        self._loading_failure = None
        self._closed = False
        from . import _replay
        request = _replay.take_request()
        self._replay = _replay.Driver(request, self) if request is not None else None
        if self._replay is not None:
            self._native = None
            return
        # The NonFiniteError names the switch the user has: crashcap run's flag or this option.
        go_on = "--nonfinite record" if _observed else 'nonfinite="record"'
        self._native = _native.Recorder(directory or "", dict(policy, nonfinite_go_on=go_on))
        _observe.quiet_dataloader_workers()
        self._native.set_model(list(state.named_parameters()), list(state.named_buffers()))
        self._native.set_foreign(_state.program_sources(early=_observed), kind, groups, self._learning_rates,
                                 _state.python_generators, self._keyframe, _state.program_facts() +
                                 (list(_facts) if _observed else [("python.capture", "api")]),
                                 _stack_here,
                                 torchscript=archive)
        self._rank_placed = _state.record_distributed(self._native)
        if _active is None or _active() is None:
            _active = weakref.ref(self)
            if sys.excepthook is not _guarded_excepthook:
                _previous_excepthook = sys.excepthook
                sys.excepthook = _guarded_excepthook
        _open.add(self)

    # ---- callbacks of the native recorder ----------------------------------------------------

    def _learning_rates(self):
        return _state.learning_rates(self.optimizer)

    def _keyframe(self, step):
        tensors, optimizer_doc = _state.optimizer_keyframe(self.optimizer, self._names)
        documents = [("optimizer", optimizer_doc), ("modules", _state.module_modes(self.model))]
        for name, obj in (("scheduler", self.scheduler), ("grad_scaler", self.grad_scaler)):
            if obj is not None:
                doc = _state.state_document(obj)
                if doc is not None:
                    documents.append((name, doc))
        return tensors, documents

    # ---- the loop ----------------------------------------------------------------------------

    def steps(self, loader, start=None):
        """Yields (step, batch) for each batch of `loader`, recording the batch before the step
        runs. Steps count on from the last one (or from `start`). In a replay, yields the
        recorded steps instead, without iterating the loader."""
        if self._replay is not None:
            yield from self._replay.steps()
            return
        if start is not None:
            self._next_step = int(start)
        # A step whose code raises stays in flight (its phase is the crash's); the next step, the
        # loop's end or close() finishes it.
        for batch in loader:
            step = self._next_step
            self.begin(step, batch)
            yield step, batch
            self._finish_step()

    @contextlib.contextmanager
    def step(self, step, batch=None, **named):
        """``with rec.step(i, image=x, label=y):`` records step `i`'s batch (a tensor, or tuples,
        lists and dicts of them, or keyword tensors) for a loop that does not iterate a loader;
        an exception leaving the block is recorded as the crash."""
        if batch is None:
            batch = named
        elif named:
            raise TypeError("rec.step takes a batch or keyword tensors, not both")
        if self._replay is not None:
            with self._replay.step(step, batch):
                yield
            return
        self.begin(step, batch)
        try:
            yield
        except BaseException as e:
            if isinstance(e, Exception):
                self.fail(e)
            raise
        finally:
            self._finish_step()

    def begin(self, step, batch, _extra=(), _rows=None):
        """Records step `step`'s batch, generator states and learning rates (and a keyframe when
        one is due). steps() and step() call it; call it yourself only for a loop they do not fit.
        `_rows` (the observer's): the batch's number of samples, from its loader's sampler; with
        it each tensor's rows are found in its first or second dimension (docs/REPLAY.md, "Rows of
        a batch"). Without it, a tensor's rows are its first dimension when that is the first
        tensor's."""
        self._finish_step()
        if not self._rank_placed and self._next_step == 0:  # a process group made after the Recorder
            self._rank_placed = _state.record_distributed(self._native)
        self._loading_failure = None
        tensors, structure = _batch.flatten(batch, _extra)
        parts = _batch.opaque_parts(json.loads(structure)) if not self._said_opaque and '"opaque"' in structure else []
        if parts:  # the text alone may be a key or a string named "opaque"
            self._said_opaque = True
            self.warn(f"the batch of step {step} holds what crashcap keeps only as text, which a replay cannot "
                      f"rebuild (its loop would get None there): "
                      + "; ".join(f"{path}: {text[:120]}" for path, text in parts[:4]))
        self._step = self._native.begin_step(int(step), tensors, structure, -1 if _rows is None else int(_rows))
        self._step_index = int(step)
        self._next_step = int(step) + 1

    def end(self, loss):
        """After loss.backward(), before optimizer.step(): records the loss and the gradient norm.
        Raises crashcap.NonFiniteError when either is NaN/Inf (nonfinite="raise")."""
        if self._replay is not None:
            return self._replay.end(loss)
        if self._step is not None:
            self._step.end(loss)

    def _finish_step(self):
        if self._step is not None:
            self._step.finish()
            self._step = None

    # ---- failure and the end -----------------------------------------------------------------

    def fail(self, exc=None):
        """Records `exc` (default: the exception being handled) as the crash and seals the bundle.
        Returns its path ("" when none could be sealed)."""
        if exc is None:
            exc = sys.exc_info()[1]
        if exc is None:
            raise ValueError("rec.fail() outside an except block needs the exception")
        if self._replay is not None:
            return self._replay.fail(exc)
        if self._native is None:
            return ""
        if getattr(exc, "_crashcap_bundle", None) is not None:  # already recorded (rec.fail, then the hook)
            return exc._crashcap_bundle
        with _SignalHandlersDeferred() as signals:
            # A DataLoader worker that died is why its pipe broke, and what a handler raised
            # meanwhile belongs to the story too: before the error's own text, whose last line
            # stays the error's (a replay compares it).
            notes = []
            died = _state.dataloader_worker_failure(exc)
            if died and died not in _chain_text(exc):
                notes.append(f"the DataLoader reports: {died}")
            for e in signals.run_pending():
                if str(e).strip() != died and (not str(e).strip() or str(e).strip() not in _chain_text(exc)):
                    notes.append(f"meanwhile a signal handler raised {_exception_type_name(e)}: {e}".rstrip(": "))
            phase, own, indices, other_batch = "", None, None, None
            if self._loading_failure is not None and _in_chain(self._loading_failure[5], exc):
                # The batch after the last step never came: not a step's failure, and the step
                # before it passed. The dataset indices its sampler drew say which samples to load.
                step, ordinal, own, indices, (batches, first), _ = self._loading_failure
                phase = "loading"
                notes.append(f"DataLoader #{ordinal} raised it while loading the batch after step {step}"
                             + (f", of dataset indices {indices[:first]}" if indices else "")
                             + (f", with the {batches - 1} batch{'es' if batches > 2 else ''} its workers drew ahead, "
                                f"of dataset indices {indices[first:]} (the worker that died may have been loading "
                                f"any of them)" if indices and batches > 1 else ""))
            else:
                # A worker that died while the step ran: the DataLoader's SIGCHLD handler raised
                # in the step, wherever it was. The sample that killed it is in the batches the
                # workers were loading ahead; the step itself did not fail.
                drawn = _observe.batches_in_flight(self, exc)
                if drawn is not None:
                    ordinal, own, indices, batches = drawn
                    phase = "loading"
                    when = (f"while step {self._step_index} ran" if self._step is not None
                            else f"after step {self._step_index} ended")
                    notes.append(f"a worker of DataLoader #{ordinal} died {when}, and the loader's SIGCHLD handler "
                                 f"raised it there, not in the loader: the step's own computation did not fail. "
                                 + (f"It was loading one of the {batches} batch{'es' if batches > 1 else ''} its "
                                    f"workers drew ahead, of dataset indices {indices}" if batches else
                                    "It was loading a batch drawn ahead, whose samples' indices are not known"))
                else:
                    try:
                        other = _observe.other_loader_note(self, exc)
                    except Exception:  # crashcap's own: the crash is recorded without the note
                        other = None
                    if other:
                        notes.append(other)
                    try:
                        other_batch = _observe.other_loader_batch(self, exc)  # kept in the bundle
                    except Exception:  # crashcap's own: the crash is recorded without it
                        other_batch = None
            kind, type_name, text, stack = _describe(exc, notes)
            bundle = None
            if other_batch is not None:
                loader, tensors, structure, rows = other_batch
                try:
                    bundle = self._native.fail(kind, type_name, text, stack, phase, own or [], indices or [],
                                               other_loader=loader, other_batch=tensors, other_structure=structure,
                                               other_rows=rows)
                except TypeError:  # a batch the binding cannot take: the crash is recorded without it
                    bundle = None
            if bundle is None:
                bundle = self._native.fail(kind, type_name, text, stack, phase, own or [], indices or [])
            try:
                exc._crashcap_bundle = bundle
            except AttributeError:  # an exception type with __slots__: it may be recorded twice
                pass
        return bundle

    def close(self):
        """Drains and closes the recording (kept for ``crashcap seal``). Idempotent; runs at exit."""
        global _active
        if self._closed:
            return
        self._closed = True
        try:
            self._finish_step()
            if self._native is not None:
                self._native.close(self._durable_close)
        finally:  # closed or not, this recorder takes no crash from now on
            _open.discard(self)
            if _active is not None and _active() is self:
                _active = None
                if sys.excepthook is _guarded_excepthook:  # a hook installed after crashcap's stays
                    sys.excepthook = _previous_excepthook

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if isinstance(value, Exception):
            self.fail(value)
        self.close()
        return False

    def warn(self, text, _print=True):
        """A warning about what the recording lacks: on stderr (unless quiet=True), and kept in the
        bundle's run status, where `crashcap inspect` shows it."""
        if self._native is not None:
            self._native.warn(text, _print)

    @property
    def recording_dir(self):
        return self._native.recording_dir() if self._native else ""

    @property
    def crash_bundle(self):
        return self._native.crash_bundle() if self._native else ""

    def stats(self):
        return self._native.stats() if self._native else {"recording": False}
