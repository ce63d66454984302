"""Tensor specs with TorchRL's names (``torchrl.data.tensor_specs``): what an env reads and writes, key by key.

A spec says a field's shape (``-1`` for a ragged dimension), dtype and device; :class:`Composite` nests them by
key, as the env's TensorDicts nest their fields, and may name the tensorclass its data forms (``data_cls``:
``History``, ``ChatHistory``, ``Text``, ``Tokens``). ``spec.zero()`` builds a zero-filled example (ragged
dimensions become 1, as TorchRL builds them); ``Composite.keys(include_nested, leaves_only)`` lists the keys as
TorchRL's does. The envs use them for ``observation_spec``, ``action_spec``, ``state_spec``, ``reward_spec`` and
``done_spec`` and the ``*_keys`` lists derived from them. Only what those need is modelled: no sampling
(``rand``), bounds or projection.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from tensordict import NonTensorData, TensorDict, TensorDictBase, unravel_key
from tensordict.utils import NestedKey

__all__ = [
    "Categorical",
    "Composite",
    "NonTensor",
    "TensorSpec",
    "Unbounded",
    "UnboundedContinuous",
    "UnboundedDiscrete",
]


def _size(shape: int | tuple[int, ...] | torch.Size | None) -> torch.Size:
    if shape is None:
        return torch.Size([])
    return torch.Size([shape]) if isinstance(shape, int) else torch.Size(shape)


def _concrete(shape: torch.Size) -> torch.Size:
    """A spec's shape with each ragged dimension (-1) as 1: the shape of its zero example."""
    return torch.Size([1 if d == -1 else d for d in shape])


class TensorSpec:
    """Base of the leaf specs: a shape, a dtype and a device."""

    def __init__(
        self,
        shape: int | tuple[int, ...] | torch.Size | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.shape = _size(shape)
        self.device = None if device is None else torch.device(device)
        self.dtype = dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def zero(self, shape: torch.Size | None = None) -> Any:
        """A zero-filled example of this spec (``shape`` is prepended)."""
        full = _size(shape) + _concrete(self.shape)
        return torch.zeros(full, dtype=self.dtype, device=self.device or "cpu")

    def to(self, device: torch.device | str | None) -> TensorSpec:
        """A copy on ``device``."""
        clone = self.clone()
        clone.device = None if device is None else torch.device(device)
        return clone

    def clone(self) -> TensorSpec:
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def _fields(self) -> dict[str, Any]:
        return {"shape": self.shape, "device": self.device, "dtype": self.dtype}

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._fields() == other._fields()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value}" for name, value in self._fields().items())
        return f"{type(self).__name__}({fields})"


