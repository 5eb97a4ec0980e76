"""A batch as the recorder keeps it: flat named tensors plus the structure they nest in.

A training's batch is a tensor, or tuples, lists and dicts of tensors (and of plain values:
file names, ids). The recorder stores each tensor under a path name ("image", "0", "inputs/ids")
and the nesting as JSON (StepBegin.structure in the bundle), from which replay rebuilds a batch of
the same shape: tuples stay tuples, dicts keep their key order.

Structure nodes:
  {"tensor": NAME}              a tensor, stored as steps/<step>/batch/NAME
  {"tuple": [NODE...]}          also named tuples (rebuilt as plain tuples)
  {"list": [NODE...]}
  {"dict": [[KEY, NODE]...]}    KEY a string or an integer
  {"value": V}                  a JSON value (str, int, float, bool, None) kept as is
  {"opaque": TEXT}              anything else: its type and repr, rebuilt as None
"""

import json
import math

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


def _walk(value, path, tensors, used):
    """The structure node of `value`; its tensors appended to `tensors` under fresh names."""
    if isinstance(value, torch.Tensor):
        name = _name_for(path, used)
        tensors.append((name, value))
        return {"tensor": name}
    if isinstance(value, dict):
        items = []
        for key, sub in value.items():
            plain_key = key if isinstance(key, (str, int)) and not isinstance(key, bool) else str(key)
            items.append([plain_key, _walk(sub, path + [_part(key)], tensors, used)])
        return {"dict": items}
    if isinstance(value, tuple):
        return {"tuple": [_walk(sub, path + [str(i)], tensors, used) for i, sub in enumerate(value)]}
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
    flat = not added and "dict" in root and all(
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


def _build(node, tensors):
    if "tensor" in node:
        return tensors.get(node["tensor"])
    if "tuple" in node:
        return tuple(_build(n, tensors) for n in node["tuple"])
    if "list" in node:
        return [_build(n, tensors) for n in node["list"]]
    if "dict" in node:
        return {key: _build(n, tensors) for key, n in node["dict"]}
    if "value" in node:
        return node["value"]
    return None
