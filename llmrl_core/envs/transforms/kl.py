"""KL-to-reference env transforms (TorchRL names): ``RetrieveLogProb``, ``KLComputation``, ``RetrieveKL``,
``KLRewardTransform``, and the pure functions :func:`token_kl` / :func:`kl_reward_penalty` for flows without an env.

Semantics kept from TorchRL:

* the per-token KL estimate is ``log pi(token) - log pi_ref(token)`` for tokens drawn from ``pi`` (the
  "k1" estimator, unbiased for KL(pi || pi_ref));
* ``assistant_only=True`` counts only the tokens the policy wrote; ``assistant_only=False`` counts every token
  of the conversation (prompt, tool output and template glue included);
* ``RetrieveLogProb`` asks a model (teacher forcing, no generation) for the log-prob of the exact tokens;
  ``KLComputation`` turns two log-prob sequences into the per-token KL stored under ``kl_key`` and, with
  ``add_to_reward=True``, subtracts ``coeff * KL`` from the reward; ``RetrieveKL`` chains the three;
  ``KLRewardTransform`` is the older one-piece form (current log-probs from the sampler, ref from a model).

Where we differ on purpose, and why:

* **Scored window.** TorchRL scores the whole conversation at every step (``("log_probs", "full")``) and
  zeroes non-assistant tokens. Our env gives one reward per slot *per step*, so re-scoring the whole
  conversation each turn would charge earlier turns' tokens again. At each step we score only the tokens that
  are new since the previous response: with ``assistant_only=True`` the latest response's sampled token ids;
  with ``assistant_only=False`` also the tokens before it that no earlier step scored (the prompt at the first
  step, tool output and template glue later; the very first token has no context and is never scored). Summed
  over an episode this is exactly TorchRL's masked sum over the final full sequence. The stored tensors cover
  that window only (no zero padding for masked tokens).
* **The assistant mask** is the env's token bookkeeping (``SlotState.policy_mask``: the ids the sampler drew),
  not the chat template's ``{% generation %}`` mask, so it is exact for any template. Scoring therefore needs
  token ids: tokens mode gives them for the whole conversation; in history/text mode the context is rendered
  with the env's template and tokenizer (``assistant_only=True`` only) and the response ids are the sampled
  ``Response.token_ids`` (re-encoded from the text only if the policy gave none).
* **Reward shape.** TorchRL's reward is per token (``(T, 1)``, assistant-masked) and the KL term is subtracted
  token by token. Our reward is one float per slot per step, so the penalty is the sum over the scored window
  of ``coeff * KL_t``; with a terminal-reward GRPO return (sum of rewards, no discount) this is the same
  quantity. It is added with ``slot.add_reward(-penalty, name=kl_key)``, so ``slot.reward_components[kl_key]``
  holds ``-coeff * sum(KL)``; ``slot.info[kl_key]`` holds the per-token KL (TorchRL's ``kl_key`` entry),
  ``slot.info[kl_key + "_total"]`` its sum and ``slot.info[kl_key + "_tokens"]`` how many tokens counted.
* **Non-finite log-probs** (a sampler that reports ``-inf`` or NaN for a token) are left out of the sums
  instead of turning the reward into NaN.
* **The generating policy's log-probs** can come from the sampler (``"from_sampler"``: ``Response.log_probs``,
  no extra forward pass; TorchRL's closest is ``gen_model="from_collector"``, which re-scores with the
  collector's policy) or from a model. Sampler log-probs are per response token only, so they need
  ``assistant_only=True``. With vLLM's ``processed_logprobs`` they are log-probs at the sampling temperature:
  score the reference with the same ``temperature`` so both sides describe distributions at one temperature.
* **Batching.** Model scoring packs the window of every active slot into padding-free micro-batches under a
  token budget (:func:`~llmrl_core.trainer.batch.plan_micro_batches` + :func:`~llmrl_core.trainer.scoring.
  score_packed`): one forward pass per micro-batch, not per slot. TorchRL pads and runs its wrapper.
* No Ray service variants, no ``in_keys``/``out_keys`` or specs: keys name ``slot.info`` entries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch

from llmrl_core.data.conversation import Conversation
from llmrl_core.envs.transforms.base import Transform
from llmrl_core.envs.types import SlotState
from llmrl_core.trainer.batch import TrainSample, pack_samples, plan_micro_batches
from llmrl_core.trainer.scoring import score_packed

FROM_SAMPLER = "from_sampler"
LogProbSource = Any  # a causal LM (or a wrapper with ``.model``), or the string "from_sampler"

__all__ = [
    "FROM_SAMPLER",
    "KLComputation",
    "KLRewardTransform",
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


# --- RetrieveLogProb ---------------------------------------------------------------------------------
def _unwrap_model(model: Any) -> tuple[Any, Any]:
    """(causal LM, tokenizer or None): a policy wrapper (``TransformersWrapper``) gives its ``.model``."""
    if isinstance(model, torch.nn.Module):
        return model, None
    inner = getattr(model, "model", None)
    if isinstance(inner, torch.nn.Module):
        return inner, getattr(model, "tokenizer", None)
    if callable(model):
        return model, None
    raise TypeError(f"expected a causal LM (torch.nn.Module) or a wrapper with .model, got {type(model).__name__}")


class RetrieveLogProb(Transform):
    """Store a model's (or the sampler's) log-probs of the tokens each active slot added at this step.

    After every step, for each active slot, ``slot.info[log_probs_key]`` becomes a 1-D float tensor with the
    log-prob of each scored token given everything before it. The scored window is described in the module
    docstring: with ``assistant_only=True`` the latest response's sampled ids; with ``assistant_only=False``
    every token that no earlier step scored (tokens mode only).

    Args:
        model: a causal LM (``model(input_ids=..., position_ids=..., use_cache=False, logits_to_keep=...)``, as
            transformers models are), a policy wrapper with such a ``.model`` (``TransformersWrapper``), or
            ``"from_sampler"`` to take ``Response.log_probs`` (no forward pass; needs ``assistant_only=True``).

    Keyword Args:
        log_probs_key: the ``slot.info`` key to write. Defaults to ``"log_probs"``.
        assistant_only: score only the policy's tokens (True, default) or every token (False).
        tokenizer: used in history/text mode to tokenize the rendered context (defaults to the wrapper's or the
            env's tokenizer).
        temperature: logits are divided by it before the log-softmax (match the sampler's temperature when the
            other side of a KL are processed sampler log-probs). Not used with ``"from_sampler"``.
        token_budget: most tokens (context + window) per packed forward pass; a longer slot gets its own pass.
        device: where to run the model; defaults to the device of the model's parameters.
        detach: compute under ``torch.no_grad()`` and store CPU tensors (default True).

    TorchRL's version writes ``(log_probs_key, "full")`` over the whole conversation with zeros on masked
    tokens; ours writes the per-step window (see the module docstring for why).
    """

    def __init__(
        self,
        model: LogProbSource,
        *,
        log_probs_key: str = "log_probs",
        assistant_only: bool = True,
        tokenizer: Any = None,
        temperature: float = 1.0,
        token_budget: int = 8192,
        device: torch.device | str | None = None,
        detach: bool = True,
    ) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        if token_budget <= 0:
            raise ValueError(f"token_budget must be positive, got {token_budget}")
        self.from_sampler = isinstance(model, str)
        if self.from_sampler:
            if model != FROM_SAMPLER:
                raise ValueError(f"model must be a causal LM or {FROM_SAMPLER!r}, got {model!r}")
            if not assistant_only:
                raise ValueError(
                    "log-probs 'from_sampler' exist for the sampled response tokens only: use assistant_only=True, "
                    "or pass a model to score prompt and tool tokens too"
                )
            self.model: Any = None
            wrapper_tokenizer = None
        else:
            self.model, wrapper_tokenizer = _unwrap_model(model)
        self.log_probs_key = log_probs_key
        self.assistant_only = assistant_only
        self.tokenizer = tokenizer if tokenizer is not None else wrapper_tokenizer
        self.temperature = float(temperature)
        self.token_budget = int(token_budget)
        self.device = torch.device(device) if device is not None else None
        self.detach = detach

    # --- token ids -------------------------------------------------------------------------------
    def _tokenizer(self) -> Any:
        tokenizer = self.tokenizer if self.tokenizer is not None else getattr(self.parent, "tokenizer", None)
        if tokenizer is None:
            raise ValueError(
                f"{type(self).__name__}: no token ids in this slot (env not in tokens mode) and no tokenizer to "
                "make them: pass tokenizer=... or use ChatEnv(input_mode='tokens')"
            )
        return tokenizer

    def _response_ids(self, slot: SlotState) -> list[int]:
        response = slot.last_response
        assert response is not None
        if response.token_ids is not None:
            return [int(t) for t in response.token_ids.reshape(-1).tolist()]
        return list(self._tokenizer()(response.text, add_special_tokens=False)["input_ids"])

    def _rendered_context(self, slot: SlotState) -> list[int]:
        """Conversation/text mode: the prompt of the latest response, rendered with the env's template."""
        env = self.parent
        if env is None:
            raise ValueError(
                f"{type(self).__name__}: slot {slot.index} has no token ids; outside an env, fill "
                "slot.token_segments (tokens mode) before scoring"
            )
        role = getattr(env, "policy_role", "assistant")
        messages = slot.history.messages
        last = max((i for i, m in enumerate(messages) if m.role == role), default=None)
        if last is None:
            raise ValueError(f"{type(self).__name__}: slot {slot.index} has no {role!r} message to score")
        render = getattr(env, "_render", None)
        if render is None:
            raise ValueError(f"{type(self).__name__}: {type(env).__name__} cannot render a conversation to tokens")
        text = render(Conversation(list(messages[:last])), add_generation_prompt=True)
        return list(self._tokenizer()(text, add_special_tokens=False)["input_ids"])

    def _window(self, slot: SlotState) -> tuple[list[int], list[int]]:
        """(context ids, window ids): the window is scored given the context and the window tokens before it."""
        response_ids = self._response_ids(slot)
        if slot.token_segments:
            context = [int(t) for t in slot.all_tokens().tolist()]
        elif not self.assistant_only:
            raise ValueError(
                f"{type(self).__name__}(assistant_only=False) needs the conversation's token ids: "
                "use ChatEnv(input_mode='tokens')"
            )
        else:
            context = self._rendered_context(slot)
        if self.assistant_only:
            return context, response_ids
        start = 0
        offset = 0
        for segment, is_policy in zip(slot.token_segments, slot.segment_is_policy, strict=True):
            offset += len(segment)
            if is_policy:
                start = offset
        start = max(start, 1)
        if start > len(context):  # nothing new before the response (cannot happen with ChatEnv's bookkeeping)
            start = len(context)
        return context[:start], context[start:] + response_ids

    # --- scoring ---------------------------------------------------------------------------------
    def _model_device(self) -> torch.device:
        if self.device is not None:
            return self.device
        try:
            return next(self.model.parameters()).device
        except (AttributeError, StopIteration):
            return torch.device("cpu")

    def score(self, rows: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[torch.Tensor]:
        """Log-prob of each window token for ``(context_ids, window_ids)`` rows, packed under the token budget.

        Rows with an empty window get an empty tensor and cost nothing; one forward pass per micro-batch.
        """
        if self.model is None:
            raise RuntimeError("score() needs a model; this transform reads the sampler's log-probs")
        out: list[torch.Tensor] = [torch.empty(0) for _ in rows]
        todo = [i for i, (_, window) in enumerate(rows) if len(window) > 0]
        if not todo:
            return out
        samples = []
        for i in todo:
            context, window = rows[i]
            if len(context) == 0:
                raise ValueError(f"row {i}: a scored token needs at least one token of context before it")
            samples.append(TrainSample(prompt_ids=context, response_ids=window, sample_id=f"row{i}"))
        device = self._model_device()
        grad = torch.no_grad() if self.detach else nullcontext()
        with grad:
            for micro in plan_micro_batches([s.length for s in samples], self.token_budget):
                batch = pack_samples([samples[j] for j in micro]).to(device)
                scores = score_packed(self.model, batch, temperature=self.temperature)
                for row, j in enumerate(micro):
                    lp = scores.log_probs[row, : len(samples[j].response_ids)].float()
                    out[todo[j]] = lp.detach().cpu() if self.detach else lp
        return out

    def on_step(self, slots: list[SlotState]) -> None:
        """Score the latest window of every active slot (batched) and store it in ``slot.info``."""
        scored = [s for s in slots if s.last_response is not None]
        if self.from_sampler:
            for slot in scored:
                slot.info[self.log_probs_key] = self._sampler_log_probs(slot)
            return
        rows = [self._window(slot) for slot in scored]
        for slot, lp in zip(scored, self.score(rows), strict=True):
            slot.info[self.log_probs_key] = lp

    def _sampler_log_probs(self, slot: SlotState) -> torch.Tensor:
        response = slot.last_response
        assert response is not None
        if response.log_probs is None:
            raise ValueError(
                f"{type(self).__name__}('from_sampler'): slot {slot.index}'s response has no log_probs; "
                "sample with log-probs or pass a model to score the response"
            )
        lp = response.log_probs.reshape(-1).float()
        return lp.detach().cpu() if self.detach else lp

    def __repr__(self) -> str:
        source = FROM_SAMPLER if self.from_sampler else type(self.model).__name__
        return (
            f"{type(self).__name__}({source}, log_probs_key={self.log_probs_key!r}, "
            f"assistant_only={self.assistant_only}, temperature={self.temperature})"
        )


# --- KLComputation -----------------------------------------------------------------------------------
class KLComputation(Transform):
    """Per-token KL between two stored log-prob sequences; optionally subtract ``coeff * KL`` from the reward.

    Reads ``slot.info[gen_log_probs_key]`` and ``slot.info[ref_log_probs_key]`` (as written by
    :class:`RetrieveLogProb` at this step; same length), writes ``slot.info[kl_key]`` (per-token KL),
    ``slot.info[kl_key + "_total"]`` (its sum over finite tokens) and ``slot.info[kl_key + "_tokens"]``. With
    ``add_to_reward=True`` the step reward gets ``-coeff * total`` as the component ``kl_key``; with False
    nothing touches the reward and the stored KL / ref log-probs are for a loss term (e.g. ``TrainSample.
    ref_logprobs``). The reward is one float per step, not TorchRL's per-token reward (see the module docstring).
    """

    def __init__(
        self,
        gen_log_probs_key: str = "log_probs",
        ref_log_probs_key: str = "ref_log_probs",
        *,
        kl_key: str = "kl_penalty",
        add_to_reward: bool = True,
        coeff: float = 1.0,
    ) -> None:
        super().__init__()
        if gen_log_probs_key == ref_log_probs_key:
            raise ValueError(f"gen and ref log-prob keys must differ, both are {gen_log_probs_key!r}")
        self.gen_log_probs_key = gen_log_probs_key
        self.ref_log_probs_key = ref_log_probs_key
        self.kl_key = kl_key
        self.add_to_reward = add_to_reward
        self.coeff = float(coeff)

    def step_slot(self, slot: SlotState) -> None:
        """Compute this slot's KL from the stored log-probs (and penalise the reward if asked)."""
        gen = slot.info.get(self.gen_log_probs_key)
        ref = slot.info.get(self.ref_log_probs_key)
        if gen is None or ref is None:
            missing = [k for k, v in ((self.gen_log_probs_key, gen), (self.ref_log_probs_key, ref)) if v is None]
            raise ValueError(
                f"KLComputation: slot {slot.index} has no log-probs under {missing}; put RetrieveLogProb "
                "transforms for both before KLComputation"
            )
        gen_t = _as_float_tensor(gen, self.gen_log_probs_key)
        ref_t = _as_float_tensor(ref, self.ref_log_probs_key)
        if gen_t.shape != ref_t.shape:
            raise ValueError(
                f"KLComputation: slot {slot.index}: {self.gen_log_probs_key!r} has shape {tuple(gen_t.shape)} but "
                f"{self.ref_log_probs_key!r} has {tuple(ref_t.shape)} (same assistant_only on both sides?)"
            )
        kl = token_kl(gen_t, ref_t)
        total, count = _finite_sum(kl)
        slot.info[self.kl_key] = kl
        slot.info[f"{self.kl_key}_total"] = total
        slot.info[f"{self.kl_key}_tokens"] = count
        if self.add_to_reward:
            slot.add_reward(-self.coeff * total, name=self.kl_key)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.gen_log_probs_key!r}, {self.ref_log_probs_key!r}, kl_key={self.kl_key!r}, "
            f"add_to_reward={self.add_to_reward}, coeff={self.coeff})"
        )


