"""Token-level distillation toward a teacher's log-probs, TorchRL 0.14.1's ``DistillationLoss`` written from scratch,
and its per-token KL estimate.

``DistillationLoss(student)(td)`` scores the batch's chats with the student (with gradients) and compares them with
the teacher's per-token log-probs that the batch carries at ``("next", "teacher_log_probs", "full")`` (what
``RetrieveLogProb(teacher, log_probs_full_key=("teacher_log_probs", "full"))`` writes, aligned with the chat's
tokens). Each token's KL is the k3 estimate: ``kl_direction="reverse"`` estimates KL(student || teacher) (the tokens
should be the student's samples), ``"forward"`` KL(teacher || student) (the teacher's). Gradients flow through the
student's log-probs only, as in TorchRL. Per chat the token KLs are summed over the trained tokens (the assistant's
with ``assistant_only``, else every real token), divided by their number with ``normalize_by_seq_length``, then
reduced over chats (``mean``, ``sum`` or ``none``).

The tokens come from ``("tokens", "full")`` and ``("masks", "all_assistant_mask")`` when the batch has them (a
wrapper's output), else from rendering ``("history", "full")`` with the tokenizer; the student's first token has no
context and is never trained (llmrl's scoring gives it no log-prob).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from tensordict import TensorClass
from torch import nn

from llmrl_core.objectives.reductions import kl_estimate
from llmrl_core.objectives.tensor_keys import TensorKeysMixin

TEACHER_LOG_PROBS_KEY = ("next", "teacher_log_probs", "full")


def k3_kl_token_estimate(target_log_prob: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate ``exp(d) - 1 - d`` with ``d = target_log_prob - log_prob`` (TorchRL's arguments): the
    KL from the distribution the tokens were sampled from (``log_prob``) to the target, unreduced."""
    if target_log_prob.shape != log_prob.shape:
        raise ValueError(
            "target_log_prob and log_prob must have the same shape, got "
            f"target_log_prob.shape={target_log_prob.shape} and log_prob.shape={log_prob.shape}."
        )
    return kl_estimate(log_prob, target_log_prob, "k3")


class DistillationLossOutput(TensorClass["nocast"]):
    """The distillation loss (``loss_distill``, differentiable) and the detached mean per-chat KL to the teacher
    (``kl_to_teacher``, for logging): back-propagate ``loss_distill``, as in TorchRL."""

    loss_distill: torch.Tensor
    kl_to_teacher: torch.Tensor


