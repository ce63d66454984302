"""Train-step inputs: one :class:`TrainSample` per response, packed into padding-free micro-batches.

Packing: the samples of a micro-batch are concatenated into a single row (batch size 1). Position ids
restart at 0 for every sample; with no 2-D attention mask and no KV cache, transformers reads the position
ids as a packed-sequence layout and builds a block-diagonal causal mask (``find_packed_sequence_indices``
for sdpa/eager, the varlen kernels for flash-attention), so attention never crosses a sample boundary and no
compute is spent on padding. Only the logits that predict response tokens are computed
(``logits_to_keep`` with an index tensor); the per-token results are then scattered into small padded
``(B, T_response)`` tensors that the objectives consume (padding there costs no model compute).

Micro-batches are planned with first-fit-decreasing bin packing on the sample lengths (prompt + response)
under a token budget; a sample longer than the budget gets a micro-batch of its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch


def _as_list(name: str, value: object, where: str) -> list:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().reshape(-1).tolist()
    try:
        return list(value)  # type: ignore[call-overload]
    except TypeError as err:
        raise TypeError(f"{where}: field {name!r} must be a sequence, got {type(value).__name__}") from err


@dataclass
class TrainSample:
    """One sampled response, as the train step consumes it (built from one trajectory row).

    Attributes:
        prompt_ids: token ids of everything before the response (at least one token).
        response_ids: token ids of the response (may include tool-output tokens in multi-turn rollouts).
        response_mask: per response token, True where the token is trained on (assistant tokens), False for
            tool/user tokens; defaults to all True.
        sampler_logprobs: per response token, the sampler's log-prob of the token (NaN where unknown: that
            token is excluded from the GRPO loss). Required by GRPO, unused by SFT.
        advantage: one float for the whole response, or one per response token.
        ref_logprobs: per response token, the reference model's log-prob (for KL to the reference).
        old_logprobs: per response token, the trainer's log-prob under the behaviour policy (for the
            truncated importance-sampling correction with several optimizer steps per batch).
        sample_id: a label used in error messages (e.g. ``"run/v3/prompt17#2"``).
        temperature: the sampling temperature whose distribution ``sampler_logprobs`` describe (vLLM's
            processed log-probs); the trainer divides this sample's logits by it, so both sides score the
            same policy. 1.0 for the model's raw distribution (and for rows whose log-probs were raw).
    """

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    response_mask: Sequence[bool] | None = None
    sampler_logprobs: Sequence[float] | None = None
    advantage: float | Sequence[float] = 0.0
    ref_logprobs: Sequence[float] | None = None
    old_logprobs: Sequence[float] | None = None
    sample_id: str = "?"
    temperature: float = 1.0

    def __post_init__(self) -> None:
        where = f"TrainSample {self.sample_id}"
        self.temperature = float(self.temperature)
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"{where}: field 'temperature' must be a finite number > 0, got {self.temperature}")
        self.prompt_ids = [int(t) for t in _as_list("prompt_ids", self.prompt_ids, where)]
        self.response_ids = [int(t) for t in _as_list("response_ids", self.response_ids, where)]
        if not self.prompt_ids:
            raise ValueError(f"{where}: field 'prompt_ids' is empty (a response needs at least one prompt token)")
        n = len(self.response_ids)
        if self.response_mask is None:
            self.response_mask = [True] * n
        else:
            self.response_mask = [bool(m) for m in _as_list("response_mask", self.response_mask, where)]
        for name in ("response_mask", "sampler_logprobs", "ref_logprobs", "old_logprobs"):
            value = getattr(self, name)
            if value is None:
                continue
            if name != "response_mask":
                value = [float(x) for x in _as_list(name, value, where)]
                setattr(self, name, value)
            if len(value) != n:
                raise ValueError(f"{where}: field {name!r} has {len(value)} entries, response_ids has {n}")
        if isinstance(self.advantage, int | float):
            if not math.isfinite(float(self.advantage)):
                raise ValueError(f"{where}: field 'advantage' is not finite ({self.advantage})")
            self.advantage = float(self.advantage)
        else:
            adv = [float(x) for x in _as_list("advantage", self.advantage, where)]
            if len(adv) != n:
                raise ValueError(f"{where}: field 'advantage' has {len(adv)} entries, response_ids has {n}")
            if not all(math.isfinite(a) for a in adv):
                raise ValueError(f"{where}: field 'advantage' has non-finite entries")
            self.advantage = adv

    @property
    def length(self) -> int:
        """Total number of tokens the model reads for this sample (prompt + response)."""
        return len(self.prompt_ids) + len(self.response_ids)

    @classmethod
    def from_row(cls, row: Mapping[str, object], row_label: str | None = None) -> TrainSample:
        """Build a sample from a trajectory row (``prompt_tokens``, ``response_tokens``, ``response_mask``,
        ``sampler_logprobs``, ``ref_logprobs``, ``advantage``); missing optional fields are left empty."""
        label = row_label or "/".join(str(row[k]) for k in ("run_id", "prompt_id", "sample_index") if k in row) or "?"
        for required in ("prompt_tokens", "response_tokens"):
            if row.get(required) is None:
                raise ValueError(f"trajectory row {label}: missing field {required!r}")
        advantage = row.get("advantage")
        return cls(
            prompt_ids=row["prompt_tokens"],  # type: ignore[arg-type]
            response_ids=row["response_tokens"],  # type: ignore[arg-type]
            response_mask=row.get("response_mask"),  # type: ignore[arg-type]
            sampler_logprobs=row.get("sampler_logprobs"),  # type: ignore[arg-type]
            advantage=0.0 if advantage is None else advantage,  # type: ignore[arg-type]
            ref_logprobs=row.get("ref_logprobs"),  # type: ignore[arg-type]
            sample_id=label,
        )


def plan_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Group sample indices into micro-batches whose total length fits ``token_budget``.

    First-fit decreasing (deterministic: ties keep input order); indices inside a micro-batch are sorted.
    A sample longer than the budget forms a micro-batch of its own.
    """
    if token_budget <= 0:
        raise ValueError(f"token_budget must be positive, got {token_budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(token_budget - lengths[i])
    return [sorted(b) for b in bins]


@dataclass
class PackedBatch:
    """Samples concatenated into one row, plus padded ``(B, T)`` per-response-token tensors.

    ``logit_positions[j]`` is the packed position whose logits predict ``targets[j]``, the response token that
    lands at ``(rows[j], cols[j])`` of the ``(B, T)`` tensors; ``temperatures[j]`` is the temperature its
    logits are divided by (its sample's ``temperature``; ``None`` when every sample has 1.0).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    logit_positions: torch.Tensor
    targets: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    mask: torch.Tensor
    sampler_log_probs: torch.Tensor
    advantages: torch.Tensor
    ref_log_probs: torch.Tensor | None
    old_log_probs: torch.Tensor | None
    temperatures: torch.Tensor | None = None
    sample_ids: list[str] = field(default_factory=list)
    missing_sampler: list[str] = field(default_factory=list)

    @property
    def num_sequences(self) -> int:
        """Number of samples in the batch (rows of the padded tensors)."""
        return self.mask.shape[0]

    @property
    def num_tokens(self) -> int:
        """Number of tokens the model reads (prompt + response, no padding)."""
        return self.input_ids.shape[1]

    def to(self, device: torch.device | str) -> PackedBatch:
        """A copy with every tensor on ``device``."""
        moved = {
            k: (v.to(device) if isinstance(v, torch.Tensor) else v)
            for k, v in self.__dict__.items()
            if k not in ("sample_ids", "missing_sampler")
        }
        return PackedBatch(**moved, sample_ids=list(self.sample_ids), missing_sampler=list(self.missing_sampler))


def _padded(values: list[list[float] | None], width: int, fill: float) -> torch.Tensor:
    out = torch.full((len(values), width), fill, dtype=torch.float32)
    for i, row in enumerate(values):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def pack_samples(samples: Sequence[TrainSample]) -> PackedBatch:
    """Concatenate ``samples`` into one packed row (see the module docstring)."""
    if not samples:
        raise ValueError("pack_samples needs at least one sample")
    width = max(1, max(len(s.response_ids) for s in samples))
    ids: list[int] = []
    positions: list[int] = []
    logit_positions: list[int] = []
    targets: list[int] = []
    temperatures: list[float] = []
    rows: list[int] = []
    cols: list[int] = []
    mask = torch.zeros(len(samples), width, dtype=torch.bool)
    for b, s in enumerate(samples):
        start, p, r = len(ids), len(s.prompt_ids), len(s.response_ids)
        ids.extend(s.prompt_ids)
        ids.extend(s.response_ids)
        positions.extend(range(p + r))
        logit_positions.extend(range(start + p - 1, start + p + r - 1))
        targets.extend(s.response_ids)
        temperatures.extend([s.temperature] * r)
        rows.extend([b] * r)
        cols.extend(range(r))
        if r:
            mask[b, :r] = torch.tensor(s.response_mask, dtype=torch.bool)
    advantages = torch.zeros(len(samples), width)
    for b, s in enumerate(samples):
        if isinstance(s.advantage, float):
            advantages[b] = s.advantage
        elif s.advantage:
            advantages[b, : len(s.advantage)] = torch.tensor(s.advantage)
    has_ref = any(s.ref_logprobs is not None for s in samples)
    has_old = any(s.old_logprobs is not None for s in samples)
    if has_ref and not all(s.ref_logprobs is not None for s in samples):
        missing = [s.sample_id for s in samples if s.ref_logprobs is None]
        raise ValueError(f"ref_logprobs given for some samples but missing for {missing}")
    if has_old and not all(s.old_logprobs is not None for s in samples):
        missing = [s.sample_id for s in samples if s.old_logprobs is None]
        raise ValueError(f"old_logprobs given for some samples but missing for {missing}")
    return PackedBatch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([positions], dtype=torch.long),
        logit_positions=torch.tensor(logit_positions, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long),
        rows=torch.tensor(rows, dtype=torch.long),
        cols=torch.tensor(cols, dtype=torch.long),
        mask=mask,
        sampler_log_probs=_padded([s.sampler_logprobs for s in samples], width, math.nan),
        advantages=advantages,
        ref_log_probs=_padded([s.ref_logprobs for s in samples], width, 0.0) if has_ref else None,
        old_log_probs=_padded([s.old_logprobs for s in samples], width, 0.0) if has_old else None,
        temperatures=None if all(t == 1.0 for t in temperatures) else torch.tensor(temperatures, dtype=torch.float32),
        sample_ids=[s.sample_id for s in samples],
        missing_sampler=[s.sample_id for s in samples if s.sampler_logprobs is None],
    )
