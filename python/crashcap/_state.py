"""The parts of a Python training's state that are not its weights, as the recorder keeps them.

- The optimizer's ``state_dict()``: its tensors go into the keyframe under the parameter's name
  (``keyframes/<step>/optimizer/<parameter>/<key>``), everything else into a JSON document that
  refers to them (``keyframes/<step>/documents/optimizer``). Any ``torch.optim`` optimizer, custom
  ones included, round-trips through ``load_state_dict``.
- An LR scheduler's and a GradScaler's ``state_dict()``: JSON documents.
- Python's ``random`` and numpy's global generator: int64 tensors beside LibTorch's generator
  states (``steps/<step>/rng/python``, ``.../rng/numpy``).
- The program's own source files, hashed (and kept when small).
"""

import hashlib
import io
import json
import math
import os
import random
import re
import signal
import struct
import sys
import time
import types

import torch

# ---- JSON with tensors referred to by name --------------------------------------------------


def _encode(value, name, tensors):
    """`value` as JSON; tensors are appended to `tensors` under `name` and referred to."""
    if isinstance(value, torch.Tensor):
        tensors.append((name, value))
        return {"$tensor": name}
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v, f"{name}/{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{name}/{i}", tensors) for i, v in enumerate(value)]
    if type(value).__module__ == "numpy":
        # numpy scalars and arrays in a custom optimizer's state: as the Python values they hold.
        if hasattr(value, "tolist"):
            return _encode(value.tolist(), name, tensors)
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _encode(v, f"{name}/{k}", tensors) for k, v in value.items()}
        return {"$dict": [[_encode(k, name, tensors), _encode(v, f"{name}/{k}", tensors)] for k, v in value.items()]}
    raise TypeError(f"{type(value).__qualname__} at {name}")


def _decode(value, read):
    if isinstance(value, list):
        return [_decode(v, read) for v in value]
    if isinstance(value, dict):
        if "$tensor" in value:
            return read(value["$tensor"])
        if "$float" in value:
            return float(value["$float"])
        if "$tuple" in value:
            return tuple(_decode(v, read) for v in value["$tuple"])
        if "$dict" in value:
            return {_decode(k, read): _decode(v, read) for k, v in value["$dict"]}
        return {k: _decode(v, read) for k, v in value.items()}
    return value


def dumps(value):
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


# ---- The optimizer --------------------------------------------------------------------------


def parameter_names(model, optimizer, what="model"):
    """The model's name for each of the optimizer's parameters, by position in its param_groups
    (the indices its state_dict uses). Raises ValueError naming the first one the model lacks."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    names = []
    for g, group in enumerate(optimizer.param_groups):
        for k, p in enumerate(group["params"]):
            if id(p) not in by_id:
                raise ValueError(
                    f"the optimizer's parameter {k} of group {g} (shape {list(p.shape)}) is not a parameter of the "
                    f"{what} given to crashcap.Recorder: build the optimizer from {what}.parameters() of that {what} "
                    f"(not copies made by .clone() or .to() after the optimizer was built)")
            names.append(by_id[id(p)])
    return names


def optimizer_spec(optimizer, names):
    """(kind, [(parameter names, {option: number})]) for the bundle's optimizer record."""
    groups, position = [], 0
    for group in optimizer.param_groups:
        count = len(group["params"])
        options = {}
        for key, value in group.items():
            if key == "params":
                continue
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            if key == "betas" and isinstance(value, (tuple, list)) and len(value) == 2:
                options["beta1"], options["beta2"] = float(value[0]), float(value[1])
            elif isinstance(value, bool):
                options[key] = 1.0 if value else 0.0
            elif isinstance(value, (int, float)):
                options[key] = float(value)
        groups.append((names[position:position + count], options))
        position += count
    return getattr(optimizer, "_crashcap_kind", None) or type(optimizer).__name__.lower(), groups


# The optimizers LibTorch has, by the kind optimizer_spec names them (crashcap's C++ replay
# builds them from the recorded options).
LIBTORCH_OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "adagrad")


def require_script_module(program):
    if not isinstance(program, torch.jit.ScriptModule):
        raise TypeError(f"crashcap.Recorder(program=...) takes a TorchScript module (torch.jit.script of a module whose "
                        f"forward takes the batch's tensors and returns the loss), not {type(program).__qualname__}")


