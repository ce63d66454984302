"""What :class:`~llmrl_core.envs.chat_env.ChatEnv` takes as a batch size (TorchRL's sizes as llmrl's slot count,
:func:`_flat_batch_size`) and the error it raises for a reset or a batch size it cannot take
(:class:`ChatEnvInputError`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class ChatEnvInputError(ValueError, RuntimeError):
    """A reset or a batch size the env cannot take (TorchRL raises these as ``RuntimeError``; llmrl's own code
    has caught them as ``ValueError``: both work)."""


def _flat_batch_size(batch_size: int | Sequence[int] | torch.Size | None, owner: str) -> int | None:
    """TorchRL's batch sizes (``(1,)``, ``[4]``, ``torch.Size([2])``) as llmrl's slot count; ``()`` is refused."""
    if batch_size is None or isinstance(batch_size, int):
        return batch_size
    dims = list(batch_size)
    if not dims:
        raise ValueError(f"{owner} must have at least one dimension")
    if len(dims) != 1:
        raise ChatEnvInputError(f"{owner} takes a one-dimensional batch size, got {tuple(dims)}")
    return int(dims[0])
