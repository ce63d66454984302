"""``PolicyVersion``: TorchRL's transform that stamps the current policy version on every reset and step.

The version is an int (0, 1, 2, ...) or a uuid4 string; :meth:`PolicyVersion.increment_version` is called on each
weight update (the collector's ``update_policy_weights_`` or a weight updater calls it), so every step records
which weights produced it. As in TorchRL, the transform writes ``"policy_version"`` into the reset data and into
each step's ``"next"`` data: an int64 tensor of the data's batch shape, or the uuid as non-tensor data per row; the
observation spec gains that entry. On the list calls (``reset(prompts)``/``step(answers)``) the step's value is
kept per slot with the other entries TensorDict transforms add (``slot.next_fields``).

llmrl's extras: ``initial`` (start at a given version, e.g. a resumed run's), ``state_dict``/``load_state_dict`` of
the version, :meth:`increment_version` returns the new version, and setting ``version`` checks its type (an int for
``"int"``, a string for ``"uuid"``; TorchRL takes any value).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import torch
from tensordict import NonTensorData, TensorDictBase

from llmrl_core.envs.transforms.td_base import Transform

Version = int | str


@dataclass
class VersionChange:
    """One change of a :class:`PolicyVersion`'s version (TorchRL's record): when, from what, to what."""

    timestamp: datetime
    old_version: Version | None
    new_version: Version


def _kind(version_type: Any) -> str:
    if version_type in (int, "int"):
        return "int"
    if version_type in (str, "uuid"):
        return "uuid"
    raise ValueError(f"version_type must be int/'int' or str/'uuid', got {version_type!r}")


class PolicyVersion(Transform):
    """Keeps a policy version (int or uuid) and writes it as ``"policy_version"`` on every reset and step.

    Args:
        version_type: ``int`` / ``"int"`` (0, 1, 2, ...) or ``str`` / ``"uuid"`` (a fresh uuid4 per version).
        initial: the first version (llmrl's; default 0, or a fresh uuid).
    """

    def __init__(self, version_type: type | Literal["uuid", "int"] = int, initial: Version | None = None) -> None:
        super().__init__(out_keys=["policy_version"])
        self.version_type = _kind(version_type)
        self.version_history: list[VersionChange] = []
        self._version: Version | None = None
        self._change_to(initial if initial is not None else 0 if self.version_type == "int" else str(uuid.uuid4()))

    @property
    def version(self) -> Version:
        """The current version."""
        return self._version  # type: ignore[return-value]

    @version.setter
    def version(self, value: Version) -> None:
        self._change_to(value)

    def _change_to(self, value: Version) -> None:
        if self.version_type == "int" and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(f"int policy version expected, got {value!r}")
        if self.version_type == "uuid" and not isinstance(value, str):
            raise TypeError(f"uuid policy version must be a string, got {value!r}")
        self.version_history.append(VersionChange(datetime.now(), self._version, value))
        self._version = value

    def increment_version(self) -> Version:
        """Advance to the next version (int + 1, or a fresh uuid4) and return it."""
        self._change_to(self.version + 1 if self.version_type == "int" else str(uuid.uuid4()))  # type: ignore[operator]
        return self.version

    def _stamp(self, data: TensorDictBase) -> TensorDictBase:
        if self.version_type == "uuid":
            value: Any = NonTensorData(self.version, batch_size=data.batch_size, device=data.device)
        else:
            value = torch.full(data.batch_size, self.version, dtype=torch.int64, device=data.device)
        data.set("policy_version", value)
        return data

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._stamp(tensordict_reset)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._stamp(next_tensordict)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._stamp(tensordict)

    def transform_observation_spec(self, observation_spec: Any) -> Any:
        from llmrl_core.data.tensor_specs import NonTensor, Unbounded

        shape, device = observation_spec.shape, observation_spec.device
        if self.version_type == "uuid":
            observation_spec["policy_version"] = NonTensor(shape=shape, device=device, example_data=uuid.uuid4())
        else:
            observation_spec["policy_version"] = Unbounded(shape=shape, device=device, dtype=torch.int64)
        return observation_spec

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        """The version, for checkpoints."""
        return {"version_type": self.version_type, "version": self.version}

    def load_state_dict(self, state: dict[str, Any], *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Restore the version from :meth:`state_dict`."""
        if state.get("version_type") != self.version_type:
            raise ValueError(f"state has version_type {state.get('version_type')!r}, expected {self.version_type!r}")
        self.version = state["version"]

    def __repr__(self) -> str:
        return f"PolicyVersion(version_type={self.version_type!r}, version={self.version!r})"