def torchscript_archive(program, kind, groups):
    """The bytes of torch.jit.save(program), after checking that crashcap can replay the step
    without Python: a TorchScript module, and an optimizer LibTorch has with options it has."""
    require_script_module(program)
    if kind not in LIBTORCH_OPTIMIZERS:
        raise ValueError(f"crashcap.Recorder(program=...) replays the step without Python, with LibTorch's optimizers "
                         f"({', '.join(LIBTORCH_OPTIMIZERS)}), and this optimizer is '{kind}': record without program= "
                         f"(the training then replays itself)")
    for g, (_, options) in enumerate(groups):
        for key in ("maximize", "capturable", "differentiable", "fused"):
            if options.get(key):
                raise ValueError(f"crashcap.Recorder(program=...) replays with LibTorch's {kind}, which has no {key}=True "
                                 f"(parameter group {g}): record without program=")
    buffer = io.BytesIO()
    torch.jit.save(program, buffer)
    return buffer.getvalue()


def learning_rates(optimizer):
    return [float(g["lr"]) for g in optimizer.param_groups if "lr" in g]


def optimizer_keyframe(optimizer, names):
    """([(<parameter>/<key>, tensor)], JSON) of the optimizer's state_dict."""
    state = optimizer.state_dict()
    tensors = []
    doc = {"state": [], "param_groups": _encode(state["param_groups"], "groups", tensors)}
    for index, per_parameter in state["state"].items():
        name = names[index] if isinstance(index, int) and 0 <= index < len(names) else f"state{index}"
        doc["state"].append([index, _encode(per_parameter, name, tensors)])
    return tensors, dumps(doc)


def restore_optimizer(optimizer, document, read):
    doc = json.loads(document)
    state = {index: _decode(value, read) for index, value in doc["state"]}
    optimizer.load_state_dict({"state": state, "param_groups": _decode(doc["param_groups"], read)})


def state_document(obj):
    """JSON of a scheduler's or GradScaler's state_dict. Entries JSON cannot hold (a scheduler's
    bound methods, lambdas) are left out: load_state_dict keeps the live object's there, which the
    same program built the same way. None when the state_dict is not a dict."""
    state = obj.state_dict()
    if not isinstance(state, dict):
        return None
    doc = {}
    for key, value in state.items():
        tensors = []
        try:
            encoded = _encode(value, str(key), tensors)
        except TypeError:
            continue
        if not tensors and isinstance(key, str):
            doc[key] = encoded
    return dumps(doc)


def restore_document(obj, document):
    obj.load_state_dict(_decode(json.loads(document), lambda name: None))


def module_modes(model):
    """JSON: the names of the modules in eval mode (a frozen batch norm in a training model), of
    the parameters that take no gradient (a layer frozen by requires_grad_(False)), and of those
    that hold a dense gradient tensor. A keyframe is taken between steps and holds no gradient
    values, but whether one exists changes the update: an optimizer skips a parameter whose
    gradient is None, and updates one whose gradient is zero (a frozen layer after
    zero_grad(set_to_none=False) goes on moving with its momentum). A sparse gradient (an
    Embedding's with sparse=True) is left as None: a dense zero one would make the next backward's
    gradient dense."""
    parameters = list(model.named_parameters())
    return dumps({"eval": [name for name, m in model.named_modules() if not m.training],
                  "frozen": [name for name, p in parameters if not p.requires_grad],
                  "grads": [name for name, p in parameters if p.grad is not None and p.grad.layout == torch.strided]})


def restore_module_modes(model, document):
    """Sets back what module_modes() kept: a dense gradient that existed comes back as zeros (what
    a step's backward adds to after zero_grad()), any other gradient as None."""
    modes = json.loads(document)
    evaluating = set(modes.get("eval", []))
    for name, m in model.named_modules():
        m.training = name not in evaluating
    # Absent from keyframes written before they were kept: the parameters are then left as they are.
    frozen = set(modes["frozen"]) if "frozen" in modes else None
    grads = set(modes["grads"]) if "grads" in modes else None
    for name, p in model.named_parameters():
        if frozen is not None:
            p.requires_grad_(name not in frozen)
        if grads is not None:
            if name not in grads:
                p.grad = None
            elif p.grad is None or p.grad.layout != torch.strided:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.detach_().zero_()


