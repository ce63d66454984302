"""The train step the flows call: one optimizer step over a batch of :class:`TrainSample`.

Design:
- The batch is split into packed micro-batches under ``token_budget`` (no padding compute, see
  :mod:`llmrl_core.trainer.batch`); gradients are accumulated over them with weights chosen so that the
  accumulated gradient equals the gradient of the objective over the whole batch (each objective reports its
  ``accumulation_units``: trained tokens for ``token_mean``, sequences for ``prompt_mean``/``mean`` ...).
  Reported diagnostics are token-weighted means over the micro-batches, except ``*_max`` (the maximum).
  With ``kl_mask_threshold`` or ``tis_mode="mask"`` the units are counted before those per-token filters.
- The pass is split into hooks (:meth:`Trainer.accumulate` with an external normaliser ``total_units``,
  :class:`StepTotals` metric totals that merge across ranks, :meth:`Trainer.optimizer_step`) so that
  :mod:`llmrl_core.trainer.data_parallel` runs the same step over several processes.
- AdamW over the trainable parameters (all, or the LoRA adapters), global-norm gradient clipping.
- Dropout is always off (TorchRL advises training in eval mode so that trainer and sampler log-probs agree);
  the model is put in train mode only so that gradient checkpointing engages, with every dropout disabled.
- bf16 autocast on CUDA by default (``mixed_precision="auto"``); opt-in on CPU. Log-softmax is fp32 always.
- Deterministic on CPU for a given ``seed``: the seed fixes LoRA initialisation, and the step has no other
  randomness (no dropout, fixed micro-batch plan).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from llmrl_core.trainer.batch import PackedBatch, TrainSample, pack_samples, plan_micro_batches
from llmrl_core.trainer.lora import LoraOptions, apply_lora, export_adapter, merged_state_dict
from llmrl_core.trainer.scoring import score_packed


@dataclass(frozen=True)
class TrainerConfig:
    """Optimizer and execution settings of :class:`Trainer`."""

    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    max_grad_norm: float | None = 1.0
    token_budget: int = 4096
    mixed_precision: Literal["auto", "bf16", "no"] = "auto"
    gradient_checkpointing: bool = False
    lora: LoraOptions | None = None
    seed: int = 0
    progress: bool = False  # a tqdm bar over the micro-batches of each step (on stderr)


@dataclass
class StepTotals:
    """Unnormalised metric totals of a backward/evaluate pass, mergeable across data-parallel ranks.

    ``sums``/``weights``: per metric key, ``loss_*`` terms are unit-weighted sums (weight 1), ``*_max`` maxima
    (weight 1), other diagnostics sums of ``value * trained tokens`` with the token count as weight.
    ``loss`` is the unit-weighted loss; ``skipped`` is true when the batch had no trained unit at all.
    """

    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    loss: float = 0.0
    num_samples: int = 0
    num_tokens: int = 0
    num_loss_tokens: int = 0
    num_micro_batches: int = 0
    skipped: bool = False

    @classmethod
    def merge(cls, parts: Sequence[StepTotals]) -> StepTotals:
        """The totals of the union of disjoint passes whose ``loss_*`` weights share one normaliser."""
        out = cls(skipped=all(p.skipped for p in parts))
        for part in parts:
            out.loss += part.loss
            out.num_samples += part.num_samples
            out.num_tokens += part.num_tokens
            out.num_loss_tokens += part.num_loss_tokens
            out.num_micro_batches += part.num_micro_batches
            for key, value in part.sums.items():
                if key.startswith("loss_"):
                    out.sums[key] = out.sums.get(key, 0.0) + value
                    out.weights[key] = 1.0
                elif key.endswith("_max"):
                    out.sums[key] = max(out.sums.get(key, -math.inf), value)
                    out.weights[key] = 1.0
                else:
                    out.sums[key] = out.sums.get(key, 0.0) + value
                    out.weights[key] = out.weights.get(key, 0.0) + part.weights[key]
        return out

    def metrics(self) -> dict[str, float]:
        """The reported metrics: the ``loss_*`` terms, token-weighted diagnostics, maxima and batch counts."""
        metrics = {key: self.sums[key] / self.weights[key] if self.weights[key] else 0.0 for key in self.sums}
        metrics.update(
            loss=self.loss,
            num_samples=float(self.num_samples),
            num_tokens=float(self.num_tokens),
            num_loss_tokens=float(self.num_loss_tokens),
            num_micro_batches=float(self.num_micro_batches),
            skipped=float(self.skipped),
        )
        return metrics


def _disable_dropout(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


class Trainer:
    """Owns the policy's optimizer state and runs :meth:`train_step` (resident across iterations).

    Args:
        objective: a :class:`~llmrl_core.objectives.GRPOLoss` or :class:`~llmrl_core.objectives.SFTLoss` whose
            ``actor_network`` is the causal LM to train (wrapped with LoRA here when ``config.lora`` is set).
        config: :class:`TrainerConfig`.
    """

    def __init__(self, objective: nn.Module, config: TrainerConfig | None = None):
        self.config = config or TrainerConfig()
        if self.config.mixed_precision not in ("auto", "bf16", "no"):
            raise ValueError(f"mixed_precision must be 'auto', 'bf16' or 'no', got {self.config.mixed_precision!r}")
        self.objective = objective
        model = objective.actor_network
        if model is None:
            raise ValueError("the objective has no actor_network to train")
        torch.manual_seed(self.config.seed)
        if self.config.lora is not None:
            model = apply_lora(model, self.config.lora)
            objective.actor_network = model
        if self.config.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        _disable_dropout(model)
        model.train()
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=self.config.lr,
            betas=self.config.betas,
            eps=self.config.adam_eps,
            weight_decay=self.config.weight_decay,
        )
        self.device = next(model.parameters()).device
        self.step_count = 0

    def autocast(self) -> contextlib.AbstractContextManager:
        """The compute-dtype context of this trainer's forward passes (bf16 autocast or nothing)."""
        return self._autocast()

    def _autocast(self) -> contextlib.AbstractContextManager:
        mode = self.config.mixed_precision
        if mode == "bf16" or (mode == "auto" and self.device.type == "cuda"):
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def micro_batches(self, samples: Sequence[TrainSample]) -> list[PackedBatch]:
        """The packed micro-batches :meth:`train_step` would run for ``samples``."""
        plan = plan_micro_batches([s.length for s in samples], self.config.token_budget)
        return [pack_samples([samples[i] for i in group]) for group in plan]

    def backward(
        self, samples: Sequence[TrainSample], *, zero_gradient_rows: Sequence[TrainSample] = ()
    ) -> dict[str, float]:
        """Zero the gradients, then accumulate the batch-level objective's gradient over the micro-batches.

        ``zero_gradient_rows`` are rows of the same batch left out because their gradient is zero (no advantage,
        no KL or entropy term): not run, but counted in the batch-level mean's normaliser, so the gradient is the
        one the whole batch gives. Returns the loss metrics (``loss_*`` terms combined with the accumulation
        weights, diagnostics averaged over trained tokens) and the batch counts; no optimizer step.
        """
        return self._run(samples, with_grad=True, zero_gradient_rows=zero_gradient_rows)

    @torch.no_grad()
    def evaluate(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """The metrics :meth:`backward` would report, without gradients (e.g. the loss before/after a step)."""
        return self._run(samples, with_grad=False)

    def _run(
        self, samples: Sequence[TrainSample], with_grad: bool, zero_gradient_rows: Sequence[TrainSample] = ()
    ) -> dict[str, float]:
        if not samples:
            raise ValueError("train_step needs at least one sample")
        batches = self.micro_batches(samples)
        units = self.batch_units(batches)
        total = sum(u for u in units if u is not None) + self.unit_count(zero_gradient_rows)
        return self.accumulate(batches, units, with_grad=with_grad, total_units=total).metrics()

    def batch_units(self, batches: Sequence[PackedBatch]) -> list[float | None]:
        """The objective's ``accumulation_units`` of each micro-batch (``None``: that batch's loss is summed)."""
        return [self.objective.accumulation_units(b) for b in batches]

    def unit_count(self, samples: Sequence[TrainSample]) -> float:
        """The objective's ``accumulation_units`` of ``samples`` in all (packed, not run; 0 for none): what rows
        left out of a step add to its normaliser."""
        if not samples:
            return 0.0
        return sum(u for u in self.batch_units(self.micro_batches(samples)) if u is not None)

    def accumulate(
        self,
        batches: Sequence[PackedBatch],
        units: Sequence[float | None],
        *,
        with_grad: bool,
        total_units: float | None = None,
    ) -> StepTotals:
        """Run the objective on ``batches`` (zeroing the gradients first when ``with_grad``) and backpropagate
        each micro-batch loss scaled by ``unit / total_units`` (1 for a ``None`` unit).

        ``total_units`` is the normaliser of the batch-level mean: by default the sum of ``units`` (these
        micro-batches are the whole batch); a data-parallel step passes the sum over every rank's micro-batches,
        so that the ranks' gradients add up to the gradient over the global batch
        (:mod:`llmrl_core.trainer.data_parallel`). ``batches`` may be empty (a rank with no sample): the
        gradients are then left unset. Returns the unnormalised metric totals (see :class:`StepTotals`).
        """
        if total_units is None:
            total_units = sum(u for u in units if u is not None)
        if with_grad:
            self.optimizer.zero_grad(set_to_none=True)
        totals = StepTotals(
            num_samples=sum(b.num_sequences for b in batches),
            num_tokens=sum(b.num_tokens for b in batches),
            num_loss_tokens=sum(int(b.mask.sum()) for b in batches),
            num_micro_batches=len(batches),
            skipped=total_units == 0 and all(u is not None for u in units),
        )
        sums, weights = totals.sums, totals.weights
        for batch, unit in self._progress(zip(batches, units, strict=True), len(batches), with_grad):
            scale = 1.0 if unit is None else (unit / total_units if total_units else 0.0)
            with self._autocast():
                out = self.objective(batch.to(self.device))
            loss = out.loss
            if loss.ndim != 0:
                raise ValueError("train_step needs a scalar loss: aggregation/reduction 'none' cannot be trained")
            if with_grad:
                (loss * scale).backward()
            totals.loss += float(loss.detach()) * scale
            tokens = float(out.num_tokens) if out.num_tokens is not None else 1.0
            for key, value in out.metrics().items():
                if key.startswith("loss_"):  # already weighted: the batch-level term is the weighted sum
                    sums[key] = sums.get(key, 0.0) + value * scale
                    weights[key] = 1.0
                elif key.endswith("_max"):  # extremes: the max over micro-batches
                    sums[key] = max(sums.get(key, -math.inf), value)
                    weights[key] = 1.0
                elif key != "num_tokens":  # diagnostics: mean over trained tokens
                    sums[key] = sums.get(key, 0.0) + value * tokens
                    weights[key] = weights.get(key, 0.0) + tokens
        return totals

    def _progress(self, items: Any, total: int, with_grad: bool) -> Any:
        if not self.config.progress:
            return items
        from tqdm.auto import tqdm

        desc = f"train step {self.step_count + 1}" if with_grad else "evaluate"
        return tqdm(items, total=total, desc=desc, unit="micro-batch", leave=False)

    def train_step(
        self, samples: Sequence[TrainSample], *, zero_gradient_rows: Sequence[TrainSample] = ()
    ) -> dict[str, float]:
        """One optimizer step on ``samples`` (gradients accumulated over micro-batches); returns metrics.

        ``zero_gradient_rows``: see :meth:`backward`. A batch with no trained token at all (every unit 0, none
        left out) takes no optimizer step (``skipped = 1``).
        """
        start = time.perf_counter()
        return self.optimizer_step(self.backward(samples, zero_gradient_rows=zero_gradient_rows), start)

    def optimizer_step(self, metrics: dict[str, float], start: float) -> dict[str, float]:
        """Clip the accumulated gradients, step the optimizer (unless ``metrics["skipped"]``), zero the gradients.

        ``metrics`` are those of the backward pass that produced the gradients and ``start`` its
        ``time.perf_counter()`` start; returns them with ``grad_norm``, ``lr``, timing and ``step`` added.
        """
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm is not None else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        if not metrics["skipped"]:
            self.optimizer.step()
            self.step_count += 1
        self.optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        metrics.update(
            grad_norm=grad_norm,
            lr=self.optimizer.param_groups[0]["lr"],
            step_time_s=elapsed,
            tokens_per_s=metrics["num_tokens"] / elapsed if elapsed > 0 else 0.0,
            step=float(self.step_count),
        )
        return metrics

    def zero_gradient_step(self) -> dict[str, float]:
        """One optimizer step with every gradient zero: the step a trainer takes on a batch whose rows all have zero
        advantage (no group with signal), as TRL's and every standard loop's ``optimizer.step()`` does after a
        backward pass that gave zeros. AdamW then still moves the weights along its momentum (about ``0.67 x lr``
        per weight after one real step), so skipping the zero-signal rows' compute does not also skip the step.
        A trainer that has taken no step yet has no momentum: the weights stay as they are."""
        start = time.perf_counter()
        for param in self.params:
            param.grad = torch.zeros_like(param)
        self.optimizer.step()
        self.step_count += 1
        self.optimizer.zero_grad(set_to_none=True)
        return {
            "grad_norm": 0.0,
            "lr": self.optimizer.param_groups[0]["lr"],
            "step_time_s": time.perf_counter() - start,
            "step": float(self.step_count),
            "zero_gradient_step": 1.0,
        }

    @torch.no_grad()
    def score(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        """Current per-response-token log-probs (e.g. to fill ``old_logprobs`` before several steps)."""
        out: list[list[float]] = [[] for _ in samples]
        plan = plan_micro_batches([s.length for s in samples], self.config.token_budget)
        for group in plan:
            batch = pack_samples([samples[i] for i in group]).to(self.device)
            with self._autocast():
                scores = score_packed(self.model, batch)
            for row, i in enumerate(group):
                out[i] = scores.log_probs[row, : len(samples[i].response_ids)].float().cpu().tolist()
        return out

    def export_adapter(self, path: str | Path) -> Path:
        """Write the LoRA adapter only (atomic); raises when the trainer has no LoRA."""
        return export_adapter(self.model, path)

    def state_dict_for_inference(self, copy: bool = True) -> dict[str, Any]:
        """Full weights with Hugging Face names (LoRA merged), for checkpoints and pushing into vLLM (``copy``:
        see :func:`~llmrl_core.trainer.lora.merged_state_dict`)."""
        return merged_state_dict(self.model, copy=copy)
