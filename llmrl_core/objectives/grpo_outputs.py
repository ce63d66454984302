"""The output tensorclasses of the GRPO-family losses (TorchRL's names, defined in TorchRL's ``grpo`` module and
importable from :mod:`llmrl_core.objectives.grpo` too): :class:`LLMLossOutput` and its subclasses
:class:`GRPOLossOutput`, :class:`DAPOLossOutput` and :class:`CISPOLossOutput`."""

from __future__ import annotations

from dataclasses import fields

import torch
from tensordict import TensorClass


class LLMLossOutput(TensorClass["nocast"]):
    """Loss terms (``loss_*``, differentiable) and detached diagnostics of one GRPO-family evaluation.

    A tensorclass with TorchRL's fields in TorchRL's order (then llmrl's diagnostics), so TorchRL's idioms work:
    ``out.loss_objective``, ``out.sum(reduce=True)`` (every field: the diagnostics are detached, so the gradient
    is the loss terms'), ``out.detach()``, ``out.to_dict()``. Terms that were not requested are ``None``.
    :attr:`loss` is the sum of the present ``loss_*`` terms only.
    """

    loss_objective: torch.Tensor
    clip_fraction: torch.Tensor
    kl_approx: torch.Tensor
    ESS: torch.Tensor
    entropy: torch.Tensor | None = None
    loss_entropy: torch.Tensor | None = None
    loss_kl_to_ref: torch.Tensor | None = None
    kl_to_ref: torch.Tensor | None = None
    loss_kl_to_inference: torch.Tensor | None = None
    kl_to_inference: torch.Tensor | None = None
    num_tokens: torch.Tensor | None = None
    sampler_abs_diff_mean: torch.Tensor | None = None
    sampler_abs_diff_max: torch.Tensor | None = None
    kl_to_sampler: torch.Tensor | None = None
    sampler_ess: torch.Tensor | None = None

    @property
    def loss(self) -> torch.Tensor:
        """The total loss to back-propagate: the sum of every present ``loss_*`` term."""
        terms = [getattr(self, f.name) for f in fields(self) if f.name.startswith("loss_")]
        total = terms[0]
        for term in terms[1:]:
            if term is not None:
                total = total + term
        return total

    def metrics(self) -> dict[str, float]:
        """Every present scalar field as a Python float (for logging)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                out[f.name] = float(value.detach())
        return out


class GRPOLossOutput(LLMLossOutput):
    """What :class:`GRPOLoss` returns (TorchRL's name; the fields are :class:`LLMLossOutput`'s)."""


class DAPOLossOutput(LLMLossOutput):
    """What :class:`DAPO` returns (TorchRL's name; the fields are :class:`LLMLossOutput`'s)."""


class CISPOLossOutput(LLMLossOutput):
    """What :class:`CISPOLoss` returns (TorchRL's name; the fields are :class:`LLMLossOutput`'s)."""
