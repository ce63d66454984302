"""Shared memory through which a trainer hands new weights to the rollout engines on its host.

Publishing a version used to write its weights file (538 MB in fp32 for SmolLM2-135M) before the engines could
load it, and each engine then read and cast it: 0.55-0.75 s into the checkpoint folder on a disk, 0.18 s into
``/dev/shm`` plus 0.1 s of reading and casting per engine (measured on an Intel Xeon, 2 cores), all on the
critical path of every iteration. :class:`SharedWeights` keeps one safetensors file in this process's folder under
``/dev/shm``, in the engines' dtype, and rewrites it in place for each version: its pages stay allocated and mapped
in the trainer, so a version costs one cast-and-copy (0.045 s for bf16) and the engines load it as they would any
safetensors file, without a cast. The checkpoint of the version is written into the store when it is sealed,
beside the next rollout (:meth:`runtime.trainer_actor.TrainerWorker.seal`).

Only for engines on the trainer's host (the caller decides), only while no engine reads the file as it is
rewritten (the flow loads a version into every engine before it stages the next), and only where ``/dev/shm`` is a
writable folder with room for twice the file (containers often give it 64 MB): otherwise the trainer writes into
the checkpoint folder as before. Each trainer process has its own folder (``llmrl-handoff-<pid>``); a folder whose
process is gone (a killed run) holds memory until someone removes it: the run's guardian does within seconds
(:mod:`storage.guardian`), and :func:`handoff_dir` sweeps any left first.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import weakref
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

from llmrl_core.weight_sync.updater import cast_floats
from storage.checkpoints import dedupe_shared
from storage.filesystems import temp_name_for
from storage.guardian import PREFIX, SHARED_MEMORY, orphaned_folders, sweep_orphans

__all__ = ["PREFIX", "SHARED_MEMORY", "SharedWeights", "handoff_dir", "orphaned_folders", "sweep_orphans"]

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


def handoff_dir(needed_bytes: int, root: Path | None = None) -> Path | None:
    """This process's handoff folder under ``root`` (default ``/dev/shm``; created), or None when ``root`` is not
    a writable folder with at least ``2 * needed_bytes`` free after orphaned folders are swept (what this process
    already holds there counts as free)."""
    root = SHARED_MEMORY if root is None else root
    if not root.is_dir() or not os.access(root, os.W_OK):
        return None
    sweep_orphans(root)
    folder = root / f"{PREFIX}{os.getpid()}"
    held = sum(f.stat().st_size for f in folder.glob("*")) if folder.is_dir() else 0
    if shutil.disk_usage(root).free + held < 2 * needed_bytes:
        return None
    folder.mkdir(exist_ok=True)
    return folder


def _layout(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in state.items()}


class SharedWeights:
    """The weights the rollout engines on this host load next: one safetensors file in this process's handoff
    folder, in the engines' ``dtype`` (floating-point tensors; others keep theirs), rewritten in place for each
    version (see the module docstring). Tensors that share memory (a tied LM head) are written once; vLLM's
    loader adds the tied head back (:func:`llmrl_core.weight_sync.updater.add_tied_head`)."""

    def __init__(self, dtype: torch.dtype, root: Path | None = None, name: str = "engine-weights.safetensors") -> None:
        self.dtype = dtype
        self.root = root
        self.name = name
        self.path: Path | None = None
        self._views: dict[str, torch.Tensor] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}

    @property
    def shared_root(self) -> Path:
        """The shared-memory folder the handoff file goes under (``root``; default ``/dev/shm``)."""
        return SHARED_MEMORY if self.root is None else self.root

    def write(self, state: Mapping[str, torch.Tensor]) -> Path | None:
        """Put ``state`` into the file; returns its path, or None when shared memory lacks room (write elsewhere).

        The first call (and any call whose tensor names or shapes differ from the last) writes a new file under a
        temporary name and renames it into place; later calls copy into the mapped file."""
        tensors, _ = dedupe_shared(state)
        if self.path is None or _layout(tensors) != self._shapes:
            return self._create(tensors)
        with torch.no_grad():
            for name, tensor in tensors.items():
                self._views[name].copy_(tensor)
        return self.path

    def _create(self, tensors: dict[str, torch.Tensor]) -> Path | None:
        self._views = {}
        cast = cast_floats(tensors, self.dtype)
        folder = handoff_dir(sum(t.numel() * t.element_size() for t in cast.values()), self.root)
        if folder is None:
            self.path = None
            return None
        path = folder / self.name
        temp = Path(temp_name_for(str(path)))
        try:
            save_file(cast, str(temp), metadata={"format": "pt"})
            os.replace(temp, path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        self._views = self._map(path)
        self._shapes = _layout(tensors)
        self.path = path
        weakref.finalize(self, path.unlink, True)  # the file goes with this object (or this process)
        return path

    @staticmethod
    def _map(path: Path) -> dict[str, torch.Tensor]:
        """Writable views of every tensor of the safetensors file at ``path``, over one shared mapping of it
        (the format: an 8-byte little-endian header length, a JSON header of dtype, shape and byte range per
        tensor, then the bytes)."""
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        data = torch.from_file(str(path), shared=True, size=path.stat().st_size, dtype=torch.uint8)[8 + length :]
        views = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            start, end = entry["data_offsets"]
            views[name] = data[start:end].view(SAFETENSORS_DTYPES[entry["dtype"]]).view(entry["shape"])
        return views
