"""Supervised fine-tuning objective: the pure function :func:`sft_loss` and the model-facing :class:`SFTLoss`.

Semantics follow TorchRL 0.14.1's ``SFTLoss`` (written from scratch): per sequence, the sum of the
log-probs of the trained (assistant) tokens, optionally divided by their number
(``normalize_by_seq_length``); ``sft`` is ``-that``, ``minor_sft`` (Xie et al. 2024) is
``-logsigmoid(beta * (that - the same quantity under the reference model))``; then the ``reduction``
(``mean`` / ``sum`` over sequences, or ``none``).

Differences from TorchRL, where it counts tokens outside the mask:

- ``kl_to_ref`` (k3 estimator, as TorchRL) is the mean over the trained tokens; TorchRL averages over every
  token of the concatenated sequences (prompt and padding positions count as zero KL).
- ``loss_kl_to_ref`` is reduced like ``loss_sft`` (per-sequence KL, normalised by length when
  ``normalize_by_seq_length``, then the ``reduction``), so both terms weigh sequences the same way and a
  batch can be split into micro-batches exactly; TorchRL uses ``coeff * kl_to_ref``.
- ``minor_sft`` sums the reference log-probs over the trained tokens only; TorchRL sums the reference
  log-probs of the whole sequence it is given.
- A sequence with no trained token contributes 0 and is left out of the ``mean`` (TorchRL raises).
- As in TorchRL, ``kl_to_ref_coeff`` is ignored for ``minor_sft`` (its KL regularisation is implicit): the KL
  is still reported, ``loss_kl_to_ref`` is not returned.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch
import torch.nn.functional as F
from tensordict import TensorClass
from torch import nn

from llmrl_core.objectives.reductions import check_token_tensor, kl_estimate, masked_mean, masked_zero
from llmrl_core.objectives.tensor_keys import TensorKeysMixin


class SFTLossOutput(TensorClass["nocast"]):
    """SFT loss terms (``loss_*``, differentiable) and the detached KL to the reference: a tensorclass with
    TorchRL's fields (``out.sum(reduce=True)`` is the total loss, as in TorchRL), then llmrl's ``num_tokens``."""

    loss_sft: torch.Tensor
    loss_kl_to_ref: torch.Tensor | None = None
    kl_to_ref: torch.Tensor | None = None
    num_tokens: torch.Tensor | None = None

    @property
    def loss(self) -> torch.Tensor:
        """The total loss to back-propagate."""
        return self.loss_sft if self.loss_kl_to_ref is None else self.loss_sft + self.loss_kl_to_ref

    def metrics(self) -> dict[str, float]:
        """Every present scalar field as a Python float (for logging)."""
        return {
            f.name: float(getattr(self, f.name).detach())
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor) and getattr(self, f.name).numel() == 1
        }


def _reduce(per_sequence: torch.Tensor, rows: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return per_sequence
    if reduction == "sum":
        return per_sequence.sum()
    if reduction == "mean":
        return masked_zero(per_sequence, rows).sum() / rows.sum().clamp_min(1)
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def minor_sft_loss(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, beta: float, reduction: str) -> torch.Tensor:
    """TorchRL's MinorSFT term (Xie et al. 2024): ``-log_sigmoid(beta * (log_probs - ref_log_probs))`` elementwise,
    then ``reduction`` (``"mean"``, ``"sum"`` or ``"none"``)."""
    if log_probs.shape != ref_log_probs.shape:
        raise ValueError(
            "Current log probabilities and reference log probabilities have different shapes: "
            f"log_probs.shape={tuple(log_probs.shape)} vs ref_log_probs.shape={tuple(ref_log_probs.shape)}."
        )
    loss = -F.logsigmoid(beta * (log_probs - ref_log_probs))
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"Invalid reduction: {reduction}")


def sft_loss(
    log_probs: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_function: Literal["sft", "minor_sft"] = "sft",
    reduction: Literal["mean", "sum", "none"] = "mean",
    normalize_by_seq_length: bool = True,
    ref_log_probs: torch.Tensor | None = None,
    kl_to_ref_coeff: float | None = None,
    beta: float = 0.1,
) -> SFTLossOutput:
    """SFT / MinorSFT loss on ``(B, T)`` per-token log-probs of the target tokens and a bool ``mask``."""
    if log_probs.ndim != 2:
        raise ValueError(f"log_probs must be (B, T), got shape {tuple(log_probs.shape)}")
    check_token_tensor("mask", mask, log_probs.shape)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
    if loss_function not in ("sft", "minor_sft"):
        raise ValueError(f"loss_function must be 'sft' or 'minor_sft', got {loss_function!r}")
    if ref_log_probs is not None:
        check_token_tensor("ref_log_probs", ref_log_probs, log_probs.shape)
        if not torch.isfinite(ref_log_probs[mask]).all():
            bad = sorted({int(r) for r in (~torch.isfinite(ref_log_probs) & mask).nonzero()[:, 0]})
            raise ValueError(f"ref_log_probs has non-finite values on trained tokens of rows {bad}")
    counts = mask.sum(-1)
    rows = counts > 0
    summed = masked_zero(log_probs, mask).sum(-1)
    if normalize_by_seq_length:
        summed = summed / counts.clamp_min(1)
    out = SFTLossOutput(loss_sft=log_probs.new_zeros(()), num_tokens=counts.sum())
    if loss_function == "sft":
        out.loss_sft = _reduce(-summed, rows, reduction)
    else:
        if ref_log_probs is None:
            raise ValueError("loss_function='minor_sft' needs ref_log_probs")
        ref_summed = masked_zero(ref_log_probs.to(log_probs.dtype), mask).sum(-1)
        if normalize_by_seq_length:
            ref_summed = ref_summed / counts.clamp_min(1)
        per_sequence = masked_zero(minor_sft_loss(summed, ref_summed, beta, "none"), rows)
        out.loss_sft = _reduce(per_sequence, rows, reduction)
    if ref_log_probs is not None and (kl_to_ref_coeff is not None or loss_function == "minor_sft"):
        per_token = kl_estimate(masked_zero(log_probs, mask), masked_zero(ref_log_probs.to(log_probs.dtype), mask))
        out.kl_to_ref = masked_mean(per_token.detach(), mask)
        if loss_function == "sft" and kl_to_ref_coeff is not None:
            per_sequence_kl = masked_zero(per_token, mask).sum(-1)
            if normalize_by_seq_length:
                per_sequence_kl = per_sequence_kl / counts.clamp_min(1)
            out.loss_kl_to_ref = kl_to_ref_coeff * _reduce(per_sequence_kl, rows, reduction)
    elif kl_to_ref_coeff is not None:
        raise ValueError("kl_to_ref_coeff is set but ref_log_probs is missing")
    return out


class SFTLoss(TensorKeysMixin, nn.Module):
    """SFT loss for a causal LM (TorchRL's signature): scores the trained tokens with ``actor_network`` and applies
    :func:`sft_loss`.

    ``loss(td)`` (TorchRL's call) reads ``("history", "full")``: the assistant tokens come from
    ``("masks", "all_assistant_mask")`` with ``("tokens", "full")`` when the batch has them, else from the chat
    template (``tokenizer``, default the actor's, with ``tokenizer_kwargs``); with ``kl_to_ref_coeff`` or
    ``minor_sft``, ``("next", "ref_log_probs", "full")``. ``loss(packed_batch)`` is the trainer's path (each
    sample's ``response_mask``). Options: ``loss_function`` (``"sft"`` | ``"minor_sft"``), ``reduction``,
    ``normalize_by_seq_length``, ``kl_to_ref_coeff``, ``beta`` -- TorchRL's names and defaults. The keys read are
    TorchRL's ``tensor_keys`` (``history``, ``ref_log_prob``, ``log_probs``), changed with ``set_keys``.
    """

    @dataclass
    class _AcceptedKeys:
        """Where ``loss(td)`` reads its inputs (TorchRL's names and defaults; change them with ``set_keys``)."""

        history: Any = ("history", "full")
        ref_log_prob: Any = ("next", "ref_log_probs", "full")
        log_probs: Any = ("log_probs", "full")

    def __init__(
        self,
        actor_network: nn.Module | None,
        tokenizer: Any = None,
        tokenizer_kwargs: dict | None = None,
        reduction: Literal["mean", "sum", "none"] = "mean",
        normalize_by_seq_length: bool = True,
        kl_to_ref_coeff: float | None = None,
        loss_function: Literal["sft", "minor_sft"] = "sft",
        beta: float = 0.1,
        device: torch.device | None = None,
    ):
        super().__init__()
        if loss_function == "minor_sft" and kl_to_ref_coeff:
            warnings.warn("kl_to_ref_coeff is ignored with minor_sft (its KL regularisation is implicit)", stacklevel=2)
            kl_to_ref_coeff = None
        self.actor_network = actor_network
        self.tokenizer = tokenizer if tokenizer is not None else getattr(actor_network, "tokenizer", None)
        self.tokenizer_kwargs = dict(tokenizer_kwargs or {})
        self.device = device
        self.options: dict[str, Any] = dict(
            loss_function=loss_function,
            reduction=reduction,
            normalize_by_seq_length=normalize_by_seq_length,
            kl_to_ref_coeff=kl_to_ref_coeff,
            beta=beta,
        )

    @property
    def reduction(self) -> str:
        """How per-sequence losses are combined (``mean`` | ``sum`` | ``none``)."""
        return self.options["reduction"]

    def accumulation_units(self, batch: Any) -> float | None:
        """How much ``batch`` weighs in a batch-level mean (sequences with a trained token); ``None`` for sums."""
        return float(batch.mask.any(-1).sum()) if self.reduction == "mean" else None

    def forward(self, batch: Any) -> SFTLossOutput:
        """Score ``batch`` (a TorchRL TensorDict, or a :class:`~llmrl_core.trainer.batch.PackedBatch`) and return
        the loss terms."""
        from tensordict import TensorDictBase

        if isinstance(batch, TensorDictBase):
            return self._forward_tensordict(batch)
        from llmrl_core.trainer.scoring import score_packed

        if self.actor_network is None:
            raise ValueError("SFTLoss has no actor_network: pass the model, or call sft_loss() directly")
        scores = score_packed(self.actor_network, batch)
        return sft_loss(scores.log_probs, batch.mask, ref_log_probs=batch.ref_log_probs, **self.options)

    def _forward_tensordict(self, td: Any) -> SFTLossOutput:
        """TorchRL's call on a batch of chats (see the class docstring for the keys read)."""
        import llmrl_core.objectives.tensordict_input as tdi

        keys = self.tensor_keys
        tokens, attention, assistant = tdi.chat_tokens(
            td, self.tokenizer, self.tokenizer_kwargs, "SFTLoss", keys.history
        )
        if assistant is None:
            raise ValueError(
                "SFTLoss: Assistant masks are not present in the token structure (the chat template has no "
                "generation tags; pass chat_template_name='chatml_format' or a template that marks them)"
            )
        if not assistant.any(-1).all():
            raise ValueError("Some inputs have no valid assistant masks.")
        log_probs, _ = tdi.score(self.actor_network, tokens, attention, with_entropy=False, owner="SFTLoss")
        ref = None
        if self.options["kl_to_ref_coeff"] is not None or self.options["loss_function"] == "minor_sft":
            ref = tdi.left_padded(td, keys.ref_log_prob, 0.0)
            if ref is None:
                why = "kl_to_ref_coeff was set" if self.options["kl_to_ref_coeff"] is not None else "loss is minor_sft"
                raise ValueError(f"Reference log probs not found in tensordict at key {keys.ref_log_prob} but {why}")
            ref = ref.to(log_probs.device)
        return sft_loss(log_probs, assistant.to(log_probs.device), ref_log_probs=ref, **self.options)
