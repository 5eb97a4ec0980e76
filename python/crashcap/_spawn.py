"""A rank that torch.multiprocessing.spawn started, recorded and run again.

`mp.spawn(train, args=(...), nprocs=N)` starts each rank as a fresh interpreter whose command line
is multiprocessing's own (`-c "from multiprocessing.spawn import spawn_main; ..."`): the parent
sends it, through a pipe, how to prepare itself (the parent's sys.argv, sys.path, working
directory and main module) and the function to run with its rank and arguments. A replay has no
such parent, so the recording keeps what came through the pipe:

- launch_facts(), in the rank while it is being recorded: the facts `python.launcher` and
  `python.spawn` (the preparation data and the pickled function, rank and arguments, base64), or
  `python.spawn.unrecordable` with the reason when they cannot be kept (they do not pickle, are
  too big, or the launcher's command line holds a secret, which the fact would carry unredacted).
  The arguments are kept as given, as batches are: a replay unpickles them, so replay only bundles
  you trust;
- main(), `python -m crashcap._spawn` with the fact in CRASHCAP_SPAWN, which `crashcap replay`
  starts for each such rank: prepares the process as multiprocessing would have (the parent's main
  module imported as `__mp_main__`, its `if __name__ == "__main__":` block not run) and calls the
  function, which the observer then replays as it would any training.
"""

import base64
import multiprocessing
import os
import pickle
import sys

LAUNCHER = "torch.multiprocessing.spawn"
SPAWN_VARIABLE = "CRASHCAP_SPAWN"
MAX_FACT_BYTES = 64 << 10  # a fact lives in the environment record, and the replay passes it in a variable


class _TooBig(Exception):
    pass


class _Bounded:
    """A file for pickle that stops it once it has written `limit` bytes: an argument passed by
    value (a dataset, a model) is not copied whole just to be refused."""

    def __init__(self, limit):
        self.parts, self.size, self.limit = [], 0, limit

    def write(self, data):
        self.size += len(data)
        if self.size > self.limit:
            raise _TooBig()
        self.parts.append(bytes(data))

    def getvalue(self):
        return b"".join(self.parts)


def _dumps(value, limit):
    out = _Bounded(limit)
    pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return out.getvalue()


def launch_facts(fn, index, args):
    """The facts that let a replay start this rank again. Never raises."""
    process = multiprocessing.current_process()
    facts = [("python.launcher", LAUNCHER),
             ("python.spawn.start_method", str(getattr(process, "_start_method", None) or ""))]

    def unrecordable(why):
        facts.append(("python.spawn.unrecordable", why))
        return facts

    try:
        from multiprocessing import spawn
        # What the parent sent this process, as multiprocessing computes it (in this process it
        # names the same argv, path, directory and main module the parent's did).
        preparation = spawn.get_preparation_data(process.name)
    except Exception as e:
        return unrecordable(f"multiprocessing could not say how rank {index} was prepared ({type(e).__name__}: {e})")
    preparation.pop("authkey", None)  # a secret of the parent's, and nothing a replay needs
    try:
        from . import _native
        argv = [str(a) for a in preparation.get("sys_argv", [])]
        withheld = [f"argv[{i}]" for i, (a, b) in enumerate(zip(argv, _native.redact_arguments(argv))) if a != b]
    except Exception as e:
        return unrecordable(f"crashcap could not check the launcher's command line for secrets ({type(e).__name__}: {e})")
    if withheld:
        return unrecordable(f"the launcher's command line had {', '.join(withheld)} withheld as secret, and rank "
                            f"{index} runs with that command line")
    limit = MAX_FACT_BYTES * 3 // 4  # base64 makes 4 bytes of 3
    try:
        payload = _dumps((fn, index, args), limit)
        text = base64.b64encode(_dumps((preparation, payload), limit)).decode("ascii")
    except _TooBig:
        return unrecordable(f"the function and arguments torch.multiprocessing.spawn passed to rank {index} pickle to "
                            f"more than {limit >> 10} KiB, which crashcap does not keep: pass data by path, not by "
                            f"value")
    except Exception as e:  # what the parent sent pickled with multiprocessing's own reducers (a Queue)
        return unrecordable(f"the function and arguments torch.multiprocessing.spawn passed to rank {index} do not "
                            f"pickle outside multiprocessing ({type(e).__name__}: {e})")
    facts.append(("python.spawn", text))
    return facts


def main():
    text = os.environ.pop(SPAWN_VARIABLE, None)
    if not text:
        sys.exit(f"crashcap._spawn: {SPAWN_VARIABLE} is not set (crashcap replay sets it)")
    try:
        preparation, payload = pickle.loads(base64.b64decode(text))
        from multiprocessing import spawn
        spawn.prepare(preparation)  # sys.argv, sys.path, the directory, the main module as __mp_main__
        fn, index, args = pickle.loads(payload)  # after prepare: the function lives in __mp_main__
    except Exception as e:  # the script moved, an argument that connects somewhere (a Manager's proxy)
        sys.exit(f"crashcap._spawn: the recorded rank cannot be started again here: {type(e).__name__}: {e}")
    fn(index, *args)


if __name__ == "__main__":
    main()
