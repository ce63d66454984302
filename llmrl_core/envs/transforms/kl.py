"""KL-to-reference transforms on TensorDicts (TorchRL's ``torchrl.envs.llm.transforms.kl``), and the pure
functions :func:`token_kl` / :func:`kl_reward_penalty` the flows use without an env.

* :class:`RetrieveLogProb` asks a scoring policy wrapper (``generate=False``) for the log-prob of every token of
  the full conversation and stores them under ``log_probs_full_key`` (zero on non-assistant tokens with
  ``assistant_only=True``);
* :class:`KLComputation` turns two such per-token log-prob entries into the per-token KL estimate
  ``log pi - log pi_ref`` (the "k1" estimator, unbiased for KL(pi || pi_ref) on tokens drawn from ``pi``) under
  ``kl_key`` and, with ``add_to_reward=True``, subtracts ``coeff * kl`` token by token from a ``(T, 1)`` reward;
* :class:`RetrieveKL` chains two :class:`RetrieveLogProb` and a :class:`KLComputation`; its default
  ``gen_model="from_collector"`` builds the scoring copy of the collector's policy on first use;
* :class:`KLRewardTransform` is TorchRL's older one-piece form: the current log-probs are read from the data,
  the reference ones come from ``ref_model`` (tokens mode), and the reward becomes ``(T, 1)``.

Each is called as TorchRL's: ``transform(td)`` (``forward``) works on ``td["next"]`` when it exists and on
``td`` otherwise; inside an env, ``_step(td, next_td)`` reads the action data from ``td`` and writes into
``next_td``. Per-token outputs are ``(B, T)`` tensors when the log-probs are padded (``pad_output=True``) and one
tensor per sample otherwise (read them with ``td.get(key, as_list=True)``).

Where llmrl differs from TorchRL 0.14.1 (its own documentation is the spec where TorchRL fails its examples):

* :class:`KLComputation` also accepts the documented ``gen_log_probs_key`` / ``ref_log_probs_key`` / ``coef``
  spellings, and on padded ``(B, T)`` inputs stores a ``(B, T)`` KL (``kl.shape`` works; TorchRL stores a strided
  nested tensor without a shape and fails to subtract it from a dense reward);
* :class:`KLRewardTransform` used outside an env reads the action from ``(ref_model.input_mode, "full")``
  (TorchRL needs a parent env), and also takes the documented legacy form ``KLRewardTransform(gen_model,
  ref_model)`` (TorchRL: ``TypeError``), where ``gen_model`` scores the current log-probs if the data lacks them;
* ``detach=True`` computes the log-probs without an autograd graph; ``use_ray_service=True`` returns the
  Dask-hosted variant (``RayRetrieveKL`` / ``RayKLRewardTransform`` of :mod:`llmrl_core.envs.transforms.kl_hosted`);
* no specs are modelled (``transform_*_spec`` return their argument).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, Literal

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase, is_tensorclass, lazy_stack, unravel_key
from tensordict.utils import NestedKey
from torch.nn.utils.rnn import pad_sequence

from llmrl_core.envs.transforms.td_base import Compose, Transform, set_missing_tolerance

__all__ = [
    "KLComputation",
    "KLRewardTransform",
    "RayKLRewardTransform",
    "RayRetrieveKL",
    "RetrieveKL",
    "RetrieveLogProb",
    "kl_reward_penalty",
    "token_kl",
]


# --- pure functions ----------------------------------------------------------------------------------
def _as_float_tensor(values: Sequence[float] | torch.Tensor, name: str) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        tensor = values
    else:  # None (an unknown log-prob, e.g. a null in a stored row) becomes NaN, which the sums leave out
        tensor = torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)
    if not tensor.is_floating_point():
        tensor = tensor.float()
    if tensor.ndim == 0:
        raise ValueError(f"{name} must be a sequence of per-token values, got a scalar")
    return tensor


def token_kl(
    log_probs: Sequence[float] | torch.Tensor,
    ref_log_probs: Sequence[float] | torch.Tensor,
    mask: Sequence[bool] | torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate ``log_probs - ref_log_probs`` (0 where ``mask`` is False).

    Inputs have one entry per token (any matching shape; ``None`` entries read as NaN); ``mask`` None counts every
    token. Non-finite entries inside the mask are returned as they are (NaN / inf) so callers can see them;
    :func:`kl_reward_penalty` leaves them out.
    """
    lp = _as_float_tensor(log_probs, "log_probs")
    ref = _as_float_tensor(ref_log_probs, "ref_log_probs").to(lp.device)
    if lp.shape != ref.shape:
        raise ValueError(f"log_probs {tuple(lp.shape)} and ref_log_probs {tuple(ref.shape)} must have the same shape")
    kl = lp - ref
    if mask is not None:
        m = mask if isinstance(mask, torch.Tensor) else torch.as_tensor(list(mask), dtype=torch.bool)
        m = m.to(device=kl.device, dtype=torch.bool)
        if m.shape != kl.shape:
            raise ValueError(f"mask {tuple(m.shape)} must have the shape of the log-probs {tuple(kl.shape)}")
        kl = torch.where(m, kl, torch.zeros_like(kl))
    return kl


