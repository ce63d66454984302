"""TensorDict transforms with TorchRL's ``Transform`` / ``Compose`` interface (no TorchRL dependency).

A transform reads ``in_keys`` and writes ``out_keys`` of a :class:`tensordict.TensorDictBase`. An environment
calls it through three hooks, as TorchRL's ``TransformedEnv`` does:

* ``_reset(tensordict, tensordict_reset)``: after the env reset; returns the (possibly changed) reset data;
* ``_step(tensordict, next_tensordict)``: after an env step, with the data at time ``t`` (the action) and the
  ``"next"`` data at ``t + 1``; returns the next data. The default calls :meth:`Transform._call`;
* ``_inv_call(tensordict)``: on the action before the env step (identity unless ``in_keys_inv`` are set).

Outside an env a transform is a module: ``transform(td)`` is :meth:`Transform.forward`, which by default applies
:meth:`Transform._apply_transform` to every ``in_key`` -> ``out_key`` pair (a transform that needs the step
data overrides ``forward`` to call ``_step`` on ``td["next"]``, as the KL transforms do).

Containment follows TorchRL: :meth:`Transform.set_container` stores a weak reference to the env or
:class:`Compose` that holds the transform; :attr:`Transform.container` walks up the ``Compose`` chain to the env;
:attr:`Transform.parent` is that env (TorchRL rebuilds a ``TransformedEnv`` holding only the transforms before
this one; llmrl returns the containing env itself) and :attr:`Transform.collector` the collector the env was
registered with. The ``transform_*_spec`` hooks return their argument unless overridden; an env passes its
specs (:mod:`llmrl_core.data.tensor_specs`) through them, as a TorchRL ``TransformedEnv`` does
(:mod:`llmrl_core.envs.transforms.spec_hooks`).

llmrl's additions, for transforms inside a :class:`~llmrl_core.envs.chat_env.ChatEnv` (TorchRL's code never calls
them; :mod:`llmrl_core.envs.transforms.env_rows`): :meth:`Transform._slot_of` (the env slot a row is: the list calls
hand transforms the active slots only), :meth:`Transform._reset_rows` (TorchRL's ``"_reset"`` rows),
:meth:`Transform._rewrite_reset_prompts`, :meth:`Transform._note_row` (what the env keeps per slot beyond the
TensorDict: reward parts, ``info`` entries, tool calls) and ``env_checkpoint`` (the transform's ``state_dict()`` is
part of the env's).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from copy import copy
from textwrap import indent
from typing import Any

from tensordict import TensorDictBase, unravel_key
from tensordict.utils import NestedKey
from torch import nn

from llmrl_core.envs.transforms.env_rows import EnvRows
from llmrl_core.envs.transforms.spec_hooks import ComposeSpecHooks, SpecHooks

__all__ = ["Compose", "Transform", "set_missing_tolerance"]


def _as_key_list(value: NestedKey | Sequence[NestedKey] | None) -> list[NestedKey] | None:
    if value is None:
        return None
    if isinstance(value, (str, tuple)):
        value = [value]
    return [unravel_key(key) for key in value]


@contextmanager
def set_missing_tolerance(transform: Transform, mode: bool):
    """Temporarily set ``transform``'s missing-key tolerance (restored on exit)."""
    previous = transform.missing_tolerance
    transform.set_missing_tolerance(mode)
    try:
        yield transform
    finally:
        transform.set_missing_tolerance(previous)


def forward_as_step(transform: Any, tensordict: TensorDictBase) -> TensorDictBase:
    """A step transform called directly (``transform(td)``), as TorchRL's KL transforms are: its ``_step`` reads the
    action data from ``td`` and writes into ``td["next"]`` when there is one, else into ``td`` itself."""
    next_td = tensordict.get("next", None)
    if next_td is None:
        return transform._step(tensordict, tensordict)
    return tensordict.set("next", transform._step(tensordict, next_td))


