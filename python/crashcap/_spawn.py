"""A rank that torch.multiprocessing.spawn started, recorded and run again.

`mp.spawn(train, args=(...), nprocs=N)` starts each rank as a fresh interpreter whose command line
is multiprocessing's own (`-c "from multiprocessing.spawn import spawn_main; ..."`): the parent
sends it, through a pipe, how to prepare itself (the parent's sys.argv, sys.path, working
directory and main module) and the function to run with its rank and arguments. A replay has no
such parent, so the recording keeps what came through the pipe:

- launch_facts(), in the rank while it is being recorded: the facts `python.launcher` and
  `python.spawn` (the preparation data and the pickled function, rank and arguments, base64), or
  `python.spawn.unrecordable` with the reason when they cannot be kept;
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


def launch_facts(fn, index, args):
    """The facts that let a replay start this rank again. Never raises."""
    facts = [("python.launcher", LAUNCHER),
             ("python.spawn.start_method", multiprocessing.get_start_method(allow_none=True) or "")]
    try:
        from multiprocessing import spawn
        # What the parent sent this process, as multiprocessing computes it (in this process it
        # names the same argv, path, directory and main module the parent's did).
        preparation = spawn.get_preparation_data("SpawnProcess")
        preparation.pop("authkey", None)  # a secret of the parent's, and nothing a replay needs
        payload = pickle.dumps((fn, index, args))
        text = base64.b64encode(pickle.dumps((preparation, payload))).decode("ascii")
    except Exception as e:  # what the parent sent pickled with multiprocessing's own reducers
        facts.append(("python.spawn.unrecordable",
                      f"the function and arguments torch.multiprocessing.spawn passed to rank {index} do not pickle "
                      f"outside multiprocessing ({type(e).__name__}: {e})"))
        return facts
    if len(text) > MAX_FACT_BYTES:
        facts.append(("python.spawn.unrecordable",
                      f"the function and arguments torch.multiprocessing.spawn passed to rank {index} pickle to "
                      f"{len(text) >> 10} KiB, more than crashcap keeps ({MAX_FACT_BYTES >> 10} KiB): pass the "
                      f"data by path, not by value"))
        return facts
    facts.append(("python.spawn", text))
    return facts


def main():
    text = os.environ.pop(SPAWN_VARIABLE, None)
    if not text:
        sys.exit(f"crashcap._spawn: {SPAWN_VARIABLE} is not set (crashcap replay sets it)")
    preparation, payload = pickle.loads(base64.b64decode(text))
    from multiprocessing import spawn
    spawn.prepare(preparation)  # sys.argv, sys.path, the directory, the main module as __mp_main__
    fn, index, args = pickle.loads(payload)  # after prepare: the function lives in __mp_main__
    fn(index, *args)


if __name__ == "__main__":
    main()
