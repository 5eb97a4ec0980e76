"""A batch as the recorder keeps it: flat named tensors plus the structure they nest in.

A training's batch is a tensor, or tuples, lists and dicts of tensors (and of plain values:
file names, ids). The recorder stores each tensor under a path name ("image", "0", "inputs/ids")
and the nesting as JSON (StepBegin.structure in the bundle), from which replay rebuilds a batch of
the same shape: tuples stay tuples, dicts keep their key order.

Structure nodes:
  {"tensor": NAME}              a tensor, stored as steps/<step>/batch/NAME
  {"tuple": [NODE...]}           a namedtuple's also has "fields": [NAME...], which name its
                                parts' tensors ("label", "targets/0/boxes") as a dict's keys do
  {"list": [NODE...]}
  {"dict": [[KEY, NODE]...]}    KEY a string or an integer
  {"object": [[FIELD, NODE]...]} a dataclass, or an object of a class of the program's whose
                                attributes (vars()) are the batch's parts
  {"value": V}                  a JSON value (str, int, float, bool, None) kept as is
  {"opaque": TEXT}              anything else: its type and repr, rebuilt as None

A tuple, dict or object node of a class that is not the plain one (a namedtuple, an OrderedDict, a
UserDict such as transformers' BatchEncoding, a dataclass) also has "type": "MODULE:QUALNAME", and
is rebuilt as that class when the replayed program has it (a module it imported, never one imported
for the purpose): a namedtuple from its items, a mapping from a dict of its items, an object without
its __init__ by setting the recorded attributes. Without the class, the plain container.
"""

import collections.abc
import dataclasses
import json
import math
import sys

import torch

# Longest name part kept from a dict key; the bundle's names are at most 1024 bytes.
_MAX_PART = 100


def _part(key):
    text = str(key)
    text = "".join(c if c.isprintable() and c != "/" else "_" for c in text) or "_"
    return text[:_MAX_PART]


def _name_for(path, used):
    name = "/".join(path) if path else "batch"
    candidate, k = name, 1
    while candidate in used:
        candidate = f"{name}~{k}"
        k += 1
    used.add(candidate)
    return candidate


def _typed(node, value, plain):
    """`node` with the class of `value` when it is not `plain`."""
    cls = type(value)
    if cls is not plain:
        node["type"] = f"{cls.__module__}:{cls.__qualname__}"
    return node


def _walk(value, path, tensors, used):
    """The structure node of `value`; its tensors appended to `tensors` under fresh names."""
    if isinstance(value, torch.Tensor):
        name = _name_for(path, used)
        tensors.append((name, value))
        return {"tensor": name}
    if isinstance(value, collections.abc.Mapping):  # dict, OrderedDict, UserDict (BatchEncoding)
        items = []
        for key, sub in value.items():
            plain_key = key if isinstance(key, (str, int)) and not isinstance(key, bool) else str(key)
            items.append([plain_key, _walk(sub, path + [_part(key)], tensors, used)])
        return _typed({"dict": items}, value, dict)
    if isinstance(value, tuple):
        fields = _fields(value)
        parts = fields or [str(i) for i in range(len(value))]
        node = {"tuple": [_walk(sub, path + [p], tensors, used) for p, sub in zip(parts, value)]}
        if fields:
            node["fields"] = fields
        return _typed(node, value, tuple)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [[f.name, _walk(getattr(value, f.name), path + [_part(f.name)], tensors, used)]
                  for f in dataclasses.fields(value)]
        return _typed({"object": fields}, value, None)
    if _plain_object(value):
        fields = [[k, _walk(v, path + [_part(k)], tensors, used)] for k, v in vars(value).items()]
        return _typed({"object": fields}, value, None)
    if isinstance(value, list):
        # A list of plain values (file names, ids) is one value, not a node per element.
        if all(v is None or isinstance(v, (str, bool, int)) or (isinstance(v, float) and math.isfinite(v))
               for v in value):
            return {"value": value}
        return {"list": [_walk(sub, path + [str(i)], tensors, used) for i, sub in enumerate(value)]}
    if value is None or isinstance(value, (str, bool, int)):
        return {"value": value}
    if isinstance(value, float):
        return {"value": value} if math.isfinite(value) else {"opaque": f"float {value!r}"}
    return {"opaque": f"{type(value).__module__}.{type(value).__qualname__}: {repr(value)[:200]}"}


def _fields(value):
    """A namedtuple's field names, by which its parts are named ("batch/label", not "batch/1");
    None for another tuple, or for field names that would not name its parts one to one."""
    fields = getattr(type(value), "_fields", None)
    if (not isinstance(fields, tuple) or len(fields) != len(value) or not all(isinstance(f, str) for f in fields)
            or len(set(fields)) != len(fields) or any(_part(f) != f for f in fields)):
        return None
    return list(fields)


