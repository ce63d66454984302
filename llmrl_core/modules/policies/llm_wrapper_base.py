"""``LLMWrapperBase``: what TorchRL's LLM policy wrappers share, on TensorDicts.

A wrapper reads its input from a TensorDict — ``("history", "prompt")`` / ``("text", "prompt")`` /
``("tokens", "prompt")`` when it generates, the ``"full"`` entry when it only scores — and writes TorchRL's
output containers: ``text`` (:class:`Text`), ``tokens`` (:class:`Tokens`), ``masks`` (:class:`Masks`),
``log_probs`` (:class:`LogProbs`) and, in history mode, ``history`` (:class:`ChatHistory`).

Layouts, as in TorchRL:

* ``pad_output=False``: one tensor per sample (a lazy stack), read with ``td.get(key, as_list=True)``;
* ``pad_output=True``: ``(B, T)`` tensors. Prompts and teacher-forced ``full`` sequences are left-padded, the
  generated responses right-padded, and a generated ``full`` is the left-padded prompt followed by the
  right-padded response. Padding holds the pad token id (tokens), False (masks) or 0 (log-probs).
* ``num_samples=n`` (or ``num_return_sequences``/``n`` in ``generate_kwargs``) adds a sample dimension:
  batch ``(B, n)``.

A backend implements two primitives on token ids — :meth:`LLMWrapperBase._generate_rows` (sample responses and
their log-probs) and :meth:`LLMWrapperBase._score_rows` (teacher-forced log-probs of whole sequences) — and
this class does the rest: reading the input in each mode, the chat template, the output containers, in-place
updates, ``get_new_version``.

Where llmrl differs from TorchRL 0.14.1 on purpose (each is a TorchRL bug when the pad token is the EOS token,
as in SmolLM2 and many chat models, or a value TorchRL leaves undefined):

* attention masks mark real tokens (TorchRL marks ``token != pad_id``, which drops every EOS token inside a
  prompt and, with ``pad_output=False``, removes them from ``tokens.full``); token prompts given padded and
  without a mask lose only the pad ids at the rows' ends, not the EOS tokens that close the chat's turns, so
  tokens mode answers the prompt text mode answers (TorchRL strips or masks them all);
* a generated response keeps its EOS token and stops there (TorchRL drops tokens equal to the pad id when
  unpadding);
* the log-prob of the first generated token is its real value (TorchRL writes 0); padded response positions
  hold 0 (TorchRL leaves the log-prob of the pad token);
* ``text.full`` is ``text.prompt + text.response`` (TorchRL decodes the padded token row);
* prompts of different lengths work in history mode (TorchRL fails to stack them).

llmrl's addition: a wrapper built on a *resident engine* (a :class:`~llmrl_core.modules.backends.vllm.worker.vLLMWorker`
or :class:`~llmrl_core.modules.backends.transformers.worker.TransformersWorker`, what the flows' rollout workers hold;
``worker.policy(...)`` builds one) samples through the engine's own ``generate``: prompt ``i`` seeded with
``seed + i`` (so the copies of a GRPO group sample differently), the engine's text and finish reason kept (written
per sample as ``"finish_reason"``: ``"stop"`` or ``"length"``). Its ``generate_kwargs`` are then the engine's
sampling settings only (``max_new_tokens``, ``temperature``, ``top_p``, ``do_sample``, ``seed``,
``stop_sequences``, ``num_return_sequences``); scoring and the TensorDict layout are unchanged.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from tensordict import (
    TensorDictBase,
    lazy_stack,
    set_list_to_stack,
)
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey

from llmrl_core.collector_registration import CollectorRegistration
from llmrl_core.modules.policies.engine_mode import ENGINE_GENERATE_KWARGS, EngineMode, is_resident_engine
from llmrl_core.modules.policies.wrapper_rows import WrapperRows

__all__ = ["ENGINE_GENERATE_KWARGS", "LLMWrapperBase", "is_resident_engine"]

InputMode = Literal["history", "text", "tokens"]

# what llmrl's wrappers write beside TorchRL's out_keys, when they know it (a sample's finish reason)
LLMRL_OUT_KEYS = ("finish_reason",)


class LLMWrapperBase(CollectorRegistration, EngineMode, WrapperRows, TensorDictModuleBase):
    """Base class of the TensorDict LLM policy wrappers (TorchRL's ``LLMWrapperBase``).

    Subclasses set the attributes in their constructor through :meth:`_setup` and implement
    :meth:`_generate_rows` and :meth:`_score_rows`; see :class:`~llmrl_core.modules.policies.TransformersWrapper`
    for the arguments.
    """

    COMMON_GENERATION_PARAMS = {
        "max_new_tokens",
        "num_return_sequences",
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "do_sample",
        "num_beams",
        "length_penalty",
        "early_stopping",
        "stop_sequences",
        "skip_special_tokens",
        "logprobs",
    }

    # --- generate_kwargs ---------------------------------------------------------------------------
    @classmethod
    def _standardize_generate_kwargs(cls, generate_kwargs: dict | None) -> dict:
        """Common names for backend names (``max_tokens`` -> ``max_new_tokens``, ``n`` -> ``num_return_sequences``;
        the backend name wins when both are given), then :meth:`_validate_parameter_combinations`."""
        if generate_kwargs is None:
            return {}
        standardized = dict(generate_kwargs)
        for legacy, common in (("max_tokens", "max_new_tokens"), ("n", "num_return_sequences")):
            if legacy in standardized:
                standardized.pop(common, None)
                standardized[common] = standardized.pop(legacy)
        cls._validate_parameter_combinations(standardized)
        return standardized

    @classmethod
    def _validate_parameter_combinations(cls, generate_kwargs: dict) -> None:
        """TorchRL's checks: greedy means temperature 0, temperature >= 0, 0 <= top_p <= 1, top_k > 0,
        repetition_penalty > 0 (``ValueError`` otherwise)."""
        if generate_kwargs.get("do_sample") is False and generate_kwargs.get("temperature", 0) != 0:
            raise ValueError(
                "When do_sample=False (greedy decoding), temperature must be 0. "
                f"Got temperature={generate_kwargs.get('temperature')}"
            )
        temperature = generate_kwargs.get("temperature")
        if temperature is not None and temperature < 0:
            raise ValueError(f"Temperature must be non-negative, got {temperature}")
        top_p = generate_kwargs.get("top_p")
        if top_p is not None and not 0 <= top_p <= 1:
            raise ValueError(f"top_p must be between 0 and 1, got {top_p}")
        top_k = generate_kwargs.get("top_k")
        if top_k is not None and top_k <= 0:
            raise ValueError(f"top_k must be positive, got {top_k}")
        penalty = generate_kwargs.get("repetition_penalty")
        if penalty is not None and penalty <= 0:
            raise ValueError(f"repetition_penalty must be positive, got {penalty}")

    @classmethod
    def _get_wrapper_specific_kwargs(cls, generate_kwargs: dict, wrapper_type: str) -> dict:
        """The entries of ``generate_kwargs`` only one backend understands (``"vllm"`` or ``"transformers"``)."""
        if not generate_kwargs:
            return {}
        specific = {
            "vllm": {
                "presence_penalty",
                "frequency_penalty",
                "ignore_eos",
                "prompt_logprobs",
                "detokenize",
                "include_stop_str_in_output",
                "spaces_between_special_tokens",
                "sampling_type",
                "temperature_last",
                "top_p_last",
                "top_k_last",
            },
            "transformers": {
                "pad_token_id",
                "eos_token_id",
                "bad_words_ids",
                "force_words_ids",
                "no_repeat_ngram_size",
                "encoder_repetition_penalty",
                "num_beam_groups",
                "diversity_penalty",
                "output_scores",
                "return_dict_in_generate",
            },
        }.get(wrapper_type, set())
        return {k: v for k, v in generate_kwargs.items() if k in specific}

    # --- shared constructor logic ------------------------------------------------------------------
    def _setup(
        self,
        *,
        tokenizer: Any,
        input_mode: str,
        input_key: NestedKey | None,
        attention_mask_key: str,
        generate: bool,
        tokenizer_kwargs: dict | None,
        pad_output: bool,
        device: Any,
        layout: torch.layout | None,
        chat_template_name: str | None,
        chat_template: str | None,
        return_log_probs: bool | None,
        history_key: NestedKey | None,
        text_key: NestedKey | None,
        tokens_key: NestedKey | None,
        masks_key: NestedKey | None,
        log_probs_key: NestedKey | None,
        batching: bool | None,
        min_batch_size: int | None,
        max_batch_size: int | None,
        batching_timeout: float,
        prefer_tokens: bool,
    ) -> None:
        if batching and min_batch_size is None:
            min_batch_size = 1
        elif (min_batch_size is not None or max_batch_size is not None) and batching is False:
            raise ValueError("min_batch_size and max_batch_size must be None if batching is False.")
        if min_batch_size is not None and max_batch_size is not None and min_batch_size > max_batch_size:
            raise ValueError(f"min_batch_size ({min_batch_size}) must be <= max_batch_size ({max_batch_size})")
        self._min_batch_size = min_batch_size
        self._max_batch_size = max_batch_size
        self._batching_timeout = batching_timeout

        if input_mode not in ("history", "text", "tokens"):
            raise ValueError(f"input_mode must be one of 'history', 'text', 'tokens'. Got '{input_mode}'")
        self.input_mode = input_mode
        self.attention_mask_key = attention_mask_key
        self.generate = generate
        self.prefer_tokens = prefer_tokens

        self.return_history = input_mode == "history"
        self.return_text = input_mode in ("text", "history")
        self.return_tokens = True
        self.return_masks = True
        if return_log_probs is False and not generate:
            raise ValueError("return_log_probs must be True when generate=False.")
        self.return_log_probs = (
            True if (return_log_probs is None and generate) or not generate else bool(return_log_probs)
        )

        self.history_key = history_key
        self.text_key = text_key
        self.tokens_key = tokens_key
        self.masks_key = masks_key
        self.log_probs_key = log_probs_key
        if not isinstance(pad_output, bool):
            raise ValueError("pad_output must be a boolean")
        self.pad_output = pad_output
        self._device = torch.device(device) if device is not None else None
        if not pad_output and layout is None:
            layout = torch.strided
        self.layout = layout

        self._input_key_given = input_key is not None
        default_key = (input_mode, "prompt" if generate else "full")
        self.in_keys = [default_key if input_key is None else input_key]
        self.input_key = self.in_keys[0]
        out_keys: list[NestedKey] = []
        if self.return_text:
            out_keys.append(text_key)
        out_keys.append(masks_key)
        out_keys.append(tokens_key)
        if self.return_log_probs:
            out_keys.append(log_probs_key)
        if self.return_history:
            out_keys.append(history_key)
        self.out_keys = out_keys

        tokenizer_kwargs = dict(tokenizer_kwargs or {})
        if not tokenizer_kwargs.setdefault("return_attention_mask", True):
            raise RuntimeError("return_attention_mask must be True")
        tokenizer_kwargs.setdefault("padding", True)
        if tokenizer_kwargs.setdefault("return_tensors", "pt") != "pt":
            raise RuntimeError("return_tensors must be 'pt'")
        if tokenizer_kwargs.setdefault("padding_side", "left") != "left":
            raise RuntimeError("padding_side must be 'left'")
        self.tokenizer_kwargs = tokenizer_kwargs

        self.tokenizer = tokenizer
        if tokenizer is not None and getattr(tokenizer, "pad_token", None) is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.padding_value = tokenizer.pad_token_id if tokenizer is not None else None
        self.chat_template_name = chat_template_name
        self.chat_template = chat_template

    def _setup_samples(self, num_samples: int | None, requested: int, inplace: Any) -> None:
        """TorchRL's rules tying ``num_samples``, the backend's sample count and ``inplace``."""
        self.num_samples = num_samples
        if requested > 1 or num_samples is not None:
            if inplace in (True, "empty"):
                raise ValueError("inplace must be False (or None) when generating more than one sample.")
            if inplace is None:
                inplace = False
            if requested > 1 and num_samples is not None and requested != num_samples:
                raise ValueError("num_samples differs from generate_kwargs['n'].")
            if num_samples is None:
                self.num_samples = requested
        elif inplace is None:
            inplace = True
        self.inplace = inplace

    # --- TorchRL's small API ---------------------------------------------------------------------
    @property
    def batching(self) -> bool:
        """Whether batching was requested (llmrl runs every call as its own batch)."""
        return self._min_batch_size is not None or self._max_batch_size is not None

    @property
    def log_prob_keys(self) -> list[NestedKey]:
        return getattr(self, "_log_prob_keys", ["log_probs"])

    @log_prob_keys.setter
    def log_prob_keys(self, value: list[NestedKey]) -> None:
        self._log_prob_keys = value

    @property
    def dist_sample_keys(self) -> list[NestedKey]:
        return ["tokens_response"]

    def log_prob(self, data: TensorDictBase, **get_kwargs: Any) -> Any:
        """Score ``data`` (``generate=False`` wrappers only) and return the response log-probs."""
        if not self.generate:
            data = self(data)
            return data.get((self.log_probs_key, "response"), **get_kwargs)
        raise RuntimeError("log_prob not callable when generate=True.")

    def cleanup_batching(self, *, flush: bool = False) -> None:
        """Nothing is queued in llmrl (every call is processed at once)."""

    def get_batching_state(self) -> dict[str, Any]:
        if not self.batching:
            return {"batching_enabled": False}
        return {
            "batching_enabled": True,
            "min_batch_size": self._min_batch_size,
            "max_batch_size": self._max_batch_size,
            "queue_size": 0,
            "processing": False,
            "lock_state": "not initialized",
            "pending_futures": 0,
            "timeout": self._batching_timeout,
        }

    def _new_version_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Constructor arguments for :meth:`get_new_version`: the current settings, overridden by ``kwargs``."""
        if any(not isinstance(k, str) for k in kwargs):
            raise TypeError("get_new_version takes keyword arguments only")
        current: dict[str, Any] = {
            "tokenizer": self.tokenizer,
            "input_mode": self.input_mode,
            "attention_mask_key": self.attention_mask_key,
            "generate": self.generate,
            "generate_kwargs": dict(self._user_generate_kwargs),
            "tokenizer_kwargs": dict(self.tokenizer_kwargs),
            "pad_output": self.pad_output,
            "inplace": self.inplace,
            "device": self._device,
            "layout": self.layout,
            "num_samples": self.num_samples,
            "chat_template_name": self.chat_template_name,
            "chat_template": self.chat_template,
            "history_key": self.history_key,
            "text_key": self.text_key,
            "tokens_key": self.tokens_key,
            "masks_key": self.masks_key,
            "log_probs_key": self.log_probs_key,
            "prefer_tokens": self.prefer_tokens,
        }
        # an explicit input key is kept; a default one follows the new input_mode / generate
        if self._input_key_given:
            current["input_key"] = self.input_key
        current.update(kwargs)
        if "generate" in kwargs and kwargs["generate"] != self.generate and "inplace" not in kwargs:
            current["inplace"] = None
        if current.get("num_samples") is not None and not current.get("generate", True):
            current["num_samples"] = None
            current["inplace"] = kwargs.get("inplace")
        return current

    def get_new_version(self, **kwargs: Any) -> LLMWrapperBase:
        """A new wrapper around the same model with some settings changed (e.g. ``generate=False`` to score)."""
        raise NotImplementedError

    # --- backend primitives ------------------------------------------------------------------------
    def _generate_rows(self, prompts: list[torch.Tensor]) -> list[list[tuple[torch.Tensor, torch.Tensor | None]]]:
        """For each prompt (1-D token ids), ``num_samples or 1`` pairs ``(response ids, response log-probs)``."""
        raise NotImplementedError

    def _score_rows(self, sequences: list[torch.Tensor]) -> list[torch.Tensor]:
        """Teacher-forced log-prob of every token of each sequence given those before it (0 for the first)."""
        raise NotImplementedError

    # --- forward -------------------------------------------------------------------------------------
    def forward(
        self,
        tensordict: TensorDictBase,
        *,
        tensordict_out: TensorDictBase | None = None,
        logits_only: bool = False,
        **kwargs: Any,
    ) -> TensorDictBase:
        """Generate (or score) for every element of ``tensordict`` and write the output containers.

        With ``inplace=True`` (the default for one sample) the outputs are written into ``tensordict`` and
        it is returned; with ``inplace=False`` a new TensorDict holding only the outputs is returned; with
        ``"empty"`` an empty copy of the input receives them. ``tensordict_out`` receives them when given.
        """
        if logits_only:
            return self._forward_logits(tensordict)
        if tensordict.ndim == 0:
            if tensordict_out is not None:
                raise ValueError(
                    "tensordict_out must not be provided when tensordict.ndim == 0. If this is needed, "
                    "please submit an issue on github."
                )
            return self.forward(lazy_stack([tensordict]), **kwargs)[0]
        if tensordict.ndim > 1:
            if tensordict_out is not None:
                raise ValueError(
                    "tensordict_out must not be provided when tensordict.ndim > 1. If this is needed, "
                    "please submit an issue on github."
                )
            return self.forward(tensordict.reshape(-1), **kwargs).view(tensordict.shape)
        with set_list_to_stack(True):
            out = self._compute(tensordict, **kwargs)
            if tensordict.device is not None:
                out = out.to(tensordict.device)
            keys = [*self.out_keys, *(k for k in LLMRL_OUT_KEYS if k in out.keys())]
            if tensordict_out is None:
                if self.inplace is True:
                    tensordict_out = tensordict
                elif self.inplace == "empty":
                    tensordict_out = tensordict.empty()
                else:
                    return out.select(*keys, strict=False)
            tensordict_out.exclude(*keys, inplace=True)
            for key in keys:
                value = out.get(key, None)
                if value is not None:
                    tensordict_out.set(key, value)
            return tensordict_out

    def _forward_logits(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``logits_only=True``: the scored sequences with ``"logits"`` per row, aligned with their tokens
        (:mod:`llmrl_core.modules.policies.distributions`)."""
        if self.generate:
            raise ValueError("logits_only=True is only effective with generate=False (a scoring wrapper)")
        with set_list_to_stack(True):
            out = self._compute(tensordict)
            sequences = out.get((self.tokens_key, "full"), as_list=True)
            for i, logits in enumerate(self._logits_rows([torch.as_tensor(s) for s in sequences])):
                out[i].set("logits", logits)
        return out

    def _logits_rows(self, sequences: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per-sequence ``(T, V)`` logits aligned with the tokens (the engine's own forward pass)."""
        raise NotImplementedError(
            f"{type(self).__name__} returns no logits (vLLM reports log-probs only): use a TransformersWrapper "
            "over the same weights for logits_only / get_dist"
        )

    def get_dist(
        self,
        tensordict: TensorDictBase,
        tensordict_out: TensorDictBase | None = None,
        logits_key: NestedKey = "logits",
        mask_key: NestedKey | None = None,
        as_padded_tensor: bool | None = None,
        as_nested_tensor: bool | None = None,
        padding_value: float | None = None,
        padding_side: str = "left",
        layout: torch.layout | None = None,
        **kwargs: Any,
    ) -> Any:
        """TorchRL's ``get_dist``: the token distribution over each whole sequence as an ``LLMMaskedCategorical``
        (``log_prob(tokens)``, ``entropy()``; masked by ``mask_key`` or the real tokens). Padding is on the
        left; the nested-tensor and layout options are accepted for TorchRL's signature."""
        from llmrl_core.modules.policies.distributions import get_dist

        return get_dist(self, tensordict, logits_key=logits_key, mask_key=mask_key, padding_side=padding_side)