# ---- Python's generators ---------------------------------------------------------------------


def _float_bits(x):
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _bits_float(b):
    return struct.unpack("<d", struct.pack("<q", int(b)))[0]


class _Generators:
    """[(name, int64 tensor)] each step: random's state, and numpy's global one when numpy is
    imported. Called on the training thread at every step, where its cost counts: in a training the
    main process rarely draws from either (its DataLoader workers have their own), so a state that
    has not changed since the last step is given as the same tensor again, found without building
    it anew.

    - random: getstate() builds 625 ints and comparing them with the last state's costs as much
      again (together 20-70 us a step, by how cold the caches are). The Mersenne Twister's
      position and words are read in place instead, as 2,500 bytes of the generator object (0.3
      us), and getstate() is called only when they or its cached Gaussian moved. The place is
      checked once against getstate(): where it does not match (another Python's layout), every
      step compares getstate()'s tuple as before.
    - numpy: its legacy get_state() is slow (37 us). The MT19937 words are read in place through
      the bit generator's ctypes address; get_state() is called only when they moved, or when the
      last state held a cached Gaussian (drawing it changes has_gauss and not the words)."""

    def __init__(self):
        self._python = (None, None)          # (the state as last seen, tensor)
        self._python_words = None            # (random's generator, a live view of its words), False: not readable
        self._numpy = None                   # (bit generator, live words view, their bytes then, tensor, has_gauss)

    def __call__(self):
        out = [("python", self._python_state())]
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            tensor = self._numpy_state(numpy)
            if tensor is not None:
                out.append(("numpy", tensor))
        return out

    def _python_state(self):
        last, tensor = self._python
        if self._python_words:
            generator, words = self._python_words
            seen = (words.raw, generator.gauss_next)
            if seen == last:
                return tensor
        state = random.getstate()
        if self._python_words is None:
            self._python_words = _python_words(state)
        if self._python_words:
            generator, words = self._python_words
            # Read after getstate(): had another thread drawn in between, the next step's read
            # would differ from this one and build the tensor again.
            seen = (words.raw, generator.gauss_next)
        else:
            seen = state
        if seen != last:
            version, words, gauss = state
            tensor = torch.tensor([version, *words, gauss is not None, _float_bits(gauss or 0.0)], dtype=torch.int64)
            self._python = (seen, tensor)
        return tensor

    def _numpy_state(self, numpy):
        cached = self._numpy
        bits = _numpy_bit_generator(numpy)
        # bytes == bytes: numpy.array_equal costs five times more, most of it its own machinery
        if cached is not None and bits is not None and cached[0] is bits and not cached[4] and cached[1].tobytes() == cached[2]:
            return cached[3]
        kind, keys, pos, has_gauss, gauss = numpy.random.get_state()
        if kind != "MT19937":
            return None
        tensor = torch.cat([torch.from_numpy(keys.astype("int64")),
                            torch.tensor([pos, has_gauss, _float_bits(gauss)], dtype=torch.int64)])
        words = _numpy_words(numpy, bits)
        self._numpy = (bits, words, words.tobytes(), tensor, bool(has_gauss)) if words is not None else None
        return tensor


def _python_words(state):
    """(random's generator, a ctypes view of its position and 624 words in place), or False when
    they are not where CPython keeps them (after the object's header: an int, then the words) or do
    not match `state`, random.getstate() read just before."""
    try:
        import ctypes
        generator = getattr(random.getstate, "__self__", None)
        if generator is None or not hasattr(generator, "gauss_next"):
            return False
        view = ctypes.c_char * (4 + 624 * 4)
        if type(generator).__basicsize__ < object.__basicsize__ + ctypes.sizeof(view):
            return False                 # smaller than CPython's: never read past the object
        words = view.from_address(id(generator) + object.__basicsize__)
        position, *twister = struct.unpack("=i624I", words.raw)
        version, saved, _ = state
        return (generator, words) if version == 3 and list(saved) == [*twister, position] else False
    except Exception:
        return False


def _numpy_bit_generator(numpy):
    """The MT19937 under numpy's global RandomState (numpy >= 1.17), or None."""
    try:
        return numpy.random.mtrand._rand._bit_generator
    except AttributeError:
        return None


