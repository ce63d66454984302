"""KL-to-reference transforms on TensorDicts (TorchRL's ``torchrl.envs.llm.transforms.kl``), and the pure
functions :func:`token_kl` / :func:`kl_reward_penalty` the flows use without an env (modules ``log_prob``,
``kl_computation``, ``kl_math``; this one composes them and exports all).

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

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from tensordict import TensorDictBase, unravel_key
from tensordict.utils import NestedKey
from torch.nn.utils.rnn import pad_sequence

import llmrl_core.envs.transforms.kl_rows as kl_rows
from llmrl_core.envs.transforms.kl_computation import KLComputation, kl_penalties
from llmrl_core.envs.transforms.kl_math import token_kl
from llmrl_core.envs.transforms.kl_models import check_kl_models, gen_model_from_collector
from llmrl_core.envs.transforms.log_prob import RetrieveLogProb
from llmrl_core.envs.transforms.td_base import Compose, Transform, in_chat_env, set_missing_tolerance

__all__ = [
    "KLComputation",
    "KLRewardTransform",
    "RayKLRewardTransform",
    "RayRetrieveKL",
    "RetrieveKL",
    "RetrieveLogProb",
    "kl_penalties",
    "token_kl",
]


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
        check_kl_models(gen_model, ref_model)
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
        kl_rows.check_full_key("gen_log_probs_full_key", gen_key)
        gen_model = gen_model_from_collector(collector, ref_model, gen_key)
        ref_key = params.pop("ref_log_probs_full_key")
        kl_rows.check_full_key("ref_log_probs_full_key", ref_key)
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
                return kl_rows.rows_of(mask)
        prompt = tensordict.get(("tokens", "prompt"), None, as_list=True)
        attention = tensordict.get(("masks", "all_attention_mask"), None, as_list=True)
        if prompt is None or attention is None:
            raise ValueError(
                "assistant_only=True needs ('masks', 'all_assistant_mask') or ('tokens', 'prompt') with "
                "('masks', 'all_attention_mask') in the data"
            )
        if self.pad_output and kl_rows.is_dense(prompt):
            prompt_lengths = [prompt.shape[-1]] * len(kl_rows.rows_of(attention))
        else:
            prompt_lengths = [p.shape[-1] for p in kl_rows.rows_of(prompt)]
        out = []
        for length, row in zip(prompt_lengths, kl_rows.rows_of(attention), strict=True):
            row = row.clone().bool()
            row[..., :length] = False
            out.append(row)
        return out

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        original_device = tensordict.device if self.device is not None else None
        tensordict = kl_rows.on_device(tensordict, self.device)
        next_tensordict = kl_rows.on_device(next_tensordict, self.device)
        if unravel_key(self.action_key) not in tensordict.keys(True):
            if not self.missing_tolerance:
                raise RuntimeError(f"Action with key {self.action_key} not found data {tensordict}")
            return next_tensordict
        with torch.no_grad():
            scored = self.ref_model(tensordict.copy())
        ref_rows = [r.detach() for r in kl_rows.rows_of(scored.get(self.ref_model_log_probs_key, as_list=True))]
        mask = self._assistant_mask(tensordict, scored)
        ref_rows = self._masked(ref_rows, mask)
        curr = tensordict.get(self.log_prob_full_key, None, as_list=True)
        if curr is None and self.gen_model is not None:
            with torch.no_grad():
                generated = self.gen_model(tensordict.copy())
            curr = generated.get((self.gen_model.log_probs_key, "full"), as_list=True)
        if curr is None:
            raise ValueError(f"The current log-probs {self.log_prob_full_key} are not in the data")
        curr_rows = self._masked([c.detach() for c in kl_rows.rows_of(curr)], mask)
        ref_rows = [r.to(c.device).unsqueeze(-1) for r, c in zip(ref_rows, curr_rows, strict=True)]
        curr_rows = [c.unsqueeze(-1) for c in curr_rows]
        for r, c in zip(ref_rows, curr_rows, strict=True):
            if r.shape != c.shape:
                raise ValueError(
                    f"the log-probability tensor shapes must match, got cur_log_prob.shape={c.shape} and "
                    f"log_prob.shape={r.shape}. One possible reason is that the padding token is identical to the "
                    "eos token, which means that the eos_token log_prob is truncated from the reference model output."
                )
        token_kl_rows = [c - r for c, r in zip(curr_rows, ref_rows, strict=True)]
        reward_key, kl_key, ref_key = self.out_keys
        if self.add_to_reward:
            reward = next_tensordict.get(self.in_keys[0], None, as_list=True)
            if reward is None:
                reward_rows = [torch.zeros_like(k) for k in token_kl_rows]
            else:
                reward_rows = kl_rows.rows_of(reward)
                if (not self.pad_output or in_chat_env(self)) and all(
                    r.ndim == k.ndim - 1 for r, k in zip(reward_rows, token_kl_rows, strict=True)
                ):
                    # one reward per sample: spread over the tokens, as TorchRL does for unpadded log-probs (and
                    # for a ChatEnv's reward, one value per answer, whatever the padding)
                    reward_rows = [r.expand(k.shape) for r, k in zip(reward_rows, token_kl_rows, strict=True)]
                for r, k in zip(reward_rows, token_kl_rows, strict=True):
                    if r.ndim != k.ndim:
                        raise ValueError(
                            "The number of dimensions of reward must be the same as the number of dimensions of "
                            f"the KL term. Got ndim={r.ndim + 1} and {k.ndim + 1} respectively."
                        )
            new_reward = [r - self.coef.to(k.device) * k for r, k in zip(reward_rows, token_kl_rows, strict=True)]
            self._write(next_tensordict, reward_key, new_reward, replace=True)
        self._write(next_tensordict, kl_key, token_kl_rows)
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
        if replace and kl_rows.lazy_rows(td) is None and unravel_key(key) in td.keys(True):
            td.del_(key)
        kl_rows.write_rows(td, key, rows)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(coef={float(self.coef)}, in_keys={self.in_keys}, out_keys={self.out_keys})"


# TorchRL defines the Ray-hosted variants in this module; llmrl's (hosted on Dask) live in kl_hosted
from llmrl_core.envs.transforms.kl_hosted import RayKLRewardTransform, RayRetrieveKL  # noqa: E402
