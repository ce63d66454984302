"""``PolicyVersion``: stamps the current policy version on every reset and step output.

The version is an int (0, 1, 2, ...) or a uuid4 string; :meth:`PolicyVersion.increment_version` is called
on each weight update (the trainer/weight-sync side calls it), so every trajectory records which weights
produced it. The version is written to ``output.policy_version`` and ``slot.info["policy_version"]``.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from llmrl_core.envs.transforms.base import SlotTransform
from llmrl_core.envs.types import EnvOutput


class PolicyVersion(SlotTransform):
    """Keeps a policy version (int or uuid) and stamps it on every env output."""

    writes_reward = False

    def __init__(self, version_type: type | Literal["int", "uuid"] = int, initial: int | str | None = None) -> None:
        super().__init__()
        if version_type in (int, "int"):
            self.version_type = "int"
        elif version_type in (str, "uuid"):
            self.version_type = "uuid"
        else:
            raise ValueError(f"version_type must be int/'int' or str/'uuid', got {version_type!r}")
        if initial is None:
            initial = 0 if self.version_type == "int" else str(uuid.uuid4())
        self.version = initial

    @property
    def version(self) -> int | str:
        """The current version."""
        return self._version

    @version.setter
    def version(self, value: int | str) -> None:
        if self.version_type == "int" and not isinstance(value, int):
            raise TypeError(f"int policy version expected, got {value!r}")
        if self.version_type == "uuid" and not isinstance(value, str):
            raise TypeError(f"uuid policy version must be a string, got {value!r}")
        self._version = value

    def increment_version(self) -> int | str:
        """Advance to the next version (int + 1, or a fresh uuid4) and return it."""
        self.version = self._version + 1 if self.version_type == "int" else str(uuid.uuid4())  # type: ignore[operator]
        return self.version

    def on_output(self, output: EnvOutput) -> None:
        """Stamp the version on the output and on each slot's info."""
        output.policy_version = self.version
        for info in output.info:
            info["policy_version"] = self.version

    def state_dict(self) -> dict[str, Any]:
        """The version, for checkpoints."""
        return {"version_type": self.version_type, "version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the version from :meth:`state_dict`."""
        if state.get("version_type") != self.version_type:
            raise ValueError(f"state has version_type {state.get('version_type')!r}, expected {self.version_type!r}")
        self.version = state["version"]

    def __repr__(self) -> str:
        return f"PolicyVersion(version_type={self.version_type!r}, version={self.version!r})"