def _numpy_words(numpy, bits):
    """A live uint32 view of the bit generator's 624 words and position (its mt19937_state), or None."""
    try:
        import ctypes
        if type(bits).__name__ != "MT19937":
            return None
        return numpy.ctypeslib.as_array((ctypes.c_uint32 * 625).from_address(bits.ctypes.state_address))
    except Exception:  # no ctypes interface: the state is read through get_state() every step
        return None


python_generators = _Generators()


def restore_python_generator(state):
    v = state.tolist()
    random.setstate((v[0], tuple(v[1:626]), _bits_float(v[627]) if v[626] else None))


def restore_numpy_generator(state):
    import numpy
    v = state.tolist()
    numpy.random.set_state(("MT19937", numpy.array(v[:624], dtype=numpy.uint32), v[624], v[625], _bits_float(v[626])))


def dataloader_worker_failure(exc, wait=10.0, dumping_wait=120.0):
    """The DataLoader's own word on a worker that died ("DataLoader worker (pid 123) is killed by
    signal: Segmentation fault."), or None: from the loader's check of its workers, or, for a
    worker the loader found gone ("exited unexpectedly") or a broken pipe, from the exit codes of
    the workers of a loader iterator `exc` was raised in. A broken pipe from a dying worker
    (ConnectionResetError, EOFError) often reaches the training before the worker's exit does (a
    worker that segfaults dumps core first), so for those, when DataLoader workers ran in this
    process, it waits up to `wait` seconds for the exit to show. The wait ends as soon as it does;
    2 s was too short on a loaded 2-core machine, where writing a worker's core took longer and the
    bundle kept only "Connection reset by peer". A child still writing its core file is dying for
    certain, and writing a large one to a busy disk takes longer than that: the wait goes on while
    a child is writing its core or exiting (up to `dumping_wait` seconds in all)."""
    check = getattr(torch._C, "_error_if_any_worker_fails", None)
    if check is None:
        return None
    from torch.utils.data._utils import signal_handling
    workers_ran = getattr(signal_handling, "_SIGCHLD_handler_set", True)
    broken_pipe = isinstance(exc, (ConnectionError, EOFError))
    start = time.monotonic()
    deadline = start + (wait if broken_pipe and workers_ran else 0)
    while True:
        try:
            check()
        except RuntimeError as e:
            return str(e).strip()
        # Its check knows a worker the loader has not reaped; one found dead by its own wait
        # ("exited unexpectedly") was reaped, and its exit code is the iterator's to read. Only
        # then: reading it reaps a worker the loader's own check has yet to see.
        died = _worker_death_in_traceback(exc) if broken_pipe or "exited unexpectedly" in str(exc) else None
        if died:
            return died
        now = time.monotonic()
        if now >= deadline:
            if not (broken_pipe and workers_ran and now < start + dumping_wait and _a_child_is_dying()):
                return None
        time.sleep(0.005)


def worker_death_pids(text):
    """The process ids of the DataLoader workers whose death `text` reports, in the DataLoader's own
    words ("DataLoader worker (pid 123) is killed by signal: ...", "DataLoader worker (pid(s) 12, 34)
    exited unexpectedly"); empty when it reports none."""
    pids = []
    for group in re.findall(r"DataLoader worker \(pid(?:\(s\))? ([0-9, ]+)\)", text or ""):
        pids += [int(p) for p in group.replace(",", " ").split()]
    return pids


def _worker_death_in_traceback(exc):
    """A DataLoader worker's death read from the loader iterator the broken pipe (or "exited
    unexpectedly") came out of (a frame of its traceback has it as `self`): its worker processes'
    exit codes. PyTorch's own check knows only the workers still registered; an iterator shut
    down meanwhile has forgotten them."""
    try:
        tb = exc.__traceback__
        while tb is not None:
            it = tb.tb_frame.f_locals.get("self")
            tb = tb.tb_next
            workers = getattr(it, "_workers", None) if type(it).__name__ == "_MultiProcessingDataLoaderIter" else None
            for w in workers or ():
                code = w.exitcode  # None while it runs
                if code is not None and code < 0:
                    try:
                        name = signal.strsignal(-code) or f"signal {-code}"
                    except ValueError:
                        name = f"signal {-code}"
                    return f"DataLoader worker (pid {w.pid}) is killed by signal: {name}."
    except Exception:  # an iterator of another torch version: PyTorch's own check is all there is
        return None
    return None


