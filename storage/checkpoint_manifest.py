"""What a policy checkpoint records: its manifest (the commit marker: sha256, dtypes, parent version, config
hash, tied-tensor aliases), what a load returns, what a written-but-unsealed version holds, and the tied-tensor
dedupe applied before writing. :mod:`storage.checkpoints` stores and loads them."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

MANIFEST_FORMAT = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt (sha256 mismatch) or inconsistent."""


@dataclasses.dataclass(frozen=True)
class CheckpointManifest:
    """What a checkpoint is: version, parent, content hash, dtypes, config hash and where it lives."""

    policy_version: int
    parent_version: int | None
    weights_file: str
    sha256: str
    size_bytes: int
    dtype: str  # the single dtype of all tensors, or "mixed" (see dtypes)
    dtypes: dict[str, int]
    num_tensors: int
    num_parameters: int
    aliases: dict[str, str]
    config_hash: str | None
    model_id: str | None
    created_at: str
    metadata: dict[str, Any]
    format: int = MANIFEST_FORMAT

    def to_json(self) -> str:
        """The manifest as indented JSON text."""
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str) -> CheckpointManifest:
        """Parse a manifest, naming ``source`` and the field when it is malformed."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{source}: not valid JSON: {err}") from err
        names = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(n for n in names - set(data) if n != "format")
        if missing:
            raise CheckpointError(f"{source}: missing field '{missing[0]}'")
        if data.get("format", MANIFEST_FORMAT) > MANIFEST_FORMAT:
            raise CheckpointError(f"{source}: manifest format {data['format']} is newer than {MANIFEST_FORMAT}")
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclasses.dataclass
class LoadedCheckpoint:
    """A loaded state dict (ties restored) with its manifest and the weights file (a path, or its URI when the
    store is not on the local disk)."""

    state_dict: dict[str, torch.Tensor]
    manifest: CheckpointManifest
    path: Path | str


@dataclasses.dataclass(frozen=True)
class WrittenWeights:
    """A version's weights file as :meth:`CheckpointStore.write_weights` left it: at its final name, not yet
    committed (no manifest), with what :meth:`CheckpointStore.seal` writes into the manifest. ``sha256`` and
    ``size_bytes`` are known already when the store hashed the file on its way up (a remote store)."""

    policy_version: int
    weights_file: str
    dtypes: dict[str, int]
    num_tensors: int
    num_parameters: int
    aliases: dict[str, str]
    sha256: str | None = None
    size_bytes: int | None = None


def dedupe_shared(state_dict: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop exact duplicates of shared tensors (recorded as aliases); copy partial overlaps; make contiguous."""
    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    storages: set[int] = set()
    for name in sorted(state_dict):
        tensor = state_dict[name]
        if not isinstance(tensor, torch.Tensor):
            raise CheckpointError(f"state_dict['{name}'] is a {type(tensor).__name__}, not a tensor")
        tensor = tensor.detach()
        ptr = tensor.untyped_storage().data_ptr()
        view = (ptr, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        if view in seen:
            aliases[name] = seen[view]
            continue
        if ptr in storages:
            tensor = tensor.clone()
        storages.add(ptr)
        seen[view] = name
        stored[name] = tensor.contiguous().cpu()
    return stored, aliases