def _finite_sum(kl: torch.Tensor) -> tuple[float, int]:
    finite = torch.isfinite(kl)
    return float(kl.detach().double()[finite].sum()), int(finite.sum())


def kl_reward_penalty(
    log_probs: Sequence[float] | torch.Tensor,
    ref_log_probs: Sequence[float] | torch.Tensor,
    mask: Sequence[bool] | torch.Tensor | None = None,
    coeff: float = 1.0,
) -> float:
    """``coeff * sum(log_probs - ref_log_probs)`` over the masked tokens whose KL is finite.

    The amount a KL-penalised reward loses (subtract it); the sum over a response of TorchRL's per-token
    ``coeff * kl`` reward term.
    """
    total, _ = _finite_sum(token_kl(log_probs, ref_log_probs, mask))
    return float(coeff) * total


# --- ragged / padded per-token entries ---------------------------------------------------------------
def _rows(value: Any) -> list[torch.Tensor]:
    """One tensor per sample from what ``td.get(key, as_list=True)`` returned (list, nested or dense)."""
    if isinstance(value, torch.Tensor):
        return list(value.unbind(0))
    return list(value)


def _is_dense(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not value.is_nested


def _lazy_rows(td: Any) -> LazyStackedTensorDict | None:
    inner = td._tensordict if is_tensorclass(td) else td
    if isinstance(inner, LazyStackedTensorDict) and inner.stack_dim == 0:
        return inner
    return None


def _write_rows(td: TensorDictBase, key: NestedKey, rows: list[torch.Tensor]) -> None:
    """Store one tensor per sample under ``key`` so that ``td.get(key, as_list=True)`` gives them back.

    A lazily stacked TensorDict (or sub-TensorDict) gets one entry per stacked element; a dense parent is turned
    into a lazy stack of its rows; a top-level key of a dense TensorDict gets a dense tensor when the rows have
    one shape and a jagged nested tensor otherwise.
    """
    key = unravel_key(key)
    lazy = _lazy_rows(td)
    if lazy is not None:
        for sub, row in zip(lazy.tensordicts, rows, strict=True):
            sub.set(key, row)
        return
    if isinstance(key, tuple) and len(key) > 1:
        parent = td.get(key[:-1], None)
        if parent is not None:
            lazy = _lazy_rows(parent)
            if lazy is None:
                inner = parent._tensordict if is_tensorclass(parent) else parent
                lazy = lazy_stack(list(inner.unbind(0)))
                td.set(key[:-1], type(parent)._from_tensordict(lazy) if is_tensorclass(parent) else lazy)
        else:
            lazy = lazy_stack([TensorDict(batch_size=td.batch_size[1:]) for _ in rows])
            td.set(key[:-1], lazy)
        for sub, row in zip(lazy.tensordicts, rows, strict=True):
            sub.set(key[-1], row)
        return
    if len({tuple(r.shape) for r in rows}) <= 1:
        td.set(key, torch.stack(rows) if rows else torch.empty(0))
    else:
        td.set(key, torch.nested.as_nested_tensor(rows, layout=torch.jagged))


def _pad(rows: list[torch.Tensor], padding_side: str) -> torch.Tensor:
    return pad_sequence(rows, batch_first=True, padding_value=0.0, padding_side=padding_side)


def _check_full_key(name: str, key: Any) -> None:
    if not isinstance(key, tuple) or key[-1] != "full":
        raise ValueError(
            f"The {name} {key} is not a tuple or does not end with 'full'. "
            "This may cause issues with the KL computation. "
            "Please use a tuple with the log_probs_key and 'full' as the last element."
        )


def _on_device(td: TensorDictBase, device: torch.device | None) -> TensorDictBase:
    return td.to(device) if device is not None else td


# --- RetrieveLogProb ---------------------------------------------------------------------------------
class RetrieveLogProb(Transform):
    """Store a scoring model's per-token log-probs of the full conversation.

    Args:
        model: a policy wrapper with ``generate=False`` and ``return_log_probs=True``
            (:class:`~llmrl_core.modules.policies.TransformersWrapper` or
            :class:`~llmrl_core.modules.policies.vLLMWrapper`).

    Keyword Args:
        log_probs_full_key: where the log-probs are written; default ``(model.log_probs_key, "full")`` (a key that
            is not a tuple ending in ``"full"`` gets a warning).
        assistant_only: zero the log-probs of non-assistant tokens (default True; needs ``input_mode="history"``,
            which gives the assistant mask).
        tokenizer_kwargs: chat-template arguments (defaults as TorchRL's; the model's own settings tokenize).
        detach: compute without an autograd graph (default True).
        device: the model is moved there, and incoming TensorDicts are moved there for the call.
        tokenizer: kept for TorchRL compatibility (the model's tokenizer is used).
        padding_side: padding side of the stored log-probs when the model pads its output (default ``"left"``).

    ``transform(td)`` scores ``td`` and writes into ``td["next"]`` when it exists, else into ``td``.
    """

    def __init__(
        self,
        model: Any,
        *,
        log_probs_full_key: NestedKey | None = None,
        assistant_only: bool = True,
        tokenizer_kwargs: dict | None = None,
        detach: bool = True,
        device: torch.device | None = None,
        tokenizer: Any = None,
        padding_side: str = "left",
    ) -> None:
        if log_probs_full_key is None:
            log_probs_full_key = (model.log_probs_key, "full")
        elif not isinstance(log_probs_full_key, tuple) or log_probs_full_key[-1] != "full":
            warnings.warn(
                f"The log_probs_full_key {log_probs_full_key} is not a tuple or does not end with 'full'. "
                "This may cause issues with the KL computation. "
                "Please use a tuple with the log_probs_key and 'full' as the last element.",
                stacklevel=2,
            )
        self.log_probs_full_key = log_probs_full_key
        super().__init__(in_keys=list(model.in_keys), out_keys=[log_probs_full_key])
        self._io_device = None
        if device is not None:
            model = model.to(device)
            self._io_device = torch.device(device)
        self.model = model
        self.assistant_only = assistant_only
        self.detach = detach
        self.tokenizer = tokenizer
        self.padding_side = padding_side
        tokenizer_kwargs = dict(tokenizer_kwargs or {})
        tokenizer_kwargs.setdefault("return_assistant_tokens_mask", True)
        tokenizer_kwargs.setdefault("tokenize", True)
        tokenizer_kwargs.setdefault("return_dict", True)
        tokenizer_kwargs.setdefault("padding", False)
        tokenizer_kwargs.setdefault("add_generation_prompt", False)
        self.tokenizer_kwargs = tokenizer_kwargs
        self._validate_model_config(model)

    @property
    def device(self) -> torch.device | None:
        """Where incoming TensorDicts are moved for the call (the constructor's ``device``)."""
        return self._io_device

    def _validate_model_config(self, model: Any) -> None:
        if not getattr(model, "return_log_probs", True):
            raise ValueError("The model must have `return_log_probs=True` to use the `RetrieveLogProb` transform.")
        if getattr(model, "generate", True):
            raise ValueError("The model must have `generate=False` to use the `RetrieveLogProb` transform.")
        input_mode = getattr(model, "input_mode", "history")
        if self.assistant_only and input_mode != "history":
            raise ValueError(
                f"The model must have `input_mode='history'` when `assistant_only=True`. "
                f"Current input_mode is '{input_mode}'. "
                f"To use input_mode '{input_mode}', set `assistant_only=False`."
            )

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        next_td = tensordict.get("next", None)
        if next_td is None:
            return self._step(tensordict, tensordict)
        return tensordict.set("next", self._step(tensordict, next_td))

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        original_device = tensordict.device if self._io_device is not None else None
        tensordict = _on_device(tensordict, self._io_device)
        next_tensordict = _on_device(next_tensordict, self._io_device)
        with torch.no_grad() if self.detach else nullcontext():
            scored = self.model(tensordict.copy())
        model_key = (self.model.log_probs_key, "full")
        log_probs = _rows(scored.get(model_key, as_list=True))
        if self.assistant_only:
            masks = scored.get(("masks", "all_assistant_mask"), None, as_list=True)
            if masks is None:
                raise ValueError(
                    "assistant_only=True needs the assistant mask ('masks', 'all_assistant_mask') from the model "
                    "(input_mode='history')"
                )
            log_probs = [
                lp.masked_fill(~m.bool().to(lp.device), 0.0) for lp, m in zip(log_probs, _rows(masks), strict=True)
            ]
        if self.detach:
            log_probs = [lp.detach() for lp in log_probs]
        target = unravel_key(self.log_probs_full_key)
        if (
            isinstance(target, tuple)
            and len(target) == 2
            and target[0] == unravel_key(self.model.log_probs_key)
            and target[0] not in next_tensordict.keys()
        ):
            # the model's own container (LogProbs: prompt / response / full / padded) moves over, as in TorchRL
            next_tensordict.set(target[0], scored.get(target[0]))
        if self.model.pad_output:
            next_tensordict.set(target, _pad(log_probs, self.padding_side))
        else:
            _write_rows(next_tensordict, target, log_probs)
        if original_device is not None:
            next_tensordict = next_tensordict.to(original_device)
        return next_tensordict

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(log_probs_full_key={self.log_probs_full_key}, "
            f"assistant_only={self.assistant_only}, model={type(self.model).__name__})"
        )


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
        add_to_reward: subtract ``coeff * kl`` from ``"reward"`` (shape ``(T, 1)`` per sample) when present.
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
        next_td = tensordict.get("next", None)
        if next_td is None:
            return self._step(tensordict, tensordict)
        return tensordict.set("next", self._step(tensordict, next_td))

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        gen = next_tensordict.get(self.gen_log_probs_full_key, None, as_list=True)
        ref = next_tensordict.get(self.ref_log_probs_full_key, None, as_list=True)
        if gen is None or ref is None:
            raise ValueError(
                f"Log-probs not found. Expected keys: {self.gen_log_probs_full_key}, {self.ref_log_probs_full_key}"
            )
        gen_rows, ref_rows = _rows(gen), _rows(ref)
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
        dense = _is_dense(gen) and _is_dense(ref)
        kl_rows = [g - r.to(g.device) for g, r in zip(gen_rows, ref_rows, strict=True)]
        if dense:
            kl = gen - ref.to(gen.device)
            next_tensordict.set(self.kl_key, kl)
        else:
            _write_rows(next_tensordict, self.kl_key, kl_rows)
        if self.add_to_reward and "reward" in next_tensordict.keys():
            reward = next_tensordict.get("reward", as_list=True)
            if dense and _is_dense(reward):
                if reward.ndim != kl.ndim + 1:
                    raise ValueError(
                        f"The rewards have shape {reward.shape} but the kl has shape {kl.shape}. "
                        "The rewards should have one more dimension than the KL."
                    )
                next_tensordict.set("reward", reward - self.coeff * kl.unsqueeze(-1))
            else:
                reward_rows = _rows(reward)
                if reward_rows and reward_rows[0].ndim != kl_rows[0].ndim + 1:
                    raise ValueError(
                        f"The rewards have shape {reward_rows[0].shape} but the kl has shape {kl_rows[0].shape}. "
                        "The rewards should have one more dimension than the KL."
                    )
                new = [r - self.coeff * k.to(r.device).unsqueeze(-1) for r, k in zip(reward_rows, kl_rows, strict=True)]
                if "reward" in next_tensordict.keys() and _lazy_rows(next_tensordict) is None:
                    next_tensordict.del_("reward")
                _write_rows(next_tensordict, "reward", new)
        return next_tensordict

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(gen_log_probs_full_key={self.gen_log_probs_full_key}, "
            f"ref_log_probs_full_key={self.ref_log_probs_full_key}, kl_key={self.kl_key!r}, "
            f"add_to_reward={self.add_to_reward}, coeff={self.coeff})"
        )


# --- use_ray_service -----------------------------------------------------------------------------------
class _HostedVariant:
    """``Cls(..., use_ray_service=True)`` returns ``RayCls(...)``, the Dask-hosted variant of
    :mod:`llmrl_core.envs.transforms.kl_hosted`, as TorchRL's metaclass returns its Ray-hosted one."""

    def __new__(cls, *args: Any, use_ray_service: bool = False, **kwargs: Any) -> Any:
        if use_ray_service:
            hosted = {"KLRewardTransform": RayKLRewardTransform, "RetrieveKL": RayRetrieveKL}.get(cls.__name__)
            if hosted is None:
                raise ValueError(f"{cls.__name__}(use_ray_service=True): there is no hosted Ray{cls.__name__}")
            return hosted(*args, **kwargs)
        return super().__new__(cls)


# --- RetrieveKL --------------------------------------------------------------------------------------


class RetrieveKL(_HostedVariant, Compose):
    """The KL between a generating and a reference model: two :class:`RetrieveLogProb` and a :class:`KLComputation`.

    Args:
        gen_model: the generating policy as a scoring wrapper (``generate=False``, ``return_log_probs=True``), or
            ``"from_collector"`` (default): on first use, the collector's policy (``self.collector.policy``)
            gives one with ``get_new_version(generate=False, ...)``.
        ref_model: the reference model, a scoring wrapper with another ``log_probs_key``.

    Keyword Args:
        gen_model_factory / ref_model_factory: callables building the models instead.
        assistant_only, tokenizer_kwargs, detach, device, tokenizer, padding_side: passed to both
            :class:`RetrieveLogProb` (``device`` places the models).
        history_key: kept for TorchRL compatibility.
        gen_log_probs_full_key / ref_log_probs_full_key: where the two log-probs are written (defaults
            ``("log_probs", "full")`` and ``("ref_log_probs", "full")``).
        kl_key, add_to_reward, coeff: passed to :class:`KLComputation`.
        use_ray_service: build the Dask-hosted ``RayRetrieveKL`` (same arguments) instead.
        **kwargs: passed to both :class:`RetrieveLogProb`.

    Both models must have the same ``pad_output`` (``ValueError`` otherwise).
    """

    def __init__(
        self,
        gen_model: Any | Literal["from_collector"] = "from_collector",
        ref_model: Any = None,
        *,
        gen_model_factory: Callable[[], Any] | None = None,
        ref_model_factory: Callable[[], Any] | None = None,
        assistant_only: bool = True,
        history_key: str = "history",
        tokenizer_kwargs: dict[str, Any] | None = None,
        detach: bool = True,
        device: torch.device | None = None,
        tokenizer: Any = None,
        padding_side: str = "left",
        gen_log_probs_full_key: NestedKey = ("log_probs", "full"),
        ref_log_probs_full_key: NestedKey = ("ref_log_probs", "full"),
        kl_key: NestedKey = "kl_penalty",
        add_to_reward: bool = True,
        coeff: float = 1.0,
        use_ray_service: bool = False,
        **kwargs: Any,
    ) -> None:
        if gen_model_factory is not None:
            if gen_model is not None and not (isinstance(gen_model, str) and gen_model == "from_collector"):
                raise ValueError("Cannot provide both 'gen_model' and 'gen_model_factory'. Choose one.")
            gen_model = gen_model_factory()
        if ref_model_factory is not None:
            if ref_model is not None:
                raise ValueError("Cannot provide both 'ref_model' and 'ref_model_factory'. Choose one.")
            ref_model = ref_model_factory()
        if isinstance(gen_model, str) and gen_model == "from_collector":
            self._initialized = False
            self._init_params = {
                "ref_model": ref_model,
                "assistant_only": assistant_only,
                "history_key": history_key,
                "tokenizer_kwargs": tokenizer_kwargs,
                "detach": detach,
                "device": device,
                "tokenizer": tokenizer,
                "gen_log_probs_full_key": gen_log_probs_full_key,
                "ref_log_probs_full_key": ref_log_probs_full_key,
                "kl_key": kl_key,
                "add_to_reward": add_to_reward,
                "coeff": coeff,
                "padding_side": padding_side,
                **kwargs,
            }
            super().__init__()
            return
        self._initialized = True
        if hasattr(gen_model, "pad_output") and hasattr(ref_model, "pad_output"):
            if gen_model.pad_output != ref_model.pad_output:
                raise ValueError(
                    f"pad_output mismatch: gen_model.pad_output={gen_model.pad_output}, "
                    f"ref_model.pad_output={ref_model.pad_output}. "
                    "Both models must use the same padding strategy for KL computation."
                )
        if not getattr(gen_model, "return_log_probs", True):
            raise ValueError(
                "The generation model must have `return_log_probs=True` to use the `RetrieveKL` transform."
            )
        if getattr(gen_model, "generate", False):
            raise ValueError("The generation model must have `generate=False` to use the `RetrieveKL` transform.")
        if not getattr(ref_model, "return_log_probs", True):
            raise ValueError("The reference model must have `return_log_probs=True` to use the `RetrieveKL` transform.")
        if getattr(ref_model, "generate", False):
            raise ValueError("The reference model must have `generate=False` to use the `RetrieveKL` transform.")
        if getattr(gen_model, "log_probs_key", "gen_log_probs") == getattr(ref_model, "log_probs_key", "log_probs"):
            raise ValueError(
                "The generation and reference models must have different `log_prob_key` values to use the "
                "`RetrieveKL` transform."
            )
        if gen_model is None:
            raise ValueError("gen_model cannot be None when not using 'from_collector'")
        if ref_model is None:
            raise ValueError("ref_model cannot be None")
        common = dict(
            assistant_only=assistant_only,
            tokenizer_kwargs=tokenizer_kwargs,
            detach=detach,
            device=device,
            tokenizer=tokenizer,
            padding_side=padding_side,
            **kwargs,
        )
        super().__init__(
            RetrieveLogProb(gen_model, log_probs_full_key=gen_log_probs_full_key, **common),
            RetrieveLogProb(ref_model, log_probs_full_key=ref_log_probs_full_key, **common),
            KLComputation(
                gen_log_probs_full_key,
                ref_log_probs_full_key,
                kl_key=kl_key,
                add_to_reward=add_to_reward,
                coeff=coeff,
            ),
        )

    @property
    def kl_computation(self) -> KLComputation:
        """The :class:`KLComputation` step (its ``coeff`` may be changed between steps)."""
        self._ensure_initialized()
        return self.transforms[-1]  # type: ignore[return-value]

    def _init_deferred(self) -> None:
        """Build the parts once the container (env) and its collector are known (``gen_model="from_collector"``)."""
        if self.container is None:
            raise ValueError("The container is not set. Please set the container before calling this method.")
        collector = self.collector
        if collector is None:
            raise ValueError("The collector is not set. Please set the collector before calling this method.")
        params = dict(self._init_params)
        ref_model = params.pop("ref_model")
        if ref_model is None:
            raise ValueError("ref_model cannot be None")
        gen_key = params.pop("gen_log_probs_full_key")
        _check_full_key("gen_log_probs_full_key", gen_key)
        gen_model = collector.policy.get_new_version(
            generate=False,
            return_log_probs=True,
            log_probs_key=gen_key[:-1] if len(gen_key) > 2 else gen_key[0],
            input_mode=ref_model.input_mode,
            input_key=(ref_model.input_mode, "full"),
            pad_output=getattr(ref_model, "pad_output", False),
        )
        ref_key = params.pop("ref_log_probs_full_key")
        _check_full_key("ref_log_probs_full_key", ref_key)
        kl_key, add_to_reward, coeff = params.pop("kl_key"), params.pop("add_to_reward"), params.pop("coeff")
        params.pop("history_key", None)
        for transform in (
            RetrieveLogProb(gen_model, log_probs_full_key=gen_key, **params),
            RetrieveLogProb(ref_model, log_probs_full_key=ref_key, **params),
            KLComputation(gen_key, ref_key, kl_key=kl_key, add_to_reward=add_to_reward, coeff=coeff),
        ):
            self.append(transform)
        del self._init_params
        self._initialized = True

    def _ensure_initialized(self) -> None:
        if not self._initialized:
            self._init_deferred()

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        self._ensure_initialized()
        return super()._step(tensordict, next_tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        self._ensure_initialized()
        return super()._reset(tensordict, tensordict_reset)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._ensure_initialized()
        return super().forward(tensordict)

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._ensure_initialized()
        return super()._inv_call(tensordict)


# --- KLRewardTransform -------------------------------------------------------------------------------
class KLRewardTransform(_HostedVariant, Transform):
    """TorchRL's legacy one-piece KL reward: ``reward - coef * (log pi - log pi_ref)`` per token.

    The current policy's log-probs are read from the data (``log_prob_key``, written by the generating wrapper);
    the reference log-probs come from ``ref_model``, a scoring wrapper in tokens mode. With ``assistant_only``
    only assistant tokens count (``("masks", "all_assistant_mask")``, or every token after the prompt when the
    data has no assistant mask). The reward becomes ``(T, 1)`` per sample; the KL and the reference log-probs
    (also ``(T, 1)``) are written under the second and third ``out_keys`` (``"kl_penalty"``, ``"ref_log_probs"``).

    Args:
        ref_model: the reference model (``generate=False``, ``input_mode="tokens"``). The documented legacy call
            ``KLRewardTransform(gen_model, ref_model)`` is accepted: then both models may use any input mode, and
            ``gen_model`` computes the current log-probs when the data has none.

    Keyword Args:
        ref_model_factory: a callable building the reference model instead.
        coef: the KL coefficient (default 1.0; a buffer, settable).
        in_keys / out_keys: ``["reward"]`` / ``["reward", "kl_penalty", "ref_log_probs"]`` by default.
        log_prob_key: the current log-probs (default ``("log_probs", "full")``).
        device: where the data is moved for the computation.
        add_to_reward: subtract the KL term from the reward (default True).
        tokenizer: the tokenizer (default: the reference model's).
        assistant_only: count only assistant tokens (default True).
        padding_side: padding side of padded outputs (default ``"left"``).
        use_ray_service: build the Dask-hosted ``RayKLRewardTransform`` (same arguments) instead.
        detach / actor_name: documented by TorchRL, accepted (the computation never builds a graph).
    """

    DEFAULT_IN_KEYS = ["reward"]

    def __init__(
        self,
        ref_model: Any = None,
        *legacy_ref_model: Any,
        ref_model_factory: Callable[[], Any] | None = None,
        coef: float = 1.0,
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        log_prob_key: NestedKey = ("log_probs", "full"),
        device: torch.device | None = None,
        add_to_reward: bool = True,
        tokenizer: Any = None,
        assistant_only: bool = True,
        padding_side: str = "left",
        use_ray_service: bool = False,
        detach: bool = True,
        actor_name: str | None = None,
    ) -> None:
        if len(legacy_ref_model) > 1:
            raise TypeError(
                f"KLRewardTransform takes at most 2 positional arguments ({1 + len(legacy_ref_model)} given)"
            )
        gen_model = None
        if legacy_ref_model:  # the documented legacy call KLRewardTransform(gen_model, ref_model)
            gen_model, ref_model = ref_model, legacy_ref_model[0]
        if ref_model_factory is not None:
            if ref_model is not None:
                raise ValueError("Cannot provide both 'ref_model' and 'ref_model_factory'. Choose one.")
            ref_model = ref_model_factory()
        elif ref_model is None:
            raise ValueError("Must provide exactly one of 'ref_model' or 'ref_model_factory'.")
        if in_keys is None:
            in_keys = list(self.DEFAULT_IN_KEYS)
        if out_keys is None:
            out_keys = list(in_keys)
        in_keys, out_keys = list(in_keys), list(out_keys)
        if len(out_keys) == len(in_keys):
            out_keys = out_keys + ["kl_penalty", "ref_log_probs"]
        elif len(out_keys) != len(in_keys) + 2:
            raise ValueError(
                "The out_keys must have the same length as the in_keys (plus two additional optional kl entries "
                "for logging)."
            )
        super().__init__(in_keys=in_keys, out_keys=out_keys)
        if len(self.in_keys) != 1 or len(self.out_keys) != 3:
            raise ValueError(
                f"Only one in_key/out_key is allowed, got in_keys={self.in_keys}, out_keys={self.out_keys}."
            )
        if getattr(ref_model, "generate", False):
            raise ValueError("The actor is configured to generate text, not compute the log-probs.")
        self.in_keys = self.in_keys + [unravel_key(k) for k in getattr(ref_model, "in_keys", [])]
        self.add_to_reward = add_to_reward
        self.__dict__["ref_model"] = ref_model  # not a sub-module, as in TorchRL
        self.__dict__["gen_model"] = gen_model
        self.device = torch.device(device) if device is not None else None
        self.log_prob_full_key = log_prob_key
        self._tokenizer = tokenizer
        self.assistant_only = assistant_only
        self.padding_side = padding_side
        self.detach = detach
        self.actor_name = actor_name
        self.register_buffer("coef", coef if isinstance(coef, torch.Tensor) else torch.as_tensor(coef))
        if gen_model is None and getattr(ref_model, "input_mode", "tokens") != "tokens":
            raise ValueError(
                "The ref_model must be configured to use tokens as input. Please set the `input_mode` argument "
                "to `tokens`."
            )

    @property
    def pad_output(self) -> bool:
        """Whether the reference model pads its output (the KL entries follow it)."""
        return bool(self.ref_model.pad_output)

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is not None:
            return self._tokenizer
        try:
            return self.ref_model.tokenizer
        except AttributeError as err:
            raise AttributeError(
                "The ref_model does not have a tokenizer. Please pass the tokenizer to the constructor."
            ) from err

    @property
    def action_key(self) -> NestedKey:
        """The full sequence of the action: ``(input_mode, "full")`` of the env (of the ref model outside one)."""
        parent = self.parent
        env = getattr(parent, "base_env", parent)
        input_mode = getattr(env, "input_mode", None) if env is not None else None
        if input_mode is None:
            input_mode = getattr(self.ref_model, "input_mode", "tokens")
        if input_mode not in ("history", "text", "tokens"):
            raise ValueError(f"Invalid input mode: {input_mode}")
        return (input_mode, "full")

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        next_td = tensordict.pop("next")
        return tensordict.set("next", self._step(tensordict, next_td))

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        with set_missing_tolerance(self, True):
            return self._step(tensordict_reset, tensordict_reset)

    def _masked(self, rows: list[torch.Tensor], mask: list[torch.Tensor] | None) -> list[torch.Tensor]:
        if mask is None:
            return rows
        return [r.masked_fill(~m.bool().to(r.device), 0.0) for r, m in zip(rows, mask, strict=True)]

    def _assistant_mask(self, tensordict: TensorDictBase, scored: TensorDictBase) -> list[torch.Tensor] | None:
        if not self.assistant_only:
            return None
        for source in (tensordict, scored):
            mask = source.get(("masks", "all_assistant_mask"), None, as_list=True)
            if mask is not None:
                return _rows(mask)
        prompt = tensordict.get(("tokens", "prompt"), None, as_list=True)
        attention = tensordict.get(("masks", "all_attention_mask"), None, as_list=True)
        if prompt is None or attention is None:
            raise ValueError(
                "assistant_only=True needs ('masks', 'all_assistant_mask') or ('tokens', 'prompt') with "
                "('masks', 'all_attention_mask') in the data"
            )
        if self.pad_output and _is_dense(prompt):
            prompt_lengths = [prompt.shape[-1]] * len(_rows(attention))
        else:
            prompt_lengths = [p.shape[-1] for p in _rows(prompt)]
        out = []
        for length, row in zip(prompt_lengths, _rows(attention), strict=True):
            row = row.clone().bool()
            row[..., :length] = False
            out.append(row)
        return out

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        original_device = tensordict.device if self.device is not None else None
        tensordict = _on_device(tensordict, self.device)
        next_tensordict = _on_device(next_tensordict, self.device)
        if unravel_key(self.action_key) not in tensordict.keys(True):
            if not self.missing_tolerance:
                raise RuntimeError(f"Action with key {self.action_key} not found data {tensordict}")
            return next_tensordict
        with torch.no_grad():
            scored = self.ref_model(tensordict.copy())
        ref_rows = [r.detach() for r in _rows(scored.get(self.ref_model_log_probs_key, as_list=True))]
        mask = self._assistant_mask(tensordict, scored)
        ref_rows = self._masked(ref_rows, mask)
        curr = tensordict.get(self.log_prob_full_key, None, as_list=True)
        if curr is None and self.gen_model is not None:
            with torch.no_grad():
                generated = self.gen_model(tensordict.copy())
            curr = generated.get((self.gen_model.log_probs_key, "full"), as_list=True)
        if curr is None:
            raise ValueError(f"The current log-probs {self.log_prob_full_key} are not in the data")
        curr_rows = self._masked([c.detach() for c in _rows(curr)], mask)
        ref_rows = [r.to(c.device).unsqueeze(-1) for r, c in zip(ref_rows, curr_rows, strict=True)]
        curr_rows = [c.unsqueeze(-1) for c in curr_rows]
        for r, c in zip(ref_rows, curr_rows, strict=True):
            if r.shape != c.shape:
                raise ValueError(
                    f"the log-probability tensor shapes must match, got cur_log_prob.shape={c.shape} and "
                    f"log_prob.shape={r.shape}. One possible reason is that the padding token is identical to the "
                    "eos token, which means that the eos_token log_prob is truncated from the reference model output."
                )
        kl_rows = [c - r for c, r in zip(curr_rows, ref_rows, strict=True)]
        reward_key, kl_key, ref_key = self.out_keys
        if self.add_to_reward:
            reward = next_tensordict.get(self.in_keys[0], None, as_list=True)
            if reward is None:
                reward_rows = [torch.zeros_like(k) for k in kl_rows]
            else:
                reward_rows = _rows(reward)
                if not self.pad_output and all(r.ndim == k.ndim - 1 for r, k in zip(reward_rows, kl_rows, strict=True)):
                    # one reward per sample: spread over the tokens, as TorchRL does for unpadded log-probs
                    reward_rows = [r.expand(k.shape) for r, k in zip(reward_rows, kl_rows, strict=True)]
                for r, k in zip(reward_rows, kl_rows, strict=True):
                    if r.ndim != k.ndim:
                        raise ValueError(
                            "The number of dimensions of reward must be the same as the number of dimensions of "
                            f"the KL term. Got ndim={r.ndim + 1} and {k.ndim + 1} respectively."
                        )
            new_reward = [r - self.coef.to(k.device) * k for r, k in zip(reward_rows, kl_rows, strict=True)]
            self._write(next_tensordict, reward_key, new_reward, replace=True)
        self._write(next_tensordict, kl_key, kl_rows)
        self._write(next_tensordict, ref_key, ref_rows)
        if original_device is not None:
            next_tensordict = next_tensordict.to(original_device)
        return next_tensordict

    @property
    def ref_model_log_probs_key(self) -> NestedKey:
        return (getattr(self.ref_model, "log_probs_key", "log_probs"), "full")

    def _write(self, td: TensorDictBase, key: NestedKey, rows: list[torch.Tensor], replace: bool = False) -> None:
        if self.pad_output:
            td.set(key, pad_sequence(rows, batch_first=True, padding_value=0.0, padding_side=self.padding_side))
            return
        if replace and _lazy_rows(td) is None and unravel_key(key) in td.keys(True):
            td.del_(key)
        _write_rows(td, key, rows)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(coef={float(self.coef)}, in_keys={self.in_keys}, out_keys={self.out_keys})"


# TorchRL defines the Ray-hosted variants in this module; llmrl's (hosted on Dask) live in kl_hosted
from llmrl_core.envs.transforms.kl_hosted import RayKLRewardTransform, RayRetrieveKL  # noqa: E402