class Unbounded(TensorSpec):
    """Any value of a dtype (TorchRL's ``Unbounded``; float32 by default). As in TorchRL, ``Unbounded(...)`` builds
    an :class:`UnboundedContinuous` for a floating dtype and an :class:`UnboundedDiscrete` otherwise."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Unbounded:
        if cls is Unbounded:
            dtype = kwargs.get("dtype", args[2] if len(args) > 2 else torch.float32) or torch.float32
            cls = UnboundedContinuous if dtype.is_floating_point else UnboundedDiscrete
        return super().__new__(cls)

    def __init__(
        self,
        shape: int | tuple[int, ...] | torch.Size | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = torch.float32,
    ) -> None:
        super().__init__(shape, device, dtype or torch.float32)


class UnboundedContinuous(Unbounded):
    """An :class:`Unbounded` spec of a floating dtype."""


class UnboundedDiscrete(Unbounded):
    """An :class:`Unbounded` spec of an integer or bool dtype."""


class Categorical(TensorSpec):
    """One of ``n`` values (TorchRL's ``Categorical``); the done flags are ``Categorical(2, dtype=torch.bool)``."""

    def __init__(
        self,
        n: int,
        shape: int | tuple[int, ...] | torch.Size | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = torch.long,
    ) -> None:
        super().__init__(shape, device, dtype or torch.long)
        self.n = n

    def _fields(self) -> dict[str, Any]:
        return {"n": self.n, **super()._fields()}


class NonTensor(TensorSpec):
    """A field that is not a tensor (strings, lists; TorchRL's ``NonTensor``): its zero is ``example_data``."""

    def __init__(
        self,
        shape: int | tuple[int, ...] | torch.Size | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        example_data: Any = None,
    ) -> None:
        super().__init__(shape, device, dtype)
        self.example_data = example_data

    def zero(self, shape: torch.Size | None = None) -> NonTensorData:
        return NonTensorData(data=self.example_data, batch_size=_size(shape) + _concrete(self.shape))

    def _fields(self) -> dict[str, Any]:
        return {**super()._fields(), "example_data": self.example_data}


class Composite:
    """Specs by key, nested as the data is (TorchRL's ``Composite``).

    Args:
        specs: a mapping of key to spec (a nested mapping becomes a nested ``Composite``), or keyword specs.
        shape: the leading (batch) shape of every entry.
        device: the device of the data.
        data_cls: the tensorclass the entries form (``History``, ``ChatHistory``, ...), or None for a TensorDict.
    """

    def __init__(
        self,
        specs: Mapping[str, Any] | None = None,
        *,
        shape: int | tuple[int, ...] | torch.Size | None = None,
        device: torch.device | str | None = None,
        data_cls: type | None = None,
        **kwargs: Any,
    ) -> None:
        self.shape = _size(shape)
        self.device = None if device is None else torch.device(device)
        self.data_cls = data_cls
        self._specs: dict[str, TensorSpec | Composite] = {}
        for key, spec in {**(specs or {}), **kwargs}.items():
            self[key] = spec

    # --- mapping ---------------------------------------------------------------------------------
    def __getitem__(self, key: NestedKey) -> TensorSpec | Composite:
        key = unravel_key(key)
        if isinstance(key, tuple):
            spec: Any = self
            for part in key:
                if not isinstance(spec, Composite):
                    raise KeyError(key)
                spec = spec._specs[part]
            return spec
        return self._specs[key]

    def __setitem__(self, key: NestedKey, spec: TensorSpec | Composite | Mapping[str, Any]) -> None:
        key = unravel_key(key)
        if isinstance(spec, Mapping):
            spec = Composite(spec, shape=self.shape, device=self.device)
        elif isinstance(spec, Composite) and len(spec.shape) < len(self.shape):
            spec = spec._widened(self.shape)
        if isinstance(key, tuple):
            head, *rest = key
            if head not in self._specs:
                self._specs[head] = Composite(shape=self.shape, device=self.device)
            self._specs[head][tuple(rest) if len(rest) > 1 else rest[0]] = spec  # type: ignore[index]
            return
        self._specs[key] = spec

    def __contains__(self, key: NestedKey) -> bool:
        try:
            self[key]
        except KeyError:
            return False
        return True

    def __len__(self) -> int:
        return len(self._specs)

    def is_empty(self) -> bool:
        """Whether the composite holds no leaf."""
        return not any(True for _ in self.keys(True, True))

    def keys(self, include_nested: bool = False, leaves_only: bool = False) -> Iterator[NestedKey]:
        """The keys, in insertion order; a composite's nested keys (tuples) before its own key (TorchRL's order)."""
        for key, spec in self._specs.items():
            nested = isinstance(spec, Composite)
            if include_nested and nested:
                for sub in spec.keys(True, leaves_only):  # type: ignore[union-attr]
                    yield (key, *sub) if isinstance(sub, tuple) else (key, sub)
            if not (leaves_only and nested):
                yield key

    def values(self, include_nested: bool = False, leaves_only: bool = False) -> Iterator[TensorSpec | Composite]:
        for key in self.keys(include_nested, leaves_only):
            yield self[key]

    def items(
        self, include_nested: bool = False, leaves_only: bool = False
    ) -> Iterator[tuple[NestedKey, TensorSpec | Composite]]:
        for key in self.keys(include_nested, leaves_only):
            yield key, self[key]

    def _widened(self, shape: torch.Size) -> Composite:
        """A copy with the batch shape ``shape`` (nested composites too): a composite nested in a wider one takes
        its batch shape, as TorchRL's does (``ChatHistory.default_spec(shape=(B,))`` inside an env's ``(B,)``)."""
        clone = self.clone()
        clone.shape = torch.Size(shape)
        clone._specs = {
            key: spec._widened(shape) if isinstance(spec, Composite) and len(spec.shape) < len(shape) else spec
            for key, spec in clone._specs.items()
        }
        return clone

    # --- examples and copies ---------------------------------------------------------------------
    def zero(self, shape: torch.Size | None = None) -> TensorDictBase | Any:
        """A zero example: a TensorDict of every entry's zero (or the ``data_cls`` built from it)."""
        batch = _size(shape) + _concrete(self.shape)
        data = TensorDict({key: spec.zero(shape) for key, spec in self._specs.items()}, batch_size=batch)
        return self.data_cls.from_tensordict(data) if self.data_cls is not None else data

    def to(self, device: torch.device | str | None) -> Composite:
        """A copy on ``device``."""
        clone = self.clone()
        clone.device = None if device is None else torch.device(device)
        clone._specs = {key: spec.to(device) for key, spec in self._specs.items()}
        return clone

    def clone(self) -> Composite:
        return Composite(
            {key: spec.clone() for key, spec in self._specs.items()},
            shape=self.shape,
            device=self.device,
            data_cls=self.data_cls,
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Composite)
            and (self.shape, self.device, self.data_cls) == (other.shape, other.device, other.data_cls)
            and self._specs == other._specs
        )

    def __repr__(self) -> str:
        inner = "".join("\n    " + f"{key}: {spec!r}".replace("\n", "\n    ") for key, spec in self._specs.items())
        cls = None if self.data_cls is None else self.data_cls.__name__
        return f"Composite({inner}\n    device={self.device}, shape={self.shape}, data_cls={cls})"
