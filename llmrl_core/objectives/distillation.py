"""TorchRL's ``torchrl.objectives.llm.distillation`` under llmrl's name: its per-token KL estimate
(``DistillationLoss`` itself is not ported)."""

from __future__ import annotations

import torch

from llmrl_core.objectives.reductions import kl_estimate


def k3_kl_token_estimate(target_log_prob: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate ``exp(d) - 1 - d`` with ``d = target_log_prob - log_prob`` (TorchRL's arguments): the
    KL from the distribution the tokens were sampled from (``log_prob``) to the target, unreduced."""
    return kl_estimate(log_prob, target_log_prob, "k3")


__all__ = ["k3_kl_token_estimate"]
