"""The optimizer, RNG and LoRA-adapter state the trainer actor saves beside each checkpoint it seals, the pruning of
the older ones and the resume from a published version (:class:`TrainerStateFiles`, a part of
:class:`~runtime.trainer_actor.TrainerWorker`)."""

from __future__ import annotations

import io
import random
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import torch

from storage.checkpoints import CheckpointStore
from storage.filesystems import read_bytes, write_atomic
from storage.layout import RunLayout


class TrainerStateFiles:
    """Save, prune and restore the trainer's state files (``trainer-v<version>.pt`` of the run's layout), on the
    attributes :class:`~runtime.trainer_actor.TrainerWorker` sets: ``layout``, ``trainer``, ``model`` and
    ``checkpoints``."""

    # --- state -----------------------------------------------------------------------------------
    def _state_file(self, version: int, layout: RunLayout | None = None) -> tuple[Any, str]:
        """``(filesystem, path)`` of the optimizer/RNG state of ``version`` (a local folder or a remote store) of
        this run, or of the run laid out at ``layout``."""
        return (layout or self.layout).trainer_state_file(version)

    def save_state(self, version: int) -> int:
        """Save the optimizer and RNG state reached at ``version`` (what a resume from it restores); returns it."""
        state = {
            "optimizer": self.trainer.optimizer.state_dict(),
            "step": self.trainer.step_count,
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "numpy_rng": np.random.get_state(),
            "lora": self._lora_state(),
        }
        write_atomic(*self._state_file(version), lambda out: torch.save(state, out))  # no copy in memory first
        self._prune_states(version)
        return version

    def _prune_states(self, version: int) -> None:
        """Drop optimizer/RNG states older than ``version - 1`` (each is twice the model's size).

        A resume starts from the last committed version, which is ``version`` once its commit marker is
        written and ``version - 1`` until then, so those two are kept.
        """
        fs, path = self._state_file(version)
        folder = path.rpartition("/")[0]
        for entry in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)):
            stem = entry.base_name.removeprefix("trainer-v").removesuffix(".pt")
            if entry.base_name.startswith("trainer-v") and stem.isdigit() and int(stem) < version - 1:
                fs.delete_file(entry.path)

    def _lora_state(self) -> dict[str, torch.Tensor] | None:
        """The LoRA adapter weights (the base model stays frozen at version 0), or None without LoRA."""
        if self.trainer.config.lora is None:
            return None
        from peft import get_peft_model_state_dict

        return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(self.trainer.model).items()}

    def restore(self, version: int, source: RunLayout | None = None) -> bool:
        """Continue from a published version: weights (or LoRA adapters), optimizer state and RNG; ``source``: the
        layout of another run to start from (a fork, :mod:`tasks.fork`). Returns whether the optimizer and RNG
        state was there too (a run keeps only its last ones: an older version gives its weights alone)."""
        fs, state_path = self._state_file(version, source)
        found = fs.get_file_info(state_path).type == pafs.FileType.File
        state = torch.load(io.BytesIO(read_bytes(fs, state_path)), weights_only=False) if found else None
        if self.trainer.config.lora is None:
            checkpoints = self.checkpoints if source is None else CheckpointStore(source.checkpoints_uri)
            loaded = checkpoints.load(version)
            self.model.load_state_dict(loaded.state_dict, strict=False)
            self.model.tie_weights()
        elif state is None or state.get("lora") is None:
            raise RuntimeError(f"{state_path}: no LoRA adapter state to resume version {version} from")
        else:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.trainer.model, state["lora"])
        if state is not None:
            self.trainer.optimizer.load_state_dict(state["optimizer"])
            self.trainer.step_count = state["step"]
            torch.set_rng_state(state["torch_rng"])
            random.setstate(state["python_rng"])
            np.random.set_state(state["numpy_rng"])
        return state is not None
