"""GRPO objective: the pure per-token function :func:`grpo_loss` and the model-facing :class:`GRPOLoss` (with
TorchRL's variants :class:`DAPO` and :class:`CISPOLoss`, and their output tensorclasses of
:mod:`llmrl_core.objectives.grpo_outputs`).

Semantics follow TorchRL 0.14.1's ``GRPOLoss`` (``torchrl.objectives.llm``), written from scratch here:

- importance log-weight ``lw = log_probs - sampler_log_probs`` on the tokens of ``mask`` whose sampler
  log-prob is finite (a NaN/inf sampler log-prob drops that token everywhere);
- PPO clipping in log space, ``clamp(lw, log(1 - eps_low), log(1 + eps_high))`` (symmetric, or asymmetric as
  in DAPO's clip-higher), ``loss = -min(w * A, clip(w) * A)``;
- ``ESS`` = (sum w)^2 / sum w^2 over the trained tokens, divided by their number;
- ``kl_mask_threshold``: tokens with ``0.5 * (log_probs - sampler_log_probs)^2 > threshold`` are dropped
  (per-token trust region), as TorchRL does (against the sampler's log-probs);
- KL terms use TorchRL's ``k3`` estimator by default (``k1``/``k2`` selectable); ``kl_to_inference`` is
  the KL to the sampler, ``kl_to_ref`` to a reference model.

Deliberate differences from TorchRL 0.14.1, where its definition averages over padding:

- ``clip_fraction``, ``kl_approx``, ``kl_to_ref``, ``kl_to_inference`` and ``entropy`` are means over the
  trained tokens (the mask), not over every ``(B, T)`` position; TorchRL divides by ``B * T`` (padding counts
  as unclipped, zero-KL tokens, and as uniform-entropy tokens for ``entropy``).
- ``loss_kl_to_ref`` / ``loss_kl_to_inference`` use the same ``aggregation`` as the objective (for
  ``token_mean`` that is ``coeff * kl``, TorchRL's definition with the masked mean).
- ``prompt_mean`` averages over rows that have at least one trained token (TorchRL counts an empty row as 0).
- CISPO: the value is TorchRL's ``-clip(w) * A``, but the gradient is the paper's
  ``-sg(clip(w)) * A * grad(log pi)``; TorchRL's clamp gives clipped tokens no gradient at all, which is
  PPO's one-sided clip, not CISPO (whose point is to keep every token's gradient).

Additions TorchRL 0.14.1 lacks: the Dr.GRPO ``sequence_sum`` aggregation and the truncated
importance-sampling (TIS) correction for the sampler/trainer log-prob mismatch: with ``tis_cap`` set, the
PPO ratio is taken against the trainer's own behaviour log-probs ``old_log_probs`` (default
``log_probs.detach()``, exact for the first optimizer step on a fresh batch), and each token's objective is
weighted by ``min(exp(old - sampler), tis_cap)`` (``tis_mode="truncate"``) or dropped when that ratio
exceeds the cap (``tis_mode="mask"``).

Further additions:

- ``importance_level="sequence"``: GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"). Row
  ``i``'s log importance weight is ``s_i = mean_t (log_probs - base)`` over its trained tokens (the mask after
  the finite-sampler, TIS-mask and ``kl_mask_threshold`` filters; ``base`` is the sampler log-prob, or
  ``old_log_probs`` under TIS, as for the token ratio). Every token of the row is clipped and weighted with
  ``exp(s_i)``, and the gradient flows through the mean (``d s_i / d log_probs_t = 1 / |y_i|``: GSPO's
  sequence ratio itself, not its "GSPO-token" variant). With ``objective="cispo"`` the stop-gradient weight is
  the clipped sequence ratio and the gradient flows through ``s_i``. ``clip_epsilon`` keeps its meaning, now
  on the sequence ratio: length-normalised ratios sit far closer to 1, so set much smaller epsilons, e.g.
  ``clip_epsilon=(3e-4, 4e-4)`` as in the GSPO paper (the default 0.2 almost never clips). ``aggregation``
  applies as configured: ``prompt_mean`` is GSPO's mean over sequences, ``token_mean`` weighs each sequence's
  term by its trained-token count. ``clip_fraction`` and ``ESS`` are computed on what is actually applied:
  over the trained tokens, each carrying its row's (clipped or not) ``exp(s_i)``, so ``clip_fraction`` is the
  share of trained tokens lying in clipped sequences and ``ESS`` is token-weighted over sequences.
- ``tis_level="sequence"``: the TIS behaviour ratio of a row is ``exp(sum_t (old - sampler))`` over its
  trained tokens (the sequence-level IS weight; tokens with a finite sampler log-prob, counted before the
  ``kl_mask_threshold`` filter), applied to every token of the row: ``truncate`` weights the row by
  ``min(ratio, tis_cap)``, ``mask`` drops the whole row when ``ratio > tis_cap``.
- Detached sampler/trainer agreement diagnostics against the *sampler* log-probs (never ``old_log_probs``),
  over the trained tokens with a finite sampler log-prob, before the ``kl_mask_threshold`` and TIS-mask
  filters: ``sampler_abs_diff_mean`` / ``sampler_abs_diff_max`` (of ``|log_probs - sampler|``; max 0 when there
  is no token), ``kl_to_sampler`` (mean ``k3`` estimate, ``kl_estimate(log_probs, sampler, "k3")``) and
  ``sampler_ess`` (the ESS formula above on ``exp(log_probs - sampler)``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch
from torch import nn

from llmrl_core.objectives.advantage import MCAdvantage  # noqa: F401  (TorchRL's grpo module defines it)
from llmrl_core.objectives.advantage_hosted import RayMCAdvantage  # noqa: F401  (and these two)
from llmrl_core.objectives.advantage_selector import MCAdvantageSelector  # noqa: F401
from llmrl_core.objectives.grpo_options import (
    IMPORTANCE_LEVELS,  # noqa: F401  (importable from here, as before)
    TIS_LEVELS,  # noqa: F401
    check_choices,
    clip_bounds,
)
from llmrl_core.objectives.grpo_outputs import CISPOLossOutput, DAPOLossOutput, GRPOLossOutput, LLMLossOutput
from llmrl_core.objectives.reductions import (
    aggregate,
    broadcast_advantages,
    check_token_tensor,
    kl_estimate,
    masked_mean,
    masked_zero,
)
from llmrl_core.objectives.tensor_keys import TensorKeysMixin


def _ess(log_weights: torch.Tensor) -> torch.Tensor:
    """(sum w)^2 / sum w^2 / n of the 1-D ``log_weights`` (computed in log space); 0 when empty."""
    if not log_weights.numel():
        return log_weights.new_zeros(())
    return (2 * log_weights.logsumexp(0) - (2 * log_weights).logsumexp(0)).exp() / log_weights.numel()


def grpo_loss(
    log_probs: torch.Tensor,
    sampler_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_epsilon: float | tuple[float, float] = 0.2,
    objective: Literal["ppo", "cispo"] = "ppo",
    aggregation: str = "token_mean",
    norm_constant: float | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coeff: float = 0.01,
    ref_log_probs: torch.Tensor | None = None,
    kl_to_ref_coeff: float | None = None,
    kl_to_inference_coeff: float | None = None,
    kl_estimator: str = "k3",
    kl_mask_threshold: float | None = None,
    old_log_probs: torch.Tensor | None = None,
    tis_cap: float | None = None,
    tis_mode: Literal["truncate", "mask"] = "truncate",
    tis_level: Literal["token", "sequence"] = "token",
    importance_level: Literal["token", "sequence"] = "token",
) -> GRPOLossOutput:
    """GRPO loss on padded per-token tensors (see the module docstring for the exact semantics).

    Args:
        log_probs: ``(B, T)`` log-probs of the sampled tokens under the policy being trained (with grad).
        sampler_log_probs: ``(B, T)`` log-probs the sampler reported; non-finite entries are excluded.
        advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        mask: ``(B, T)`` bool, True on trained tokens (response/assistant tokens, not padding).
        clip_epsilon: ``eps`` or ``(eps_low, eps_high)``.
        objective: ``"ppo"`` (clipped surrogate) or ``"cispo"`` (clipped, stop-gradient IS weight).
        aggregation: ``token_mean`` | ``prompt_mean`` | ``sequence_sum`` (needs ``norm_constant``) | ``none``.
        entropy: ``(B, T)`` per-token entropy of the policy; when given, ``loss_entropy = -coeff * entropy``.
        ref_log_probs: ``(B, T)`` reference-model log-probs, needed when ``kl_to_ref_coeff > 0``.
        kl_to_ref_coeff / kl_to_inference_coeff: KL penalty weights (``None``: term not computed).
        kl_estimator: ``k1`` | ``k2`` | ``k3``.
        kl_mask_threshold: per-token trust region on ``0.5 * (log_probs - sampler_log_probs)^2``.
        old_log_probs / tis_cap / tis_mode: truncated importance-sampling correction.
        tis_level: ``"token"`` (per-token behaviour ratio) or ``"sequence"`` (one ratio per row, the exp of
            the row's summed ``old - sampler``).
        importance_level: ``"token"`` (PPO/GRPO ratio per token) or ``"sequence"`` (GSPO: one
            length-normalised ratio per row; use small ``clip_epsilon``, e.g. ``(3e-4, 4e-4)``).
    """
    if log_probs.ndim != 2:
        raise ValueError(f"log_probs must be (B, T), got shape {tuple(log_probs.shape)}")
    shape = log_probs.shape
    check_token_tensor("sampler_log_probs", sampler_log_probs, shape)
    check_token_tensor("mask", mask, shape)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
    if sampler_log_probs.requires_grad:
        raise ValueError("sampler_log_probs must not require grad (it is data from the sampler)")
    check_choices(
        {"objective": objective, "tis_mode": tis_mode, "importance_level": importance_level, "tis_level": tis_level}
    )
    low, high = clip_bounds(clip_epsilon)
    adv = broadcast_advantages(advantages.to(log_probs.dtype), shape)

    mask = mask & torch.isfinite(sampler_log_probs)
    cur = masked_zero(log_probs, mask)
    sampler = masked_zero(sampler_log_probs.to(log_probs.dtype), mask)
    with torch.no_grad():  # sampler/trainer agreement, before the kl_mask_threshold / TIS-mask filters
        sampler_diff = (cur.detach() - sampler)[mask]
        abs_diff = sampler_diff.abs()
        sampler_abs_diff_mean = abs_diff.mean() if abs_diff.numel() else abs_diff.new_zeros(())
        sampler_abs_diff_max = abs_diff.max() if abs_diff.numel() else abs_diff.new_zeros(())
        kl_to_sampler = masked_mean(kl_estimate(cur.detach(), sampler, "k3"), mask)
        sampler_ess = _ess(sampler_diff)

    tis_weight = None
    base = sampler
    if tis_cap is not None:
        if tis_cap <= 0:
            raise ValueError(f"tis_cap must be positive, got {tis_cap}")
        if old_log_probs is None:
            old = cur.detach()
        else:
            check_token_tensor("old_log_probs", old_log_probs, shape)
            old = masked_zero(old_log_probs.detach().to(log_probs.dtype), mask)
        base = old
        behaviour_log_ratio = old - sampler  # 0 off the mask
        if tis_level == "sequence":
            behaviour_log_ratio = behaviour_log_ratio.sum(-1, keepdim=True).expand(shape)
        behaviour_ratio = behaviour_log_ratio.exp()
        if tis_mode == "truncate":
            tis_weight = behaviour_ratio.clamp(max=tis_cap)
        else:
            mask = mask & (behaviour_ratio <= tis_cap)
    elif old_log_probs is not None:
        raise ValueError("old_log_probs is only used with the truncated IS correction: set tis_cap")

    if kl_mask_threshold is not None and kl_mask_threshold > 0:
        mask = mask & (0.5 * (cur.detach() - sampler).square() <= kl_mask_threshold)

    log_weight = masked_zero(cur - base, mask)
    if importance_level == "sequence":
        # GSPO: the row's mean log-ratio over its trained tokens, shared by all of them (grad 1/|y| per token).
        row_log_weight = log_weight.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp_min(1)
        log_weight = masked_zero(row_log_weight.expand(shape), mask)
    adv = masked_zero(adv, mask)  # garbage (even NaN) under padding must not reach the gradient
    n_tokens = mask.sum()
    with torch.no_grad():
        ess = _ess(log_weight.detach()[mask])
        kl_approx = masked_mean(sampler - cur.detach(), mask)

    clipped = log_weight.clamp(low, high)
    clip_fraction = masked_mean((clipped != log_weight).to(log_probs.dtype), mask)
    if objective == "ppo":
        per_token = -torch.minimum(log_weight.exp() * adv, clipped.exp() * adv)
    else:
        weight = clipped.exp().detach()
        per_token = -weight * adv * (1.0 + log_weight - log_weight.detach())
    if tis_weight is not None:
        per_token = per_token * tis_weight

    out = GRPOLossOutput(
        loss_objective=aggregate(per_token, mask, aggregation, norm_constant),
        clip_fraction=clip_fraction.detach(),
        kl_approx=kl_approx,
        ESS=ess,
        num_tokens=n_tokens.detach(),
        sampler_abs_diff_mean=sampler_abs_diff_mean,
        sampler_abs_diff_max=sampler_abs_diff_max,
        kl_to_sampler=kl_to_sampler,
        sampler_ess=sampler_ess,
    )
    if entropy is not None:
        check_token_tensor("entropy", entropy, shape)
        out.entropy = masked_mean(entropy.detach(), mask)
        out.loss_entropy = aggregate(-entropy_coeff * entropy, mask, aggregation, norm_constant)
    if kl_to_ref_coeff is not None and kl_to_ref_coeff > 0:
        if ref_log_probs is None:
            raise ValueError("kl_to_ref_coeff > 0 needs ref_log_probs")
        check_token_tensor("ref_log_probs", ref_log_probs, shape)
        if not torch.isfinite(ref_log_probs[mask]).all():
            rows = sorted({int(r) for r in (~torch.isfinite(ref_log_probs) & mask).nonzero()[:, 0]})
            raise ValueError(f"ref_log_probs has non-finite values on trained tokens of rows {rows}")
        per_kl = kl_estimate(cur, masked_zero(ref_log_probs.to(log_probs.dtype), mask), kl_estimator)
        out.kl_to_ref = masked_mean(per_kl.detach(), mask)
        out.loss_kl_to_ref = kl_to_ref_coeff * aggregate(per_kl, mask, aggregation, norm_constant)
    if kl_to_inference_coeff is not None:
        per_kl = kl_estimate(cur, sampler, kl_estimator)
        out.kl_to_inference = masked_mean(per_kl.detach(), mask)
        out.loss_kl_to_inference = kl_to_inference_coeff * aggregate(per_kl, mask, aggregation, norm_constant)
    return out


_GRPO_OPTIONS = frozenset(
    name
    for name, p in inspect.signature(grpo_loss).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in ("entropy", "ref_log_probs", "old_log_probs")
)


class GRPOLoss(TensorKeysMixin, nn.Module):
    """GRPO loss for a causal LM; TorchRL's signature, called on a TensorDict or on a packed batch.

    ``loss(td)`` (TorchRL's call) reads the collector's batch: ``("tokens", "full")``, the sampler's
    ``("log_probs", "full")``, ``advantage`` (``(B, 1)`` or per token), the masks of ``masking_strategy`` and, with
    ``kl_to_ref_coeff``, ``("next", "ref_log_probs", "full")`` (:mod:`llmrl_core.objectives.tensordict_input`);
    ``loss(packed_batch)`` is the trainer's path. Both score the tokens with ``actor_network`` and apply
    :func:`grpo_loss`, so the terms are those of the module docstring (TorchRL's names on
    :class:`GRPOLossOutput`; ``set_keys(advantage=..., action=..., sample_log_prob=..., ref_log_probs=...)`` reads
    them elsewhere, as in TorchRL). TorchRL's ``samples_mc_entropy``, ``gamma``, ``reduction`` and ``clip_value`` are
    accepted for its signature and have no effect (the entropy is exact; GRPO has no value head).
    Keyword extras: ``objective="cispo"`` for CISPO, ``importance_level="sequence"`` for GSPO,
    ``tis_cap``/``tis_mode``/``tis_level`` for truncated importance sampling, ``kl_estimator``, ``norm_constant``
    (validated here, before any model work).
    """

    output_type: type[LLMLossOutput] = GRPOLossOutput
    default_objective: str = "ppo"

    @dataclass
    class _AcceptedKeys:
        """Where ``loss(td)`` reads its inputs (TorchRL's names and defaults; change them with ``set_keys``)."""

        advantage: Any = "advantage"
        action: Any = ("tokens", "full")
        sample_log_prob: Any = ("log_probs", "full")
        ref_log_probs: Any = ("next", "ref_log_probs", "full")

    def __init__(
        self,
        actor_network: nn.Module | None = None,
        *,
        clip_epsilon: float | tuple[float, float] = 0.2,
        kl_mask_threshold: float | None = None,
        aggregation: str | None = "token_mean",
        entropy_bonus: bool = True,
        samples_mc_entropy: int = 1,
        entropy_coeff: float = 0.01,
        gamma: float | None = None,
        reduction: str | None = None,
        clip_value: bool | float | None = None,
        kl_to_ref_coeff: float | None = None,
        kl_to_inference_coeff: float | None = None,
        device: torch.device | None = None,
        masking_strategy: Literal["sft", "rlhf", "generic"] = "sft",
        ref_log_prob_padding_side: Literal["left", "right"] = "left",
        ref_log_prob_padding_value: float = 0.0,
        **options: Any,
    ):
        super().__init__()
        from llmrl_core.objectives.tensordict_input import MASKING_STRATEGIES

        self.actor_network = actor_network
        self.entropy_bonus = entropy_bonus
        self.samples_mc_entropy, self.gamma, self.reduction, self.clip_value = (
            samples_mc_entropy,
            gamma,
            reduction,
            clip_value,
        )
        self.device = device
        if masking_strategy not in MASKING_STRATEGIES:
            raise ValueError(f"masking_strategy must be one of {MASKING_STRATEGIES}, got {masking_strategy!r}")
        if ref_log_prob_padding_side not in ("left", "right"):
            raise ValueError(f"ref_log_prob_padding_side must be 'left' or 'right', got {ref_log_prob_padding_side!r}")
        self.masking_strategy = masking_strategy
        self.ref_log_prob_padding_side = ref_log_prob_padding_side
        self.ref_log_prob_padding_value = ref_log_prob_padding_value
        unknown = sorted(set(options) - _GRPO_OPTIONS)
        if unknown:
            raise TypeError(f"GRPOLoss got unknown options {unknown}; valid: {sorted(_GRPO_OPTIONS)}")
        self.options = dict(
            {"objective": self.default_objective},
            **options,
            clip_epsilon=clip_epsilon,
            kl_mask_threshold=kl_mask_threshold,
            aggregation=aggregation or "token_mean",
            entropy_coeff=entropy_coeff,
            kl_to_ref_coeff=kl_to_ref_coeff,
            kl_to_inference_coeff=kl_to_inference_coeff,
        )
        check_choices(self.options)
        if self.default_objective != GRPOLoss.default_objective and self.options["objective"] != self.default_objective:
            raise ValueError(
                f"{type(self).__name__} is the {self.default_objective!r} objective; got "
                f"objective={self.options['objective']!r} (use GRPOLoss for that)"
            )
        clip_bounds(clip_epsilon)
        if self.options["aggregation"] == "sequence_sum" and not self.options.get("norm_constant"):
            raise ValueError("aggregation='sequence_sum' needs norm_constant (e.g. the max new tokens)")

    @property
    def aggregation(self) -> str:
        """The aggregation mode of every ``loss_*`` term."""
        return self.options["aggregation"]

    def accumulation_units(self, batch: Any) -> float | None:
        """How much ``batch`` weighs in a batch-level mean (``None``: plain sum), for gradient accumulation.

        Counted on the static mask (response mask and finite sampler log-probs): trained tokens for
        ``token_mean``, sequences with a trained token for ``prompt_mean``, all sequences for ``sequence_sum``.
        """
        trained = batch.mask & torch.isfinite(batch.sampler_log_probs)
        if self.aggregation == "token_mean":
            return float(trained.sum())
        if self.aggregation == "prompt_mean":
            return float(trained.any(-1).sum())
        if self.aggregation == "sequence_sum":
            return float(trained.shape[0])
        return None

    def forward(self, batch: Any) -> GRPOLossOutput:
        """Score ``batch`` (a TorchRL TensorDict, or a :class:`~llmrl_core.trainer.batch.PackedBatch`) and return
        the loss terms."""
        from tensordict import TensorDictBase

        if isinstance(batch, TensorDictBase):
            return self._as_output_type(self._forward_tensordict(batch))
        from llmrl_core.trainer.scoring import score_packed

        if self.actor_network is None:
            raise ValueError(f"{type(self).__name__} has no actor_network: pass the model, or call grpo_loss()")
        if batch.missing_sampler:
            raise ValueError(f"GRPO needs sampler_logprobs; missing for samples {batch.missing_sampler}")
        scores = score_packed(self.actor_network, batch, with_entropy=self.entropy_bonus)
        out = grpo_loss(
            scores.log_probs,
            batch.sampler_log_probs,
            batch.advantages,
            batch.mask,
            entropy=scores.entropy,
            ref_log_probs=batch.ref_log_probs,
            old_log_probs=batch.old_log_probs if self.options.get("tis_cap") is not None else None,
            **self.options,
        )
        return self._as_output_type(out)

    def _as_output_type(self, out: GRPOLossOutput) -> LLMLossOutput:
        """``out`` as this loss's TorchRL output class (``DAPOLossOutput`` for :class:`DAPO`, ...)."""
        if type(out) is self.output_type:
            return out
        return self.output_type(**{f.name: getattr(out, f.name) for f in fields(out)})

    def _forward_tensordict(self, td: Any) -> GRPOLossOutput:
        """TorchRL's call: the keys of :mod:`llmrl_core.objectives.tensordict_input`, TorchRL's errors."""
        import llmrl_core.objectives.tensordict_input as tdi

        keys = self.tensor_keys
        if not tdi.has_key(td, keys.action):
            raise ValueError(f"Action key {keys.action} not in tensordict.")
        advantage = tdi.left_padded(td, keys.advantage, 0.0)
        if advantage is None:
            raise ValueError(f"Advantage key {keys.advantage} not in tensordict.")
        tokens, attention = tdi.tokens_and_attention(td, keys.action)
        sampler = tdi.left_padded(td, keys.sample_log_prob, 0.0)
        if sampler is None:
            raise KeyError(f"Couldn't find the log-prob {keys.sample_log_prob} in the input data.")
        if sampler.requires_grad:
            raise RuntimeError(f"tensordict stored {keys.sample_log_prob} requires grad.")
        if sampler.shape != tokens.shape:
            raise ValueError(
                f"Shape mismatch detected in GRPOLoss: current log-prob shape {tuple(tokens.shape)} != previous "
                f"log-prob shape {tuple(sampler.shape)} ({keys.action} and {keys.sample_log_prob} must align)"
            )
        mask = tdi.loss_mask(td, self.masking_strategy, attention, "GRPOLoss")
        log_probs, entropy = tdi.score(
            self.actor_network, tokens, attention, with_entropy=self.entropy_bonus, owner="GRPOLoss"
        )
        ref = None
        if self.options.get("kl_to_ref_coeff"):
            ref = tdi.left_padded(td, keys.ref_log_probs, self.ref_log_prob_padding_value)
            if ref is None:
                raise KeyError(f"GRPOLoss: kl_to_ref_coeff is set but {keys.ref_log_probs} is missing")
        advantage = advantage.float().squeeze(-1) if advantage.shape[-1] == 1 else advantage.float()  # (B,) | (B, T)
        sampler = sampler.to(log_probs.device)
        return grpo_loss(
            log_probs,
            torch.where(attention.to(sampler.device), sampler, torch.full_like(sampler, float("nan"))),
            advantage.to(log_probs.device),
            mask.to(log_probs.device),
            entropy=entropy,
            ref_log_probs=None if ref is None else ref.to(log_probs.device),
            **self.options,
        )


class DAPO(GRPOLoss):
    """DAPO's loss (Yu et al. 2025) under TorchRL's name: :class:`GRPOLoss` with its arguments, returning a
    :class:`DAPOLossOutput`; pass the paper's clip-higher thresholds, ``clip_epsilon=(0.2, 0.28)``. The
    token-level mean (``aggregation="token_mean"``) is already GRPOLoss's default. TorchRL 0.14.1's ``DAPO`` is
    the same (a subclass that changes only the output type)."""

    output_type = DAPOLossOutput


class CISPOLoss(GRPOLoss):
    """CISPO's loss (MiniMax-M1, 2025) under TorchRL's name: :class:`GRPOLoss` with ``objective="cispo"``,
    returning a :class:`CISPOLossOutput`. Its value is TorchRL's ``-clip(w) * A``; its gradient is the paper's
    (every token keeps ``-sg(clip(w)) * A * grad(log pi)``; see the module docstring)."""

    output_type = CISPOLossOutput
    default_objective = "cispo"
