"""crashcap for Optuna studies: every trial recorded, and a crashed trial fails alone.

    import optuna
    import crashcap.optuna

    study = optuna.create_study(storage="sqlite:///study.db", study_name="mlp")
    crashcap.optuna.optimize(study, objective, n_trials=100, directory="runs/study")

Each trial runs in a fresh child process under the supervisor (``crashcap run --record``), in
``<directory>/trial-<number>/``: its training is recorded from PyTorch's seams with no change to
the objective, and however the trial dies — a Python exception, a NaN loss, a segfault in native
code, a CUDA error that poisons the process, the OOM killer's SIGKILL — that one trial fails, its
crash is sealed into a bundle, and the study goes on. A failed trial's user attributes carry
``crashcap_bundle``, ``crashcap_classification``, ``crashcap_step``, ``crashcap_error`` and
``crashcap_poisoned`` (a CUDA error: the process could not have gone on). Its parameters go into
the bundle and the run log, so ``crashcap summary <directory>`` groups the crashes and names the
hyperparameters that set them apart.

The child imports the objective the way multiprocessing's spawn does: the study's main script is
loaded as a module (its ``if __name__ == "__main__":`` block does not run) and the objective is
unpickled from it. So the objective must be picklable (a top-level function, or an instance of a
top-level class), and the study must use a storage another process can open (SQLite, another
RDB, a journal file). The trial's sampler and pruner are the study's, handed to the child and
back, so a seeded sampler samples as it would in one process.

``isolate=False`` runs the trials in this process instead (no process per trial; a CUDA error
then ends the study, since the process is poisoned): each trial still gets its own recording.
"""

import json
import os
import pickle
import shutil
import subprocess
import sys
import time

import optuna

from . import _native, _params
from ._params import hyperparameters

TRIAL_VARIABLE = "CRASHCAP_OPTUNA_TRIAL"  # set in a trial's child process
# Classifications after which the process cannot go on: its CUDA context (or communicator) is lost.
_POISONING = ("cuda-", "cudnn-", "nccl-")


class TrialCrashed(Exception):
    """A trial's process crashed; the trial failed, and its user attributes say how."""

    def __init__(self, message, attributes):
        super().__init__(message)
        self.attributes = attributes


def _crashcap_executable():
    explicit = os.environ.get("CRASHCAP")
    if explicit:
        return explicit
    # The build: build/python/crashcap/optuna.py -> build/bin/crashcap.
    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.join(os.path.dirname(os.path.dirname(here)), "bin", "crashcap")
    if os.access(built, os.X_OK):
        return built
    found = shutil.which("crashcap")
    if found:
        return found
    raise RuntimeError("crashcap.optuna (isolate=True) runs each trial under the `crashcap` command, and there is none "
                       "here: put it on PATH (cmake --install) or name it in $CRASHCAP")


def _shareable_storage(study):
    storage = study._storage
    storage = getattr(storage, "_backend", storage)  # _CachedStorage wraps the RDB storage
    if isinstance(storage, optuna.storages.InMemoryStorage):
        raise ValueError("crashcap.optuna.optimize(isolate=True) runs each trial in another process, which cannot see an "
                         "in-memory study: create it with a storage, e.g. optuna.create_study(storage='sqlite:///study.db', "
                         "study_name=...) (or pass isolate=False)")
    return storage


_UNPICKLABLE = ("crashcap.optuna (isolate=True) hands the {what} to each trial's process by pickling it, and it does "
                "not pickle ({error}): define it at the top level of a module (not a lambda or a nested function), "
                "or pass isolate=False")


def _dump(obj, path, what):
    try:
        with open(path, "wb") as f:
            pickle.dump(obj, f)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise ValueError(_UNPICKLABLE.format(what=what, error=e)) from e


def _main_file():
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.abspath(path) if path else None