def _a_child_is_dying():
    """Whether a child of this process is writing its core file (Linux's CoreDumping, 4.15 on) or
    exiting (PF_EXITING: freeing a large worker's memory takes a while too)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:  # no /proc
        return False
    children = set()
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                children.update(f.read().split())
        except OSError:  # the thread has ended meanwhile, or a kernel without the children files
            continue
    for pid in children:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] in ("Z", "X"):  # exited: whatever it was, its exit shows already
                continue
            if int(fields[6]) & 0x4:  # PF_EXITING
                return True
            with open(f"/proc/{pid}/status") as f:
                if any(line.split() == ["CoreDumping:", "1"] for line in f):
                    return True
        except (OSError, ValueError, IndexError):  # it has gone meanwhile
            pass
    return False


def _cwd():
    try:
        return os.getcwd()
    except OSError:  # the directory was removed
        return ""


_IMPORTED_IN = _cwd()  # where the program was when it imported crashcap (its first lines, as a rule)


def start_directory():
    """The directory the program started in, where a replay must run it again: its relative paths
    (the script, its data) are relative to it, whatever os.chdir() it did before recording began.
    crashcap run --record's bootstrap saw it at start-up; without it, where crashcap was imported."""
    boot = sys.modules.get("sitecustomize")
    return getattr(boot, "CRASHCAP_START_DIRECTORY", None) or _IMPORTED_IN or _cwd()


def program_facts():
    """Facts for the environment record that only Python knows."""
    # The path as invoked, not resolved: a virtualenv's bin/python is a link to the base
    # interpreter, and only through the link does it find the environment's packages.
    facts = [("process.cwd", start_directory()),
             ("python.executable", os.path.abspath(sys.executable)),
             ("python.version", sys.version.split()[0]),
             ("python.torch_version", torch.__version__)]
    # Where the program found its modules: PYTHONPATH, and this package's own directory.
    package_parent = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_parent not in (os.path.realpath(p) for p in paths):
        paths.append(package_parent)
    facts.append(("python.pythonpath", os.pathsep.join(paths)))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        facts.append(("python.numpy_version", numpy.__version__))
    return facts


# ---- A rank of a multi-process job -----------------------------------------------------------

def record_distributed(native):
    """Gives the native recorder this process's place in torch.distributed's default process
    group (rank, world size, backend, an init method other than env://), when the program made
    one; the native recorder adds what the launcher's variables say (local rank, MASTER_ADDR and
    MASTER_PORT, the job id). True when it did; False when there is no group (yet)."""
    try:
        dist = torch.distributed
        if not dist.is_available() or not dist.is_initialized():
            return False
        rank, world, backend = dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
    except Exception:  # a half-made or destroyed group: nothing to say about it
        return False
    method = getattr(dist.distributed_c10d, "_default_pg_init_method", None)
    if not isinstance(method, str) or method == "env://":
        method = ""
    native.set_distributed(rank, world, -1, backend, method, "torch.distributed")
    return True


# ---- The program's own sources ----------------------------------------------------------------

_KEEP_BYTES = 1 << 20        # a file larger than this keeps only its hash
_KEEP_TOTAL = 16 << 20


def _installed_roots():
    """The directories whose files are installed, not the program's: the standard library (where
    `os` lives), the site directories, every sys.path entry named site-packages or dist-packages,
    the prefixes' lib directories and crashcap's own. (sysconfig names the same directories, but
    its first call loads the interpreter's build configuration: 6 ms at the start of a recording.)"""
    roots = {os.path.realpath(os.path.dirname(os.__file__))}
    try:
        import site
        roots.update(os.path.realpath(p) for p in site.getsitepackages())
    except Exception:  # an embedded or stripped interpreter without site's helpers
        pass
    for path in sys.path:
        if path and ("site-packages" in path or "dist-packages" in path):
            roots.add(os.path.realpath(path))
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        roots.add(os.path.realpath(os.path.join(prefix, "lib")))
    roots.add(os.path.realpath(os.path.dirname(__file__)))  # crashcap itself
    return roots


def _under(path, root):
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


