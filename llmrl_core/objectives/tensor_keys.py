"""TorchRL's configurable tensordict keys for the LLM losses: ``loss.tensor_keys`` and ``loss.set_keys(...)``.

A loss class names the keys it reads in a dataclass ``_AcceptedKeys`` (TorchRL's names and defaults); each
instance holds its own copy, so ``loss.set_keys(advantage="my_advantage")`` changes where that loss reads, and
``set_keys(advantage=None)`` restores the default. An unknown name is refused with the accepted ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class TensorKeysMixin:
    """Gives a loss TorchRL's ``tensor_keys`` / ``set_keys`` / ``default_keys`` over its ``_AcceptedKeys``."""

    _AcceptedKeys: type

    @property
    def default_keys(self) -> type:
        """The dataclass of accepted keys and their defaults (TorchRL's ``default_keys``)."""
        return self._AcceptedKeys

    @property
    def tensor_keys(self) -> Any:
        """Where this loss reads each of its inputs (set with :meth:`set_keys`)."""
        keys = self.__dict__.get("_tensor_keys")
        if keys is None:
            keys = self.__dict__["_tensor_keys"] = self._AcceptedKeys()
        return keys

    def set_keys(self, **kwargs: Any) -> None:
        """Read the named inputs from other keys (``None``: back to the default)."""
        accepted = {f.name for f in dataclasses.fields(self._AcceptedKeys)}
        for name, value in kwargs.items():
            if name not in accepted:
                raise ValueError(f"{name} is not an accepted tensordict key. Accepted keys are: {sorted(accepted)}.")
            setattr(self.tensor_keys, name, getattr(self._AcceptedKeys(), name) if value is None else value)


__all__ = ["TensorKeysMixin"]