class Transform(EnvRows, SpecHooks, nn.Module):
    """Base class of TensorDict env transforms (TorchRL's ``torchrl.envs.Transform`` interface).

    Args:
        in_keys: keys read by the transform.
        out_keys: keys written by the transform.
        in_keys_inv: keys written by the inverse transform (on the action, before the env step).
        out_keys_inv: keys read by the inverse transform.

    Subclasses override :meth:`_apply_transform` (one value at a time), :meth:`_call` (the ``"next"`` data),
    :meth:`_step` (needs the data at ``t`` too), :meth:`_reset`, or :meth:`forward` (direct calls).
    """

    invertible = False

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        in_keys_inv: Sequence[NestedKey] | None = None,
        out_keys_inv: Sequence[NestedKey] | None = None,
    ) -> None:
        super().__init__()
        if in_keys is not None:
            self.in_keys = in_keys
        if out_keys is not None:
            self.out_keys = out_keys
        if in_keys_inv is not None:
            self.in_keys_inv = in_keys_inv
        if out_keys_inv is not None:
            self.out_keys_inv = out_keys_inv
        self._missing_tolerance = False
        # kept out of nn.Module's registries: a container is not a sub-module of what it holds
        self.__dict__["_container"] = None

    # --- keys ------------------------------------------------------------------------------------
    @property
    def in_keys(self) -> list[NestedKey]:
        return self.__dict__.get("_in_keys") or []

    @in_keys.setter
    def in_keys(self, value: Sequence[NestedKey] | None) -> None:
        self.__dict__["_in_keys"] = _as_key_list(value)

    @property
    def out_keys(self) -> list[NestedKey]:
        return self.__dict__.get("_out_keys") or []

    @out_keys.setter
    def out_keys(self, value: Sequence[NestedKey] | None) -> None:
        self.__dict__["_out_keys"] = _as_key_list(value)

    @property
    def in_keys_inv(self) -> list[NestedKey]:
        return self.__dict__.get("_in_keys_inv") or []

    @in_keys_inv.setter
    def in_keys_inv(self, value: Sequence[NestedKey] | None) -> None:
        self.__dict__["_in_keys_inv"] = _as_key_list(value)

    @property
    def out_keys_inv(self) -> list[NestedKey]:
        return self.__dict__.get("_out_keys_inv") or []

    @out_keys_inv.setter
    def out_keys_inv(self, value: Sequence[NestedKey] | None) -> None:
        self.__dict__["_out_keys_inv"] = _as_key_list(value)

    # --- missing keys ----------------------------------------------------------------------------
    def set_missing_tolerance(self, mode: bool = False) -> None:
        """When True, a missing ``in_key`` is skipped instead of raising ``KeyError``."""
        self._missing_tolerance = bool(mode)

    @property
    def missing_tolerance(self) -> bool:
        return self._missing_tolerance

    # --- the hooks -------------------------------------------------------------------------------
    def _apply_transform(self, value: Any) -> Any:
        """Transform one value read from an ``in_key`` (to be written under the matching ``out_key``)."""
        raise NotImplementedError(
            f"{type(self).__name__}._apply_transform is not implemented: override it, or _call / _step / forward"
        )

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        """Transform the data an env step or reset produced (``in_keys`` -> ``out_keys``)."""
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            value = next_tensordict.get(in_key, None)
            if value is not None:
                next_tensordict.set(out_key, self._apply_transform(value))
            elif not self.missing_tolerance:
                raise KeyError(f"{self}: {in_key!r} not found in tensordict {next_tensordict}")
        return next_tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Apply the transform to ``tensordict`` directly (not through an env)."""
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            value = tensordict.get(in_key, None)
            if value is not None:
                tensordict.set(out_key, self._apply_transform(value))
            elif not self.missing_tolerance:
                raise KeyError(f"{in_key!r} not found in tensordict {tensordict}")
        return tensordict

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        """Env step hook: ``tensordict`` is the data at ``t``, ``next_tensordict`` at ``t + 1`` (returned)."""
        return self._call(next_tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        """Env reset hook (stateless transforms return ``tensordict_reset`` unchanged)."""
        return tensordict_reset

    def _inv_apply_transform(self, value: Any) -> Any:
        if self.invertible:
            raise NotImplementedError
        return value

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Transform the action before the env step (``out_keys_inv`` -> ``in_keys_inv``)."""
        for in_key, out_key in zip(self.in_keys_inv, self.out_keys_inv, strict=True):
            value = tensordict.get(out_key, None)
            if value is not None:
                tensordict.set(in_key, self._inv_apply_transform(value))
            elif not self.missing_tolerance:
                raise KeyError(f"{out_key!r} not found in tensordict {tensordict}")
        return tensordict

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The inverse transform on a shallow copy of ``tensordict``."""
        return self._inv_call(tensordict.clone(False))

    def init(self, tensordict: TensorDictBase) -> None:
        """One-time initialisation hook (no-op)."""

    def close(self) -> None:
        """Release resources (no-op)."""

    # --- containment -----------------------------------------------------------------------------
    def set_container(self, container: Any) -> None:
        """Record the env or :class:`Compose` holding this transform (a transform has one container)."""
        current = self._container_ref()
        if current is not None and container is not None and current is not container:
            raise AttributeError(
                f"parent of transform {type(self)} already set. "
                "Call `transform.clone()` to get a similar transform with no parent set."
            )
        self.__dict__["_container"] = weakref.ref(container) if container is not None else None

    def reset_parent(self) -> None:
        """Forget the container."""
        self.__dict__["_container"] = None

    def _container_ref(self) -> Any:
        ref = self.__dict__.get("_container")
        return ref() if ref is not None else None

    @property
    def container(self) -> Any:
        """The env holding this transform (through any enclosing :class:`Compose`), or None."""
        container = self._container_ref()
        while isinstance(container, Compose):
            container = container._container_ref()
        return container

    @property
    def parent(self) -> Any:
        """The env this transform is attached to, or None (see the module docstring)."""
        return self.container

    @property
    def collector(self) -> Any:
        """The collector the containing env was registered with, or None."""
        container = self.container
        return getattr(container, "collector", None) if container is not None else None

    def empty_cache(self) -> None:
        """Drop cached state derived from the container (no-op: nothing is cached)."""

    def clone(self) -> Transform:
        """A shallow copy with no container."""
        twin = copy(self)
        twin.__dict__ = copy(self.__dict__)
        for name in ("_parameters", "_buffers", "_modules"):
            twin.__dict__[name] = copy(self.__dict__[name])
        twin.__dict__["_container"] = None
        return twin

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_container"] = self._container_ref()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        container = state.get("_container")
        state["_container"] = weakref.ref(container) if container is not None else None
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(keys={self.in_keys})"


class _CallableTransform(Transform):
    """A plain callable ``td -> td`` used as a transform inside :class:`Compose`."""

    def __init__(self, func: Callable[[TensorDictBase], TensorDictBase]) -> None:
        super().__init__()
        self.func = func

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self.func(tensordict)

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self.func(next_tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self.func(tensordict_reset)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.func!r})"


def _as_transform(item: Any) -> Transform:
    if isinstance(item, Transform):
        return item
    if callable(item):
        return _CallableTransform(item)
    raise ValueError(f"Transform list must contain only transforms or callable. Got a element of type {type(item)}.")


class Compose(ComposeSpecHooks, Transform):
    """A chain of transforms run in order (the inverse runs in reverse order).

    ``Compose(t1, t2)``, ``Compose([t1, t2])`` and ``Compose(transforms=[t1, t2])`` are equivalent; plain
    callables ``td -> td`` are accepted.
    """

    def __init__(self, *transforms: Any, **kwargs: Any) -> None:
        if not transforms and "transforms" in kwargs:
            items = kwargs.pop("transforms")
        elif len(transforms) == 1 and isinstance(transforms[0], list):
            items = transforms[0]
        else:
            items = transforms
        if kwargs:
            raise ValueError(f"Unexpected keyword arguments: {kwargs}")
        super().__init__()
        self.transforms = nn.ModuleList([_as_transform(t) for t in items])
        for transform in self.transforms:
            transform.set_container(self)

    # --- chaining --------------------------------------------------------------------------------
    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        for transform in self.transforms:
            next_tensordict = transform._call(next_tensordict)
        return next_tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        for transform in self.transforms:
            tensordict = transform(tensordict)
        return tensordict

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for transform in self.transforms:
            next_tensordict = transform._step(tensordict, next_tensordict)
        return next_tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        for transform in self.transforms:
            tensordict_reset = transform._reset(tensordict, tensordict_reset)
        return tensordict_reset

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        for transform in reversed(self.transforms):
            tensordict = transform._inv_call(tensordict)
        return tensordict

    def init(self, tensordict: TensorDictBase) -> None:
        for transform in self.transforms:
            transform.init(tensordict)

    def close(self) -> None:
        for transform in self.transforms:
            transform.close()

    def set_missing_tolerance(self, mode: bool = False) -> None:
        for transform in self.transforms:
            transform.set_missing_tolerance(mode)
        super().set_missing_tolerance(mode)

    # --- list interface --------------------------------------------------------------------------
    def append(self, transform: Any) -> None:
        """Append a transform (or callable); appending a plain ``Compose`` appends its transforms."""
        transform = _as_transform(transform)
        transform.eval()
        if type(self) is type(transform) is Compose:
            for inner in list(transform.transforms):
                inner.reset_parent()
                self.append(inner)
            return
        self.transforms.append(transform)
        transform.set_container(self)

    def insert(self, index: int, transform: Any) -> None:
        """Insert a transform (or callable) at ``index``."""
        transform = _as_transform(transform)
        if abs(index) > len(self.transforms):
            raise ValueError(
                f"Index expected to be between [-{len(self.transforms)}, {len(self.transforms)}] got index={index}"
            )
        if index < 0:
            index += len(self.transforms)
        transform.eval()
        self.transforms.insert(index, transform)
        transform.set_container(self)

    def pop(self, index: int | None = None) -> Transform:
        """Remove and return the transform at ``index`` (the last one by default)."""
        if index is None:
            index = len(self.transforms) - 1
        transform = self.transforms[index]
        del self.transforms[index]
        transform.reset_parent()
        return transform

    def __getitem__(self, item: int | slice) -> Transform:
        selected = self.transforms[item]
        if isinstance(selected, Transform):
            return selected
        return Compose(*(t.clone() for t in selected))

    def __setitem__(self, index: int, value: Any) -> None:
        value = _as_transform(value)
        self.transforms[index] = value
        value.set_container(self)

    def __delitem__(self, index: int | slice) -> None:
        del self.transforms[index]

    def __iter__(self) -> Iterator[Transform]:
        yield from self.transforms

    def __len__(self) -> int:
        return len(self.transforms)

    def set_container(self, container: Any) -> None:
        super().set_container(container)
        for transform in self.transforms:
            transform.__dict__["_container"] = weakref.ref(self)

    def empty_cache(self) -> None:
        for transform in self.transforms:
            transform.empty_cache()

    def clone(self) -> Compose:
        return Compose(*(t.clone() for t in self.transforms))

    def to(self, *args: Any, **kwargs: Any) -> Compose:
        for transform in self.transforms:
            transform.to(*args, **kwargs)
        return super().to(*args, **kwargs)

    def __repr__(self) -> str:
        if not len(self.transforms):
            return f"{type(self).__name__}()"
        body = ",\n".join(indent(str(t), 4 * " ") for t in self.transforms)
        return f"{type(self).__name__}(\n{body})"


def in_chat_env(transform: Transform) -> bool:
    """True when ``transform`` (or the ``Compose`` holding it, e.g. ``RetrieveKL``) is appended to a ChatEnv."""
    container = transform.container
    while isinstance(container, Transform):
        container = container.container
    return container is not None and hasattr(container, "td_transforms")