class _Isolated:
    """The objective optuna calls: runs the real one in a child process under `crashcap run`."""

    def __init__(self, objective, directory, run_options):
        self.objective = objective
        self.directory = os.path.abspath(directory)
        self.run_options = list(run_options)
        self.crashcap = _crashcap_executable()

    def __call__(self, trial):
        study = trial.study
        trial_dir = os.path.join(self.directory, f"trial-{trial.number:04d}")
        # crashcap.optuna's own files (the objective, the storage, the sampler, the trial's
        # parameters and result) go into .trial/, beside the bundles `crashcap run` writes.
        own = os.path.join(trial_dir, ".trial")
        os.makedirs(own, exist_ok=True)
        _dump(self.objective, os.path.join(own, "objective.pkl"), "objective")
        _dump(_shareable_storage(study), os.path.join(own, "storage.pkl"), "study's storage")
        _dump(study.sampler, os.path.join(own, "sampler.pkl"), "study's sampler")
        _dump(study.pruner, os.path.join(own, "pruner.pkl"), "study's pruner")
        # What the sampler drew for the whole trial when optuna made it here (a multivariate
        # sampler's relative parameters): the child uses them instead of drawing again.
        _dump((trial.relative_search_space, trial.relative_params), os.path.join(own, "relative.pkl"),
              "trial's relative parameters")
        spec = {"study_name": study.study_name, "trial_id": trial._trial_id, "number": trial.number,
                "main_file": _main_file(), "sys_path": [p for p in sys.path if p]}
        spec_path = os.path.join(own, "trial.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f, indent=1)
        for stale in ("result.json", "sampler.out.pkl"):
            if os.path.exists(os.path.join(own, stale)):
                os.remove(os.path.join(own, stale))
        command = [self.crashcap, "run", "--record", *self.run_options, "--dir", trial_dir, "--",
                   sys.executable, "-m", "crashcap.optuna", spec_path]
        env = dict(os.environ)
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join([package_parent] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        process = subprocess.run(command, env=env)
        self._take_back_sampler(study, own)
        _refresh(study, trial, list((_read_json(os.path.join(own, "params.json")) or {}).keys()))
        result = _read_json(os.path.join(own, "result.json"))
        if process.returncode == 0 and result is not None:
            if result.get("pruned"):
                raise optuna.TrialPruned(result.get("message", ""))
            values = result["values"]
            return values[0] if len(values) == 1 else values
        attributes = _crash_attributes(self.crashcap, trial_dir, process.returncode)
        for key, value in attributes.items():
            trial.set_user_attr(key, value)
        raise TrialCrashed(f"trial {trial.number} crashed ({attributes['crashcap_classification']}): "
                           f"{attributes['crashcap_error']} -- bundle {attributes['crashcap_bundle'] or 'none'}",
                           attributes)

    @staticmethod
    def _take_back_sampler(study, own):
        """The child's sampler has drawn this trial's numbers: the parent goes on from its state."""
        path = os.path.join(own, "sampler.out.pkl")
        if os.path.exists(path):
            try:
                with open(path, "rb") as f:
                    study.sampler = pickle.load(f)
            except Exception as e:  # a child killed while writing it: the parent's sampler stays
                print(f"crashcap.optuna: the sampler of {own} could not be read back ({e})", file=sys.stderr)


def _refresh(study, trial, order):
    """The child wrote the trial's parameters and reports into the storage; optuna's cache in this
    process still holds the trial as it began (optuna 3's _CachedStorage): read it again, its
    parameters in the order they were suggested (`order`), as one process would hold them (a
    multivariate sampler walks them in that order)."""
    storage = study._storage
    backend = getattr(storage, "_backend", None)
    add = getattr(storage, "_add_trials_to_cache", None)
    if backend is None or add is None:
        return
    try:
        fresh = backend.get_trial(trial._trial_id)
        names = [n for n in order if n in fresh.params] + [n for n in fresh.params if n not in order]
        fresh.distributions = {n: fresh.distributions[n] for n in names}
        fresh.params = {n: fresh.params[n] for n in names}
        with storage._lock:
            add(study._study_id, [fresh])
        trial._cached_frozen_trial = storage.get_trial(trial._trial_id)
    except Exception as e:  # another optuna's internals: the study is right in the storage either way
        print(f"crashcap.optuna: trial {trial.number}'s parameters may show empty in this process ({e})", file=sys.stderr)


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _crash_attributes(crashcap, trial_dir, returncode):
    """The failed trial's user attributes, from the run log `crashcap run` wrote in its directory."""
    line = {}
    try:
        with open(os.path.join(trial_dir, "runs.jsonl")) as f:
            lines = [json.loads(l) for l in f if l.strip()]
        line = lines[-1] if lines else {}
    except (OSError, ValueError):
        pass
    classification = line.get("classification") or ("exit-nonzero" if returncode else "no-result")
    error = line.get("evidence") or (f"exit status {returncode}" if returncode else
                                     "the trial's process exited 0 without a result (it called sys.exit?)")
    bundle = line.get("bundle", "")
    step = None
    if bundle:
        story = subprocess.run([crashcap, "inspect", bundle, "--json"], capture_output=True, text=True)
        try:
            story = json.loads(story.stdout)
            # A killed process's crash has no step of its own: the step it was in is the last begun.
            step = (story.get("crash") or {}).get("step")
            step = story.get("crash_step") if step is None else step
        except ValueError:
            pass
    return {"crashcap_bundle": bundle, "crashcap_classification": classification, "crashcap_step": step,
            "crashcap_error": error, "crashcap_poisoned": classification.startswith(_POISONING)}


class _InProcess:
    """The objective optuna calls with isolate=False: the trial in this process, recorded into
    its own directory; a crash fails the trial (and a poisoning one ends the study)."""

    def __init__(self, objective, directory, policy):
        from . import _observe
        self.objective = objective
        self.directory = os.path.abspath(directory)
        self.observer = _observe.install(policy, replay=False)

    def __call__(self, trial):
        from ._recorder import _describe
        trial_dir = os.path.join(self.directory, f"trial-{trial.number:04d}")
        os.makedirs(trial_dir, exist_ok=True)
        self.observer.new_training(trial_dir)
        _params._declared.clear()  # the last trial's are not this one's
        started = time.time()
        wrapped = _ParamsTrial.wrap(trial)
        try:
            value = self.objective(wrapped)
        except optuna.TrialPruned:
            self.observer.end_training(remove=True)
            raise
        except Exception as e:
            bundle = self.observer.fail(e)
            kind, type_name, text, _ = _describe(e)
            # As crashcap run would classify the process dying of it (a NaN loss has its own word).
            classification = "nonfinite-loss" if kind == "nonfinite" else \
                _native.classify(1, 0, "", "Traceback (most recent call last):\n" + text)[0]
            error = next((l for l in reversed(text.splitlines()) if l.strip()), type_name)
            attributes = {"crashcap_bundle": bundle, "crashcap_classification": classification,
                          "crashcap_step": self.observer.crash_step(), "crashcap_error": error,
                          "crashcap_poisoned": classification.startswith(_POISONING)}
            for key, v in attributes.items():
                trial.set_user_attr(key, v)
            self.observer.end_training(remove=True)
            _append_run_log(trial_dir, started, 1, classification, error, bundle, wrapped.params)
            if attributes["crashcap_poisoned"]:
                raise  # the process cannot run another trial: the study stops here, with the trial failed
            raise TrialCrashed(f"trial {trial.number} crashed ({classification}): {error} -- bundle {bundle or 'none'}",
                               attributes) from e
        self.observer.end_training(remove=True)
        _append_run_log(trial_dir, started, 0, "", "", "", wrapped.params)
        return value


def _append_run_log(directory, started, exit_code, classification, evidence, bundle, params):
    """The trial's line of <directory>/runs.jsonl, as `crashcap run` writes it, so that `crashcap
    summary` sees the healthy trials of a study run in one process, and everyone's parameters."""
    _native.append_run_log(directory, sys.argv, int(started * 1e9), time.time_ns(), exit_code, classification, evidence,
                           bundle, [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in params.items()])


class _ParamsTrial(optuna.trial.Trial):
    """A Trial that tells crashcap each parameter as it is suggested (crashcap.hyperparameters: into
    the crash bundle and the run log, even when the process is killed) and, in a trial's child
    process, writes its parameters and its sampler's state into the trial's directory (the
    parent goes on sampling from that state; a replay suggests the same values)."""

    own_dir = None  # <trial>/.trial in a trial's child process
    given_relative = None  # (search space, params) the parent's sampler drew for this trial

    def _init_relative_params(self):
        if self.given_relative is None:
            return super()._init_relative_params()
        self._cached_frozen_trial = self.storage.get_trial(self._trial_id)
        self.relative_search_space, self.relative_params = self.given_relative

    @classmethod
    def wrap(cls, trial):
        """The in-process trial optuna made, as a _ParamsTrial (no own directory)."""
        wrapped = cls.__new__(cls)
        wrapped.__dict__.update(trial.__dict__)
        return wrapped

    def _suggest(self, name, distribution):
        value = super()._suggest(name, distribution)
        params = hyperparameters({name: value})
        if self.own_dir:
            _replace(os.path.join(self.own_dir, "params.json"), json.dumps(params).encode())
            _replace(os.path.join(self.own_dir, "sampler.out.pkl"), pickle.dumps(self.study.sampler))
        return value


def _replace(path, data):
    """Writes `data` to `path` through a rename: a process killed meanwhile leaves the old file whole."""
    partial = path + ".partial"
    with open(partial, "wb") as f:
        f.write(data)
    os.replace(partial, path)


def objective(fn, directory="crashcap-study", *, isolate=True, keyframe_every=None, nonfinite=None):
    """`fn` as an objective that records each trial into `<directory>/trial-<number>/` and turns a
    crash into a failed trial (TrialCrashed; pass catch=(crashcap.optuna.TrialCrashed,) to
    study.optimize, or use crashcap.optuna.optimize, which does). See the module's docs."""
    if os.environ.get(TRIAL_VARIABLE):
        raise RuntimeError("crashcap.optuna was asked to run a study inside one of its own trials: the trial's process "
                           "imports the study's main script, so put the study.optimize call under "
                           "`if __name__ == \"__main__\":`")
    if isolate:
        options = []
        if keyframe_every is not None:
            options += ["--keyframe-every", str(int(keyframe_every))]
        if nonfinite is not None:
            options += ["--nonfinite", str(nonfinite)]
        return _Isolated(fn, directory, options)
    policy = {k: v for k, v in (("keyframe_every", keyframe_every), ("nonfinite", nonfinite)) if v is not None}
    return _InProcess(fn, directory, policy)


def optimize(study, fn, n_trials=None, *, directory="crashcap-study", isolate=True, keyframe_every=None,
             nonfinite=None, catch=(), **optimize_kwargs):
    """study.optimize(fn, n_trials, ...) with every trial recorded and isolated (see the module's
    docs); a crashed trial fails and the study goes on. Returns the study."""
    if isolate:
        if optimize_kwargs.get("n_jobs", 1) != 1:
            raise ValueError("crashcap.optuna.optimize(isolate=True) runs one trial process at a time (n_jobs=1): to "
                             "run trials in parallel, start this study script several times on the same storage")
        # What each trial's process must be handed, checked before the first trial.
        _shareable_storage(study)
        try:
            pickle.dumps(fn)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise ValueError(_UNPICKLABLE.format(what="objective", error=e)) from e
    wrapped = objective(fn, directory, isolate=isolate, keyframe_every=keyframe_every, nonfinite=nonfinite)
    study.optimize(wrapped, n_trials=n_trials, catch=tuple(catch) + (TrialCrashed,), **optimize_kwargs)
    return study


# ---- the trial's own process: python -m crashcap.optuna <trial.json> --------------------------


def _load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def _run_trial(spec_path):
    from ._replay import replaying
    own = os.path.dirname(os.path.abspath(spec_path))  # <trial>/.trial
    with open(spec_path) as f:
        spec = json.load(f)
    os.environ[TRIAL_VARIABLE] = "1"
    for p in reversed(spec.get("sys_path", [])):
        if p not in sys.path:
            sys.path.insert(0, p)
    main_file = spec.get("main_file")
    if main_file:
        # As multiprocessing's spawn does: the study's script as a module, its main block not run,
        # standing in for __main__ so that its objective unpickles.
        import importlib.util
        module_spec = importlib.util.spec_from_file_location("__mp_main__", main_file)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules["__mp_main__"] = module
        sys.modules["__main__"] = module
        module_spec.loader.exec_module(module)
    fn = _load(os.path.join(own, "objective.pkl"))
    if replaying():
        # A replay suggests what the trial suggested, and reports to no study.
        params = _read_json(os.path.join(own, "params.json")) or {}
        trial = optuna.trial.FixedTrial(params, number=spec["number"])
    else:
        study = optuna.load_study(study_name=spec["study_name"], storage=_load(os.path.join(own, "storage.pkl")),
                                  sampler=_load(os.path.join(own, "sampler.pkl")),
                                  pruner=_load(os.path.join(own, "pruner.pkl")))
        _ParamsTrial.given_relative = _load(os.path.join(own, "relative.pkl"))
        trial = _ParamsTrial(study, spec["trial_id"])
        trial.own_dir = own
    try:
        value = fn(trial)
    except optuna.TrialPruned as e:
        _replace(os.path.join(own, "result.json"), json.dumps({"pruned": True, "message": str(e)}).encode())
        return 0
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    _replace(os.path.join(own, "result.json"), json.dumps({"values": [float(v) for v in values]}).encode())
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m crashcap.optuna TRIAL.json (crashcap.optuna.optimize starts it)", file=sys.stderr)
        sys.exit(2)
    sys.exit(_run_trial(sys.argv[1]))
