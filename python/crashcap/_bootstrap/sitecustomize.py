"""crashcap's bootstrap for `crashcap run --record`: first on PYTHONPATH, Python imports it at start-up.

It runs the sitecustomize it hides (the system's), then waits for the program to import torch,
and only then loads crashcap's observer (crashcap/_observe.py): a program that never imports
torch (a launcher, a shell helper) runs as if crashcap were not there, but for the stand-in for
itertools.cycle (_stand_in_for_cycle), which makes itertools.cycle itself. Nothing here may break
the program: an error is one line on stderr.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
try:  # where the program started: a replay runs it there (crashcap/_state.py, start_directory)
    CRASHCAP_START_DIRECTORY = os.getcwd()
except OSError:
    CRASHCAP_START_DIRECTORY = ""
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(_HERE))  # where `import crashcap` finds this crashcap


def _run_hidden_sitecustomize():
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as e:  # as site.py reports an error in sitecustomize
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(e).__name__}: {e}", file=sys.stderr)


def _observe(spawned=None):
    try:
        # This crashcap, not another one the program's path may hold; and its directory only for
        # this import: an installed package's directory is a whole site directory, which must not
        # shadow the program's own packages.
        sys.path.insert(0, _PACKAGE_PARENT)
        try:
            from crashcap import _observe
        finally:
            sys.path.remove(_PACKAGE_PARENT)
        _observe.start_from_environment(spawned)
        return _observe
    except Exception as e:
        print(f"crashcap: not recording this training: the crashcap package failed to load "
              f"({type(e).__name__}: {e})", file=sys.stderr)
        return None


class _AfterTorch:
    """A meta path finder that finds nothing itself: when `torch` is first imported, wraps its
    loader so that the observer starts once torch's own import has finished. (The protocol is the
    find_spec method alone; importlib.abc's base class would cost every Python start-up 10 ms.)
    `then`: what runs once torch is imported."""

    def __init__(self, then):
        self.then = then

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, then = spec.loader.exec_module, self.then

        def exec_then_observe(module):
            exec_module(module)
            then()

        spec.loader.exec_module = exec_then_observe
        return spec


def _multiprocessing_child():
    """A process multiprocessing started with spawn or forkserver: a DataLoader worker, or a rank
    that torch.multiprocessing.spawn started. It imports torch before multiprocessing says it is a
    child."""
    argv = getattr(sys, "orig_argv", sys.argv)  # the interpreter's own: `-c "from multiprocessing..."`
    return "--multiprocessing-fork" in argv or any(a.startswith("from multiprocessing.") for a in argv)


def _observe_spawned_function():
    """In a multiprocessing child, once torch is imported: the function torch.multiprocessing.spawn
    runs in it (a rank of a job: `mp.spawn(train, nprocs=N)`) starts under the observer, which
    records the training it runs. A DataLoader worker never calls it, and records nothing."""
    try:
        import functools

        # The module (`torch.multiprocessing.spawn` as an attribute is its function of that name).
        spawn = sys.modules.get("torch.multiprocessing.spawn")
        wrap = getattr(spawn, "_wrap", None)
        if wrap is None:  # another torch: the rank runs unrecorded
            return

        # Named as the original, so that pickle finds it there: a process that spawns ranks of its
        # own passes it to multiprocessing as their target.
        @functools.wraps(wrap)
        def _wrap(fn, i, args, *rest, **kwargs):
            if _OBSERVE_POLICY is not None:
                os.environ["CRASHCAP_OBSERVE"] = _OBSERVE_POLICY  # a rank: its own children see it again
            observe = _observe(spawned=(fn, i, args))
            # torch's wrapper catches the rank's exception (it hands the traceback to the launcher
            # and exits 1): recorded on its way there, as sys.excepthook records a program's.
            run = observe.recording_exceptions(fn) if observe is not None else fn
            return wrap(run, i, args, *rest, **kwargs)

        spawn._wrap = _wrap
    except Exception as e:
        print(f"crashcap: not recording this process: {type(e).__name__}: {e}", file=sys.stderr)


def _stand_in_for_cycle():
    """itertools.cycle as the program gets it, even imported before torch (`from itertools import
    cycle`): once crashcap's observer runs, it sees each batch a cycle over a DataLoader hands out
    again (`make`: crashcap/_observe.py, _ObservedCycle); until then, and over anything else, it
    makes itertools.cycle itself. Such a cycle is an instance of the stand-in as of itertools.cycle,
    pickles as one, and a program's subclass of it is made as that subclass; only `type(c) is
    itertools.cycle` tells them apart."""
    import copyreg
    import itertools
    real = itertools.cycle

    class _Cycles(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, real)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, real)

    class cycle(real, metaclass=_Cycles):
        __doc__ = real.__doc__
        _crashcap_real = real
        make = None

        def __new__(cls, iterable, /):
            if cls is not cycle:
                return real.__new__(cls, iterable)  # a subclass the program made of itertools.cycle
            make = cycle.make
            return real(iterable) if make is None else make(iterable)

    cycle.__module__, cycle.__qualname__ = real.__module__, real.__qualname__
    # pickle finds a class by its name: itertools.cycle is the stand-in now, so a cycle pickles as
    # one, and unpickles as itertools.cycle (its state restored by its own __setstate__)
    copyreg.pickle(real, lambda c: (cycle,) + c.__reduce__()[1:])
    itertools.cycle = cycle


def _stand_in():
    try:
        _stand_in_for_cycle()
    except Exception as e:
        print(f"crashcap: loops over itertools.cycle(loader) will not be seen: {type(e).__name__}: {e}", file=sys.stderr)


_run_hidden_sitecustomize()
_OBSERVE_POLICY = None  # a multiprocessing child's CRASHCAP_OBSERVE, until it turns out to be a rank
if _multiprocessing_child():
    # Nothing of the parent's replay is this process's to act on, nor its recording unless it is a
    # rank (a DataLoader worker's own children do not record).
    os.environ.pop("CRASHCAP_REPLAY_REQUEST", None)
    _OBSERVE_POLICY = os.environ.pop("CRASHCAP_OBSERVE", None)
    if _OBSERVE_POLICY is not None:
        _stand_in()
        sys.meta_path.insert(0, _AfterTorch(_observe_spawned_function))
elif os.environ.get("CRASHCAP_OBSERVE") is not None or os.environ.get("CRASHCAP_REPLAY_REQUEST") is not None:
    _stand_in()
    if "torch" in sys.modules:
        _observe()
    else:
        sys.meta_path.insert(0, _AfterTorch(_observe))