# (where the reading was made, the newest entry of sys.modules then, program_sources() then): read
# before a DataLoader started its worker processes, for the recording that begins at its first batch.
_sources_read_early = None


def prepare_before_fork():
    """Does now what the first step of a recording about to begin would do after a DataLoader
    forked its workers (the iteration that forks them starts before the first batch): every page
    of the process a step writes to after a fork is copied for this process alone first, so a
    first step that touches many objects pays for each. It reads program_sources() (a reference
    count written in each of some thousand modules: 25 ms after the fork, 2 ms before it;
    program_sources(early=True) takes the reading, with what was imported since), and makes the
    readers of the Python generators' states (imports, views), whose states are read again at the
    step (docs/PERFORMANCE.md, "A fifteenth look")."""
    global _sources_read_early
    newest = next(reversed(sys.modules.items()), None)
    _sources_read_early = (_sources_context(), newest, program_sources())
    python_generators()


def _sources_context():
    """What program_sources() depends on besides the modules: the directory, PYTHONPATH, the main script."""
    main = sys.modules.get("__main__")
    return os.getcwd(), os.environ.get("PYTHONPATH", ""), getattr(main, "__file__", None) if main is not None else None


def _imported_since(newest):
    """The modules imported after `newest` ((name, module), the last entry of sys.modules then), in
    the order of import: sys.modules keeps that order, so they are its last entries, reached from its
    end without touching the ones before. None when `newest` is no longer there as it was."""
    if newest is None:
        return None
    since = []
    for name, module in reversed(sys.modules.items()):
        if name == newest[0] and module is newest[1]:
            since.reverse()
            return since
        since.append(module)
    return None


def program_sources(early=False):
    """[(path, sha256, bytes, contents or None)] of the program's own source files: the main
    script and the modules it imported from its own directory, the working directory or a
    PYTHONPATH entry, not from installed packages, the standard library or elsewhere (the
    system's sitecustomize). A file is installed when its path, as imported or resolved, lies under
    a site or standard-library directory. `early`: what prepare_before_fork() read (taken once),
    with the files of the modules imported since; read anew when the directory, PYTHONPATH or the
    main script changed, or the modules imported then are not all there."""
    global _sources_read_early
    prior, modules = [], None
    if early:
        read, _sources_read_early = _sources_read_early, None
        if read is not None and read[0] == _sources_context():
            modules = _imported_since(read[1])
            if modules is not None:
                prior = read[2]
    if modules is None:
        modules = list(sys.modules.values())
    start, pythonpath, main_file = _sources_context()
    cwd = os.path.realpath(start)
    installed = _installed_roots()
    files = []
    if main_file:
        files.append(main_file)
    own = {cwd} | {os.path.realpath(p) for p in pythonpath.split(os.pathsep) if p}
    if main_file:
        own.add(os.path.dirname(os.path.realpath(main_file)))
    for module in modules:
        # From the module's namespace: getattr would call a module's __getattr__ (lazy imports,
        # deprecation warnings), and some entries of sys.modules are not modules at all.
        f = vars(module).get("__file__") if isinstance(module, types.ModuleType) else None
        if isinstance(f, str) and f.endswith(".py"):
            files.append(f)
    # Most of the ~1000 modules a torch program has imported live under an installed root by their
    # path as given: skipped without resolving it (realpath costs a system call per component).
    installed_prefixes = tuple(r.rstrip(os.sep) + os.sep for r in installed)
    out = list(prior)
    seen = {os.path.normpath(os.path.join(cwd, path)) for path, *_ in prior}
    kept = sum(len(data) for *_, data in prior if data is not None)
    for f in files:
        if f.startswith(installed_prefixes):
            continue
        real = os.path.realpath(f)
        if real in seen or not os.path.isfile(real) or any(_under(real, r) for r in installed):
            continue
        if f is not main_file and not any(_under(real, r) for r in own):
            continue
        seen.add(real)
        with open(real, "rb") as fh:
            data = fh.read()
        path = os.path.relpath(real, cwd) if _under(real, cwd) else real
        keep = len(data) <= _KEEP_BYTES and kept + len(data) <= _KEEP_TOTAL and len(path) < 900
        kept += len(data) if keep else 0
        out.append((path, hashlib.sha256(data).hexdigest(), len(data), data if keep else None))
    return out