class DistillationLoss(TensorKeysMixin, nn.Module):
    """Distil a student toward a teacher's per-token log-probs; TorchRL's signature (see the module docstring).

    ``actor_network`` is the student (a ``TransformersWrapper`` or a ``transformers`` causal LM); ``tokenizer``
    (default: the wrapper's) renders the chats when the batch has no tokens; ``tokenizer_kwargs`` go to
    ``History.apply_chat_template``. ``device`` is accepted for TorchRL's signature (the student's own device is
    used). The keys read are TorchRL's ``tensor_keys`` (``history``, ``teacher_log_prob``, ``log_probs``), changed
    with ``set_keys``.
    """

    @dataclass
    class _AcceptedKeys:
        """Where ``loss(td)`` reads its inputs (TorchRL's names and defaults; change them with ``set_keys``)."""

        history: Any = ("history", "full")
        teacher_log_prob: Any = TEACHER_LOG_PROBS_KEY
        log_probs: Any = ("log_probs", "full")

    def __init__(
        self,
        actor_network: Any,
        tokenizer: Any = None,
        tokenizer_kwargs: dict | None = None,
        kl_direction: Literal["reverse", "forward"] = "reverse",
        reduction: Literal["mean", "sum", "none"] = "mean",
        normalize_by_seq_length: bool = True,
        assistant_only: bool = True,
        device: torch.device | None = None,
    ):
        super().__init__()
        if kl_direction not in ("reverse", "forward"):
            raise ValueError(f"kl_direction must be 'reverse' or 'forward', got {kl_direction!r}.")
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}.")
        self.actor_network = actor_network
        self.tokenizer = tokenizer if tokenizer is not None else getattr(actor_network, "tokenizer", None)
        self.tokenizer_kwargs = {"add_generation_prompt": False, **(tokenizer_kwargs or {})}  # TorchRL's default
        self.kl_direction = kl_direction
        self.reduction = reduction
        self.normalize_by_seq_length = normalize_by_seq_length
        self.assistant_only = assistant_only
        self.device = device

    def forward(self, td: Any) -> DistillationLossOutput:
        """The loss on a batch of chats carrying the teacher's log-probs."""
        import llmrl_core.objectives.tensordict_input as tdi

        owner = "DistillationLoss"
        keys = self.tensor_keys
        tokens, attention, assistant = tdi.chat_tokens(td, self.tokenizer, self.tokenizer_kwargs, owner, keys.history)
        if self.assistant_only and assistant is None:
            raise ValueError(f"{owner}: Assistant masks are not present in the token structure (assistant_only=True)")
        teacher_rows = tdi.rows(td, keys.teacher_log_prob)
        if teacher_rows is None:
            raise KeyError(
                f"Teacher log-probs not found at {keys.teacher_log_prob} in the input tensordict. Use "
                "RetrieveLogProb(teacher, log_probs_full_key=('teacher_log_probs', 'full')) to compute them, or "
                "point the teacher_log_prob key to your data with set_keys()."
            )
        lengths = attention.sum(-1).tolist()
        teacher_lengths = [r.numel() for r in teacher_rows]
        if teacher_lengths != lengths:
            padded = len(set(teacher_lengths)) == 1 and teacher_lengths[0] == max(lengths)
            hint = (
                " They look padded to the longest chat (a teacher wrapper with pad_output=True, which TorchRL 0.14.1 "
                "refuses too): give RetrieveLogProb a teacher wrapper with pad_output=False."
                if padded
                else ""
            )
            raise ValueError(
                f"Student and teacher log-probs have different shapes: the chats have {lengths} tokens, the teacher's "
                f"log-probs {teacher_lengths}. Both models must score the same tokenized sequences.{hint}"
            )
        mask = assistant if self.assistant_only else attention
        mask = mask & attention
        first = attention.shape[-1] - attention.sum(-1)  # each row's first real token has no context
        mask[torch.arange(mask.shape[0]), first.clamp(max=mask.shape[-1] - 1)] = False
        if not mask.any(-1).all():
            raise ValueError("Some sequences have no tokens selected for distillation. Check the masks of the input.")
        teacher = tdi.as_padded_tensor([r.reshape(-1).float() for r in teacher_rows], 0.0, "left")
        if not self.assistant_only and assistant is not None:
            _refuse_zero_filled_teacher(teacher, attention, assistant)
        log_probs, _ = tdi.score(self.actor_network, tokens, attention, with_entropy=False, owner=owner)
        mask = mask.to(log_probs.device)
        student = log_probs.masked_fill(~mask, 0.0)
        teacher = teacher.to(log_probs.device).detach().masked_fill(~mask, 0.0)
        if self.kl_direction == "reverse":
            per_token = k3_kl_token_estimate(teacher, student)
        else:
            per_token = k3_kl_token_estimate(student, teacher)
        per_chat = per_token.sum(-1)
        if self.normalize_by_seq_length:
            per_chat = per_chat / mask.sum(-1).clamp(min=1)
        if self.reduction == "mean":
            loss = per_chat.mean()
        elif self.reduction == "sum":
            loss = per_chat.sum()
        else:
            loss = per_chat
        return DistillationLossOutput(loss_distill=loss, kl_to_teacher=per_chat.detach().mean())


def _refuse_zero_filled_teacher(teacher: torch.Tensor, attention: torch.Tensor, assistant: torch.Tensor) -> None:
    """Refuse teacher log-probs that are exactly 0.0 on most non-assistant tokens (what
    ``RetrieveLogProb(assistant_only=True)`` writes there) when the loss trains on every token: the student would
    be pulled toward probability one on them."""
    others = attention & ~assistant
    total = int(others.sum())
    zeros = int(((teacher == 0.0) & others).sum())
    if total and zeros > 0.9 * total:
        raise RuntimeError(
            f"{zeros} out of {total} attended non-assistant tokens have a teacher log-probability of exactly 0.0: "
            "teacher log-probs written by RetrieveLogProb(assistant_only=True), used with "
            "DistillationLoss(assistant_only=False). Construct the loss with assistant_only=True, or recompute the "
            "teacher log-probs with RetrieveLogProb(assistant_only=False)."
        )


__all__ = ["DistillationLoss", "DistillationLossOutput", "TEACHER_LOG_PROBS_KEY", "k3_kl_token_estimate"]