# --- RetrieveKL --------------------------------------------------------------------------------------
class RetrieveKL(Transform):
    """``RetrieveLogProb(gen_model)`` + ``RetrieveLogProb(ref_model)`` + ``KLComputation``, run in that order.

    Args:
        gen_model: the generating policy as a scorer (a causal LM or a wrapper with ``.model``), or
            ``"from_sampler"`` (default) to use the sampler's ``Response.log_probs``. TorchRL's default is
            ``"from_collector"`` (re-score with the collector's policy); we have no collector link, and the
            sampler's log-probs are what the sampled tokens were drawn with.
        ref_model: the reference model (required).

    Keyword Args:
        assistant_only, tokenizer, temperature, token_budget, device, detach: passed to both
            :class:`RetrieveLogProb` (``temperature`` only matters for model scoring).
        gen_log_probs_key / ref_log_probs_key: ``slot.info`` keys (``"log_probs"`` / ``"ref_log_probs"``).
        kl_key, add_to_reward, coeff: passed to :class:`KLComputation`.
    """

    def __init__(
        self,
        gen_model: LogProbSource = FROM_SAMPLER,
        ref_model: Any = None,
        *,
        gen_model_factory: Callable[[], Any] | None = None,
        ref_model_factory: Callable[[], Any] | None = None,
        assistant_only: bool = True,
        tokenizer: Any = None,
        temperature: float = 1.0,
        token_budget: int = 8192,
        device: torch.device | str | None = None,
        detach: bool = True,
        gen_log_probs_key: str = "log_probs",
        ref_log_probs_key: str = "ref_log_probs",
        kl_key: str = "kl_penalty",
        add_to_reward: bool = True,
        coeff: float = 1.0,
    ) -> None:
        super().__init__()
        if gen_model_factory is not None:
            if gen_model is not None and gen_model != FROM_SAMPLER:
                raise ValueError("pass gen_model or gen_model_factory, not both")
            gen_model = gen_model_factory()
        if ref_model_factory is not None:
            if ref_model is not None:
                raise ValueError("pass ref_model or ref_model_factory, not both")
            ref_model = ref_model_factory()
        if ref_model is None or isinstance(ref_model, str):
            raise ValueError("RetrieveKL needs a reference model (ref_model or ref_model_factory)")
        if gen_log_probs_key == ref_log_probs_key:
            raise ValueError(f"gen and ref log-prob keys must differ, both are {gen_log_probs_key!r}")
        common = dict(
            assistant_only=assistant_only,
            tokenizer=tokenizer,
            temperature=temperature,
            token_budget=token_budget,
            device=device,
            detach=detach,
        )
        self.transforms: list[Transform] = [
            RetrieveLogProb(gen_model, log_probs_key=gen_log_probs_key, **common),  # type: ignore[arg-type]
            RetrieveLogProb(ref_model, log_probs_key=ref_log_probs_key, **common),  # type: ignore[arg-type]
            KLComputation(
                gen_log_probs_key, ref_log_probs_key, kl_key=kl_key, add_to_reward=add_to_reward, coeff=coeff
            ),
        ]

    @property
    def kl_computation(self) -> KLComputation:
        """The :class:`KLComputation` step (its ``coeff`` may be changed between steps, e.g. by a KL controller)."""
        return self.transforms[-1]  # type: ignore[return-value]

    def set_parent(self, env: Any) -> None:
        """Attach this transform and its three parts to ``env``."""
        super().set_parent(env)
        for transform in self.transforms:
            transform.set_parent(env)

    def on_reset(self, slots: list[SlotState]) -> None:
        """Forward the reset to the parts (they keep no per-episode state)."""
        for transform in self.transforms:
            transform.on_reset(slots)

    def on_step(self, slots: list[SlotState]) -> None:
        """Gen log-probs, ref log-probs, then the KL (and reward penalty), for all active slots."""
        for transform in self.transforms:
            transform.on_step(slots)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(t) for t in self.transforms)})"


