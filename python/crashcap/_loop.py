"""The training loop's own numbers (docs/PYTHON.md, "The loop's own numbers").

A replay starts at a keyframe, many steps into the training, but the program's loop starts from
its beginning: a step counter of the program's own (``step += 1``), the epoch of an outer loop,
an ``enumerate`` count, a float it anneals each step, all stand where a fresh run leaves them. Code
that reads them (a warm-up that sets the learning rate from the counter, a layer frozen at step
N, a KL weight annealed per step) then computes something else than it did when recorded, and
the replay departs from the recording at its first step.

So the recorder keeps, at each step, the int, float and bool variables of the frame that
iterates the loader, as they stand at the first line of the loop's body (after the loop header
assigned its targets, an ``enumerate`` count included), and a replay sets them back at the same
point of each step it replays. The point is found with a trace function that lives from the
loader handing over the batch to the next line the loop's frame runs: a few bytecodes, once a
step. With another tracer installed (a debugger, coverage) nothing is kept or set back.

Clock readings are left out: a float or int that reads as the wall clock or the monotonic clock
of this run (``t0 = time.time()``) would, set back in a replay, make a loop that stops after a
time budget stop at once.
"""

import json
import os
import sys
import time

from . import _state

_MAX_NAMES = 256
_MAX_TEXT = 60 << 10  # under the record's 64 KiB
_NOT_PLAIN = 0x20 | 0x80 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR: a wrapper, not the loop

_CRASHCAP = tuple({os.path.dirname(__file__) + os.sep, os.path.dirname(os.path.abspath(__file__)) + os.sep})
_program_code = {}  # code object -> whether it is the program's own (not crashcap's, not installed)
_installed = None
_clock_start = (time.time() - 60.0, time.monotonic() - 60.0)  # what a clock read before crashcap was imported reads


def _is_program(code):
    own = _program_code.get(code)
    if own is None:
        global _installed
        if _installed is None:
            _installed = tuple(r.rstrip(os.sep) + os.sep for r in _state._installed_roots())
        name = code.co_filename
        own = not name.startswith("<frozen") and not os.path.realpath(name).startswith(_installed)
        if len(_program_code) < 100000:
            _program_code[code] = own
    return own


def loop_frame(frame):
    """The frame of the loop that iterates a loader, from `frame` (inside crashcap or the loader):
    above crashcap's frames and any generator's (a wrapper such as tqdm's, or a prefetching
    generator of the program's, hands the batch on to the loop), the first frame, when it is the
    program's own code. None when it is installed code (a library's training loop, where the
    numbers are the library's): its next line may come only when the training ends, and the trace
    would run until then."""
    depth = 0
    while frame is not None and depth < 64:
        code = frame.f_code
        if code.co_flags & _NOT_PLAIN or code.co_filename.startswith(_CRASHCAP):
            frame, depth = frame.f_back, depth + 1
            continue
        return frame if _is_program(code) else None
    return None


def frame_name(frame):
    code = frame.f_code
    return f"{code.co_filename}:{code.co_name}:{code.co_firstlineno}"


def _is_clock(value, now_wall, now_mono):
    if type(value) is int:
        if value < 10 ** 12:
            return False
        value = value / 1e9  # time.time_ns(), time.monotonic_ns(), time.perf_counter_ns()
    return _clock_start[0] <= value <= now_wall or _clock_start[1] <= value <= now_mono


def numbers(frame):
    """{name: value} of the frame's int, float and bool variables (a script's top level: its
    globals), clock readings left out."""
    now_wall, now_mono = time.time() + 1.0, time.monotonic() + 1.0
    values = {}
    for name, value in frame.f_locals.items():
        kind = type(value)
        if kind is bool or ((kind is int or kind is float) and not _is_clock(value, now_wall, now_mono)):
            if not name.startswith("__"):
                values[name] = value
                if len(values) >= _MAX_NAMES:
                    break
    return values


def _untraced(frame, event, arg):
    return None  # no other frame is traced


def _at_body(frame, then):
    """Calls then(frame) at the next line `frame` runs (the first line of the loop's body, once
    the loop header has assigned its targets); False when another tracer is installed."""
    current = sys.gettrace()
    if current is not None and current is not _untraced:
        return False

    def local(f, event, arg):
        if event == "line" or event in ("return", "exception"):
            f.f_trace = None
            sys.settrace(None)
            if event == "line":
                try:
                    then(f)
                except Exception:
                    pass  # crashcap's own: never the program's
            return None
        return local

    frame.f_trace = local
    sys.settrace(_untraced)
    return True


def keep_at_body(native, step, start):
    """Recording: arms the capture of step `step`'s loop numbers, found from frame `start`."""
    try:
        _keep_at_body(native, step, start)
    except Exception:
        pass  # crashcap's own: the step is recorded without them


def _keep_at_body(native, step, start):
    frame = loop_frame(start)
    if frame is None:
        return
    name = frame_name(frame)

    def capture(f):
        values = numbers(f)
        if values:
            text = json.dumps(values)
            if len(text) <= _MAX_TEXT:
                native.loop_state(step, name, text)

    _at_body(frame, capture)


class Restorer:
    """Replay: sets the recorded loop numbers back at the first line of each replayed step's body."""

    def __init__(self, session):
        self.session = session
        self.compared = False  # the first restore says what differed
        self.said = set()

    def arm(self, step, start):
        try:
            self._arm(step, start)
        except Exception as e:  # crashcap's own: the step is replayed without them, and says so
            self._note("error", f"the loop's own numbers were not set back: {type(e).__name__}: {e}")

    def _arm(self, step, start):
        recorded = self.session.loop_state(step)
        if recorded is None:
            return
        name, text = recorded
        frame = loop_frame(start)
        if frame is None:
            return
        if frame_name(frame) != name:
            self._note("frame", f"the loop's own numbers (a step counter, the epoch) were recorded in {name} and this "
                       f"run's loop is in {frame_name(frame)}: not set back")
            return
        values = json.loads(text)

        def restore(f):
            scope = f.f_locals  # a script's top level: its globals; a function's: written back after the trace
            if not self.compared:
                self.compared = True
                changed = [(f"{k} {scope[k]!r} -> {v!r}" if k in scope else f"{k} (unset) -> {v!r}")
                           for k, v in values.items() if k not in scope or type(scope[k]) is not type(v) or scope[k] != v]
                if changed:
                    self._note("changed", f"the loop's own numbers at step {step}, the first replayed, were not the "
                               f"recording's: " + ", ".join(changed[:6]) + (", ..." if len(changed) > 6 else "") +
                               "; each replayed step sets them back to the recording's")
            for k, v in values.items():
                scope[k] = v

        if not _at_body(frame, restore):
            self._note("tracer", "another tracer (a debugger, coverage) is installed, so the loop's own numbers "
                       "(a step counter, the epoch) were not set back to the recording's")

    def _note(self, key, text):
        if key not in self.said:
            self.said.add(key)
            self.session.note(text, changes_setup=False)
