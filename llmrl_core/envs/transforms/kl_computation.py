"""TorchRL's ``KLComputation``: per-token KL between two log-prob entries, optionally subtracted from a per-token
reward (part of :mod:`llmrl_core.envs.transforms.kl`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, lazy_stack
from tensordict.utils import NestedKey

from llmrl_core.envs.transforms.kl_math import as_float_tensor
from llmrl_core.envs.transforms.kl_rows import (
    is_dense,
    lazy_rows,
    rows_of,
    write_rows,
)
from llmrl_core.envs.transforms.td_base import Transform, forward_as_step, in_chat_env


# --- KLComputation -----------------------------------------------------------------------------------
def _one_of(name: str, value: Any, alias: str, alias_value: Any, default: Any) -> Any:
    """``value`` unless the documented ``alias`` was given (a conflicting explicit ``value`` is a TypeError)."""
    if alias_value is None:
        return value
    if value != default and value != alias_value:
        raise TypeError(f"got both {name}={value!r} and {alias}={alias_value!r}; pass one of them")
    return alias_value


class KLComputation(Transform):
    """Per-token KL between two log-prob entries, optionally subtracted from a per-token reward.

    Args:
        gen_log_probs_full_key: the generating policy's log-probs; default ``("log_probs", "full")``
            (also accepted as ``gen_log_probs_key``, the documented spelling).
        ref_log_probs_full_key: the reference model's log-probs; default ``("ref_log_probs", "full")``
            (also ``ref_log_probs_key``).

    Keyword Args:
        kl_key: where the KL ``gen - ref`` is written (default ``"kl_penalty"``).
        add_to_reward: subtract ``coeff * kl`` from ``"reward"`` (shape ``(T, 1)`` per sample) when present. In a
            ``ChatEnv`` (appended to it, alone or inside ``RetrieveKL``) the env's reward, one value per answer
            ``(B, 1)``, is spread over the tokens first; elsewhere a reward with as many dimensions as the KL is
            refused as TorchRL refuses it.
        coeff: the KL coefficient (default 1.0; also accepted as ``coef``).
        padding_side: kept for TorchRL compatibility.

    Both log-prob entries must have the same layout and per-sample shapes (``ValueError`` otherwise). With
    ``(B, T)`` inputs the KL is ``(B, T)``; with one tensor per sample it is one tensor per sample.
    """

    def __init__(
        self,
        gen_log_probs_full_key: NestedKey = ("log_probs", "full"),
        ref_log_probs_full_key: NestedKey = ("ref_log_probs", "full"),
        *,
        kl_key: NestedKey = "kl_penalty",
        add_to_reward: bool = True,
        coeff: float = 1.0,
        padding_side: str = "left",
        gen_log_probs_key: NestedKey | None = None,
        ref_log_probs_key: NestedKey | None = None,
        coef: float | None = None,
    ) -> None:
        gen_key = _one_of(
            "gen_log_probs_full_key",
            gen_log_probs_full_key,
            "gen_log_probs_key",
            gen_log_probs_key,
            ("log_probs", "full"),
        )
        ref_key = _one_of(
            "ref_log_probs_full_key",
            ref_log_probs_full_key,
            "ref_log_probs_key",
            ref_log_probs_key,
            ("ref_log_probs", "full"),
        )
        coeff = _one_of("coeff", coeff, "coef", coef, 1.0)
        in_keys = [gen_key, ref_key]
        out_keys = [kl_key]
        if add_to_reward:
            in_keys.append("reward")
            out_keys.append("reward")
        super().__init__(in_keys=in_keys, out_keys=out_keys)
        self.gen_log_probs_full_key = gen_key
        self.ref_log_probs_full_key = ref_key
        self.kl_key = kl_key
        self.add_to_reward = add_to_reward
        self.coeff = coeff
        self.padding_side = padding_side

    # the documented attribute names
    @property
    def gen_log_probs_key(self) -> NestedKey:
        return self.gen_log_probs_full_key

    @property
    def ref_log_probs_key(self) -> NestedKey:
        return self.ref_log_probs_full_key

    @property
    def coef(self) -> float:
        return self.coeff

    @coef.setter
    def coef(self, value: float) -> None:
        self.coeff = value

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return forward_as_step(self, tensordict)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        gen = next_tensordict.get(self.gen_log_probs_full_key, None, as_list=True)
        ref = next_tensordict.get(self.ref_log_probs_full_key, None, as_list=True)
        if gen is None or ref is None:
            raise ValueError(
                f"Log-probs not found. Expected keys: {self.gen_log_probs_full_key}, {self.ref_log_probs_full_key}"
            )
        gen_rows, ref_rows = rows_of(gen), rows_of(ref)
        if len(gen_rows) != len(ref_rows):
            raise ValueError(
                f"Batch size mismatch: gen_log_probs has {len(gen_rows)} samples, "
                f"ref_log_probs has {len(ref_rows)} samples"
            )
        for i, (g, r) in enumerate(zip(gen_rows, ref_rows, strict=True)):
            if g.shape != r.shape:
                raise ValueError(
                    f"Sample {i} has different shapes: gen_log_probs[{i}].shape={g.shape}, "
                    f"ref_log_probs[{i}].shape={r.shape}"
                )
        dense = is_dense(gen) and is_dense(ref)
        kl_rows = [g - r.to(g.device) for g, r in zip(gen_rows, ref_rows, strict=True)]
        if dense:
            kl = gen - ref.to(gen.device)
            next_tensordict.set(self.kl_key, kl)
        else:
            write_rows(next_tensordict, self.kl_key, kl_rows)
        if self.add_to_reward and "reward" in next_tensordict.keys():
            reward = next_tensordict.get("reward", as_list=True)
            if is_dense(reward) and reward.ndim == 2 and reward.shape[-1] == 1 and in_chat_env(self):
                # a ChatEnv's reward: one value per answer (B, 1), spread over the tokens as TorchRL's reward
                # parsers' (B, 1, 1) is (each token: the answer's reward minus its KL)
                reward = reward.unsqueeze(-1)
            if dense and is_dense(reward):
                if reward.ndim != kl.ndim + 1:
                    raise ValueError(
                        f"The rewards have shape {reward.shape} but the kl has shape {kl.shape}. "
                        "The rewards should have one more dimension than the KL."
                    )
                next_tensordict.set("reward", reward - self.coeff * kl.unsqueeze(-1))
            else:
                reward_rows = rows_of(reward)
                if reward_rows and reward_rows[0].ndim != kl_rows[0].ndim + 1:
                    raise ValueError(
                        f"The rewards have shape {reward_rows[0].shape} but the kl has shape {kl_rows[0].shape}. "
                        "The rewards should have one more dimension than the KL."
                    )
                new = [r - self.coeff * k.to(r.device).unsqueeze(-1) for r, k in zip(reward_rows, kl_rows, strict=True)]
                if "reward" in next_tensordict.keys() and lazy_rows(next_tensordict) is None:
                    next_tensordict.del_("reward")
                write_rows(next_tensordict, "reward", new)
        return next_tensordict

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(gen_log_probs_full_key={self.gen_log_probs_full_key}, "
            f"ref_log_probs_full_key={self.ref_log_probs_full_key}, kl_key={self.kl_key!r}, "
            f"add_to_reward={self.add_to_reward}, coeff={self.coeff})"
        )


def kl_penalties(
    transform: KLComputation,
    log_probs: Sequence[Sequence[float] | torch.Tensor],
    ref_log_probs: Sequence[Sequence[float] | torch.Tensor],
    masks: Sequence[Sequence[bool] | torch.Tensor | None] | None = None,
) -> list[float]:
    """What each stored row's return loses to its KL with ``train.kl_in=reward``: ``transform`` (a ``KLComputation``)
    runs on the rows' tokens (``masks``: the response tokens; ``None`` entries read as NaN) with a reward of 0 per
    token, and the penalty is minus the sum of the rewards it leaves (``coeff * sum(log_probs - ref_log_probs)`` for
    TorchRL's). Tokens whose KL is not finite (an unknown or ``-inf`` log-prob) are left out."""
    rows = []
    for i, (lp_values, ref_values) in enumerate(zip(log_probs, ref_log_probs, strict=True)):
        lp, ref = as_float_tensor(lp_values, "log_probs"), as_float_tensor(ref_values, "ref_log_probs")
        if lp.shape != ref.shape:
            raise ValueError(f"row {i}: log_probs {tuple(lp.shape)} and ref_log_probs {tuple(ref.shape)} differ")
        keep = torch.isfinite(lp - ref)
        mask = masks[i] if masks is not None else None
        if mask is not None:
            keep &= torch.as_tensor(list(mask) if not isinstance(mask, torch.Tensor) else mask, dtype=torch.bool)
        data = {("log_probs", "full"): lp[keep], ("ref_log_probs", "full"): ref[keep]}
        rows.append(TensorDict({**data, "reward": torch.zeros(int(keep.sum()), 1)}))
    if not rows:
        return []
    out = transform(lazy_stack(rows))
    return [-float(reward.double().sum()) for reward in out.get("reward", as_list=True)]