# --- KLRewardTransform -------------------------------------------------------------------------------
class KLRewardTransform(RetrieveKL):
    """TorchRL's older one-piece KL reward: ``reward -= coef * (log pi - log pi_ref)`` on the sampled tokens.

    The current policy's log-probs are the sampler's (``Response.log_probs``, as TorchRL reads the log-probs the
    policy wrote during generation), the reference's come from ``ref_model``; both are stored in ``slot.info``
    (``"log_probs"`` / ``"ref_log_probs"``) with the KL under ``"kl_penalty"``, like TorchRL's out keys. Because
    sampler log-probs exist only for sampled tokens, ``assistant_only`` must be True; use :class:`RetrieveKL`
    with a ``gen_model`` to count prompt and tool tokens too. Keyword ``coef`` keeps TorchRL's spelling.
    """

    def __init__(
        self,
        ref_model: Any = None,
        *,
        ref_model_factory: Callable[[], Any] | None = None,
        coef: float = 1.0,
        add_to_reward: bool = True,
        assistant_only: bool = True,
        tokenizer: Any = None,
        temperature: float = 1.0,
        token_budget: int = 8192,
        device: torch.device | str | None = None,
        log_probs_key: str = "log_probs",
        ref_log_probs_key: str = "ref_log_probs",
        kl_key: str = "kl_penalty",
    ) -> None:
        if not assistant_only:
            raise ValueError("KLRewardTransform reads the sampler's log-probs: assistant_only must be True")
        super().__init__(
            FROM_SAMPLER,
            ref_model,
            ref_model_factory=ref_model_factory,
            assistant_only=True,
            tokenizer=tokenizer,
            temperature=temperature,
            token_budget=token_budget,
            device=device,
            gen_log_probs_key=log_probs_key,
            ref_log_probs_key=ref_log_probs_key,
            kl_key=kl_key,
            add_to_reward=add_to_reward,
            coeff=coef,
        )

    @property
    def coef(self) -> float:
        """The KL coefficient (TorchRL's name); settable."""
        return self.kl_computation.coeff

    @coef.setter
    def coef(self, value: float) -> None:
        self.kl_computation.coeff = float(value)
