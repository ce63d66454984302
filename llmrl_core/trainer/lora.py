"""LoRA through peft: wrap a causal LM, export the adapter alone (atomically), and merge for publishing."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraOptions:
    """LoRA hyper-parameters (peft ``LoraConfig``); dropout defaults to 0 so a step is deterministic."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = LLAMA_LINEARS


def apply_lora(model: Any, options: LoraOptions) -> Any:
    """Return ``model`` wrapped by peft with fresh LoRA adapters; only adapter weights require grad."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=options.r,
        lora_alpha=options.alpha,
        lora_dropout=options.dropout,
        target_modules=list(options.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a peft model."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def export_adapter(model: Any, path: str | os.PathLike) -> Path:
    """Write only the adapter (``adapter_model.safetensors`` + ``adapter_config.json``) to ``path``, atomically.

    The files are written to a temporary folder next to ``path`` which then replaces ``path`` by rename, so a
    reader sees the old adapter or the new one, never a half-written folder.
    """
    if not is_lora(model):
        raise ValueError("export_adapter needs a LoRA (peft) model; this trainer has no LoRA adapter")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            os.replace(target, old / "adapter")
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@torch.no_grad()
def merged_state_dict(model: Any, copy: bool = True) -> dict[str, torch.Tensor]:
    """Full-model weights with Hugging Face names (LoRA merged in, when present), detached copies.

    This is what an inference engine loads; the model itself is left unchanged (adapters are merged, copied
    and unmerged again). ``copy=False``: a model without adapters gives its own tensors (detached, not copied),
    for a caller that only reads them before the model changes again (e.g. to write them to a file).
    """
    if not is_lora(model):
        return {k: v.detach().clone() if copy else v.detach() for k, v in model.state_dict().items()}
    model.merge_adapter()
    try:
        state = model.get_base_model().state_dict()
        return {k.replace(".base_layer.", "."): v.detach().clone() for k, v in state.items() if "lora_" not in k}
    finally:
        model.unmerge_adapter()
