"""JSON summaries of the values a TorchRL documentation example leaves behind.

The golden files under ``tests/goldens/torchrl/`` are written by ``scripts/torchrl_goldens.py`` (run in a side
virtual environment that has ``torchrl==0.14.1``) with :func:`summarize_globals`. A test in the main environment
(no torchrl) can run the same example against llmrl and compare with the same function, so this module only
needs ``torch`` and ``tensordict``.

Summary format (every summary is a JSON object with a ``kind``):

- ``tensor``: ``shape``, ``dtype`` and ``values`` (nested lists; floats at full precision, non-finite floats as
  the strings ``"nan"``, ``"inf"``, ``"-inf"``). Inside a TensorDict, ``values`` is only kept below
  :data:`MAX_LEAF_VALUES` elements.
- ``nested_tensor``: ``layout``, ``dtype``, ``shape`` (``None`` for ragged dims) and ``components`` (one
  ``tensor`` summary per row).
- ``tensor_list``: ``items`` (what ``td.get(key, as_list=True)`` gives for a key with ragged entries).
- ``tensordict``: ``class``, ``batch_size``, ``keys`` (sorted nested leaf keys, as lists of str), ``leaves``
  (``"a/b"`` -> leaf summary) and ``classes`` (``"a"`` -> class name of each nested collection, tensorclasses
  included).
- ``tensorclass``: same fields as ``tensordict``; the nested keys are the dataclass fields.
- ``non_tensor``: ``class``, ``batch_size`` and ``value`` (the Python data, made JSON-safe).
- ``str``, ``int``, ``float``, ``bool``: ``value``; ``list[str]``: ``value``; ``size``: ``value`` (a list).
- inside collections only: ``none`` for a ``None`` field, ``list`` (``value``) for a Python list field,
  ``empty`` for an empty nested collection, ``error`` (``message``) when a key cannot be read, ``other``
  (``type`` and ``repr``) for anything else.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import torch

MAX_LEAF_VALUES = 5000

try:  # tensordict is a dependency of both environments; keep the module importable without it anyway
    from tensordict import NonTensorStack, is_non_tensor, is_tensor_collection, is_tensorclass
except ImportError:  # pragma: no cover
    NonTensorStack = None  # type: ignore[assignment,misc]

    def is_non_tensor(obj: Any) -> bool:  # type: ignore[misc]
        return False

    def is_tensor_collection(obj: Any) -> bool:  # type: ignore[misc]
        return False

    def is_tensorclass(obj: Any) -> bool:  # type: ignore[misc]
        return False


def _float(x: float) -> float | str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _clean(values: Any) -> Any:
    """Replace non-finite floats (recursively) so that ``json.dumps(..., allow_nan=False)`` works."""
    if isinstance(values, float):
        return _float(values)
    if isinstance(values, list):
        return [_clean(v) for v in values]
    return values


def to_jsonable(obj: Any, depth: int = 0) -> Any:
    """Python data (as found in non-tensor leaves) made JSON-safe; unknown objects become ``{type, repr}``."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return _float(obj)
    if isinstance(obj, torch.Tensor):
        return tensor_summary(obj)
    if depth > 20:
        return {"type": type(obj).__name__, "repr": repr(obj)[:200]}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v, depth + 1) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v, depth + 1) for k, v in obj.items()}
    if is_tensor_collection(obj):
        return summarize(obj)
    return {"type": type(obj).__name__, "repr": repr(obj)[:200]}


def tensor_summary(t: torch.Tensor, with_values: bool = True) -> dict:
    """Shape, dtype and (optionally) values of a tensor; nested tensors are summarized row by row."""
    if t.is_nested:
        try:
            shape = list(t.size())
        except RuntimeError:
            shape = [t.size(0)] + [None] * (t.dim() - 1)
        shape = [s if isinstance(s, int) else None for s in shape]
        return {
            "kind": "nested_tensor",
            "layout": str(t.layout),
            "dtype": str(t.dtype),
            "shape": shape,
            "components": [tensor_summary(c, with_values) for c in t.unbind(0)],
        }
    out: dict[str, Any] = {"kind": "tensor", "shape": list(t.shape), "dtype": str(t.dtype)}
    if with_values:
        t = t.detach().cpu()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        if t.is_sparse:
            t = t.to_dense()
        out["values"] = _clean(t.tolist())
    return out


def _non_tensor_summary(obj: Any) -> dict:
    try:
        value = obj.tolist() if isinstance(obj, NonTensorStack) else obj.data
    except Exception as err:  # a summary must not fail on odd data
        value = {"error": f"{type(err).__name__}: {err}"}
    return {
        "kind": "non_tensor",
        "class": type(obj).__name__,
        "batch_size": list(obj.batch_size),
        "value": to_jsonable(value),
    }


def _is_non_tensor(obj: Any) -> bool:
    # NonTensorData, NonTensorStack and MetaData (e.g. LogProbs.padded) all count.
    return not isinstance(obj, type) and is_non_tensor(obj)


