"""State dicts as safetensors bytes or files, written atomically, for cross-process weight transfer."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load, save, save_file


def _contiguous(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses shared storage (tied embeddings): give every tensor its own contiguous copy.
    return {name: t.detach().to("cpu").contiguous().clone() for name, t in state.items()}


def state_dict_to_bytes(state: Mapping[str, torch.Tensor]) -> bytes:
    """Serialise a state dict to safetensors bytes."""
    return save(_contiguous(state))


def state_dict_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """Inverse of :func:`state_dict_to_bytes`."""
    return load(data)


def write_state_dict_atomic(state: Mapping[str, torch.Tensor], path: str | os.PathLike) -> Path:
    """Write a safetensors file via a temp file in the same folder and a rename (no partial file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        save_file(_contiguous(state), str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def state_dict_from(weights: Mapping[str, torch.Tensor] | bytes | str | os.PathLike) -> dict[str, torch.Tensor]:
    """A state dict from any form weights cross a process boundary in: a state dict, safetensors bytes, or the
    path of a safetensors file."""
    if isinstance(weights, bytes):
        return state_dict_from_bytes(weights)
    if isinstance(weights, str | os.PathLike):
        from safetensors.torch import load_file

        return load_file(str(Path(weights)))
    return dict(weights)