def _plain_object(value):
    """An instance of a class of the program's that holds its parts as attributes and nothing a
    setattr could not give back (no __slots__, a module that is not a library's)."""
    cls = type(value)
    if not hasattr(value, "__dict__") or hasattr(cls, "__slots__") or isinstance(value, type):
        return False
    if isinstance(value, (list, tuple, dict, set, frozenset, str, bytes, int, float)):
        return False  # a subclass of a built-in holds its parts in what it is: walked as that

    module = cls.__module__ or ""
    if module == "builtins" or module.split(".")[0] in ("torch", "numpy", "collections", "typing"):
        return False
    return all(isinstance(v, (torch.Tensor, str, int, float, bool, list, tuple, dict, type(None)))
               for v in vars(value).values())


def holds_samples(batch, rows):
    """Whether a list or tuple in the batch has `rows` items that each hold a tensor: each sample's
    own tensors (detection targets, images of their own sizes), which have no dimension of rows."""
    if isinstance(batch, collections.abc.Mapping):
        return any(holds_samples(v, rows) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        if len(batch) == rows and rows > 0 and all(next(tensors_of(v), None) is not None for v in batch):
            return True
        return any(holds_samples(v, rows) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return any(holds_samples(getattr(batch, f.name), rows) for f in dataclasses.fields(batch))
    return False


def tensors_of(batch):
    """The batch's tensors in the order flatten() names them, without naming them."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, collections.abc.Mapping):
        for v in batch.values():
            yield from tensors_of(v)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            yield from tensors_of(v)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for f in dataclasses.fields(batch):
            yield from tensors_of(getattr(batch, f.name))
    elif _plain_object(batch):
        for v in vars(batch).values():
            yield from tensors_of(v)


def opaque_parts(structure_node, path="batch"):
    """What of a batch structure (the parsed node) is kept only as text: [(path, text)]."""
    out = []
    if "opaque" in structure_node:
        return [(path, structure_node["opaque"])]
    fields = structure_node.get("fields")
    for i, sub in enumerate(structure_node.get("tuple", ())):
        out += opaque_parts(sub, f"{path}.{fields[i]}" if fields else f"{path}[{i}]")
    for i, sub in enumerate(structure_node.get("list", ())):
        out += opaque_parts(sub, f"{path}[{i}]")
    for key in ("dict", "object"):
        for name, sub in structure_node.get(key, ()):
            out += opaque_parts(sub, f"{path}.{name}" if key == "object" else f"{path}[{name!r}]")
    return out


def flatten(batch, extra=()):
    """(tensors, structure): tensors as [(name, tensor)], structure as JSON text ("" when the
    batch is a flat dict of tensors with plain string keys, the C++ recorder's form).

    `extra`: [(name, tensor)] stored beside the batch's own tensors but not part of its
    structure (the dataset indices the loader's sampler drew), each only when its name is free;
    replay rebuilds the batch without them. A callable in place of the tensor is called only then."""
    # Module-level helpers, not nested closures: a recursive closure is a reference cycle, and
    # one that held the batch's tensors kept every step's batch (shared memory from the loader's
    # workers) alive until the garbage collector happened to run.
    tensors = []
    used = set()
    root = _walk(batch, [], tensors, used)
    added = False
    for name, tensor in extra:
        if name not in used:
            used.add(name)
            tensors.append((name, tensor() if callable(tensor) else tensor))
            added = True
    flat = not added and "dict" in root and "type" not in root and all(
        isinstance(k, str) and "tensor" in node and node["tensor"] == k for k, node in root["dict"])
    structure = "" if flat else json.dumps(root, separators=(",", ":"))
    if len(structure) > 60_000:
        # StepBegin.structure holds at most 64 KiB: keep the tensors, say what was dropped.
        structure = json.dumps({"opaque": f"a batch structure of {len(structure)} bytes (too large to keep)"})
    return tensors, structure


def rebuild(structure, tensors):
    """The batch from its structure and {name: tensor}. Tensors the structure names but
    `tensors` lacks become None."""
    if not structure:
        return dict(tensors)
    return _build(json.loads(structure), tensors)


def _class_of(node):
    """The class a node names, from the modules the program imported; None without one."""
    name = node.get("type")
    if not isinstance(name, str) or ":" not in name:
        return None
    module, qualname = name.split(":", 1)
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None) if obj is not None and part != "<locals>" else None
    return obj if isinstance(obj, type) else None


def _build(node, tensors):
    if "tensor" in node:
        return tensors.get(node["tensor"])
    if "tuple" in node:
        items = tuple(_build(n, tensors) for n in node["tuple"])
        cls = _class_of(node)
        if cls is not None and issubclass(cls, tuple):
            try:
                return cls._make(items) if hasattr(cls, "_make") else cls(items)
            except Exception:
                pass
        return items
    if "list" in node:
        return [_build(n, tensors) for n in node["list"]]
    if "dict" in node:
        items = {key: _build(n, tensors) for key, n in node["dict"]}
        cls = _class_of(node)
        if cls is not None and issubclass(cls, collections.abc.Mapping):
            try:
                return cls(items)
            except Exception:
                pass
        return items
    if "object" in node:
        fields = {name: _build(n, tensors) for name, n in node["object"]}
        cls = _class_of(node)
        if cls is None:
            return fields
        obj = cls.__new__(cls)  # the recorded attributes, without running its __init__ again
        for name, value in fields.items():
            object.__setattr__(obj, name, value)
        return obj
    if "value" in node:
        return node["value"]
    return None