def _children(obj: Any) -> list[tuple[str, Any]]:
    """(name, value) pairs of a TensorDict (its keys) or of a tensorclass (its dataclass fields)."""
    out = []
    if is_tensorclass(obj):
        # A tensorclass keeps tensor and non-tensor fields in ``_tensordict`` (so a string field is read back as
        # the NonTensorData/NonTensorStack with its batch size) and plain Python fields in ``_non_tensordict``.
        inner = getattr(obj, "_tensordict", None)
        plain = getattr(obj, "_non_tensordict", None) or {}
        for name in sorted(f.name for f in dataclasses.fields(obj)):
            if name in plain:
                out.append((name, plain[name]))
            elif inner is not None and name in inner.keys():
                out.append((name, _get(inner, name)))
            else:
                try:
                    out.append((name, getattr(obj, name)))
                except Exception as err:
                    out.append((name, _Error(f"{type(err).__name__}: {err}")))
        return out
    for name in sorted(k for k in obj.keys() if isinstance(k, str)):
        out.append((name, _get(obj, name)))
    return out


def _get(td: Any, name: str) -> Any:
    try:
        return td.get(name)
    except Exception:  # ragged lazy stacks cannot be stacked; take the list instead
        try:
            return td.get(name, as_list=True)
        except Exception as err:
            return _Error(f"{type(err).__name__}: {err}")


class _Error:
    def __init__(self, message: str) -> None:
        self.message = message


def _leaf(value: Any, in_collection: bool) -> dict:
    if value is None:
        return {"kind": "none"}
    if isinstance(value, _Error):
        return {"kind": "error", "message": value.message}
    if isinstance(value, torch.Tensor):
        numel = sum(c.numel() for c in value.unbind(0)) if value.is_nested else value.numel()
        return tensor_summary(value, with_values=(not in_collection) or numel < MAX_LEAF_VALUES)
    if _is_non_tensor(value):
        return _non_tensor_summary(value)
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, torch.Tensor) for v in value):
            return {"kind": "tensor_list", "items": [_leaf(v, in_collection) for v in value]}
        return {"kind": "list", "value": to_jsonable(list(value))}
    simple = summarize(value)
    if simple is not None:
        return simple
    return {"kind": "other", "type": type(value).__name__, "repr": repr(value)[:200]}


def _walk(obj: Any, prefix: tuple[str, ...], leaves: dict, classes: dict, depth: int = 0) -> None:
    for name, value in _children(obj):
        path = prefix + (name,)
        if is_tensor_collection(value) and not _is_non_tensor(value) and depth < 16:
            classes["/".join(path)] = type(value).__name__
            before = len(leaves)
            _walk(value, path, leaves, classes, depth + 1)
            if len(leaves) == before:  # an empty collection is still a key
                leaves["/".join(path)] = {"kind": "empty", "class": type(value).__name__}
        else:
            leaves["/".join(path)] = _leaf(value, in_collection=True)


def collection_summary(obj: Any) -> dict:
    """Summary of a TensorDict (any TensorDictBase, lazy stacks included) or of a tensorclass instance."""
    leaves: dict[str, Any] = {}
    classes: dict[str, str] = {}
    _walk(obj, (), leaves, classes)
    return {
        "kind": "tensorclass" if is_tensorclass(obj) else "tensordict",
        "class": type(obj).__name__,
        "batch_size": list(obj.batch_size),
        "keys": [k.split("/") for k in sorted(leaves)],
        "leaves": dict(sorted(leaves.items())),
        "classes": dict(sorted(classes.items())),
    }


def summarize(value: Any) -> dict | None:
    """Summary of one value, or ``None`` when its type is not one the goldens record."""
    if isinstance(value, type):  # classes (TensorDict, History, ...) imported by an example
        return None
    if isinstance(value, torch.Size):
        return {"kind": "size", "value": list(value)}
    if isinstance(value, bool):
        return {"kind": "bool", "value": value}
    if isinstance(value, int):
        return {"kind": "int", "value": value}
    if isinstance(value, float):
        return {"kind": "float", "value": _float(value)}
    if isinstance(value, str):
        return {"kind": "str", "value": value}
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return {"kind": "list[str]", "value": list(value)}
    if isinstance(value, torch.Tensor):
        return tensor_summary(value)
    if _is_non_tensor(value):
        return _non_tensor_summary(value)
    if is_tensor_collection(value):
        return collection_summary(value)
    return None


def summarize_globals(namespace: dict, exclude: set[str] | frozenset[str] = frozenset()) -> tuple[dict, dict]:
    """Summaries of the recordable globals of ``namespace`` and the type names of the others.

    Names starting with ``_`` and names in ``exclude`` (what the harness injected) are left out.
    """
    recorded: dict[str, Any] = {}
    others: dict[str, str] = {}
    for name in sorted(namespace):
        if name.startswith("_") or name in exclude:
            continue
        value = namespace[name]
        try:
            summary = summarize(value)
        except Exception as err:  # record the failure instead of losing the golden
            summary = {"kind": "error", "message": f"{type(err).__name__}: {err}"}
        if summary is None:
            others[name] = f"{type(value).__module__}.{type(value).__qualname__}"
        else:
            recorded[name] = summary
    return recorded, others


def dumps(obj: Any) -> str:
    """The JSON text the goldens are written with (sorted keys, strict JSON)."""
    return json.dumps(obj, indent=1, sort_keys=True, allow_nan=False) + "\n"
