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

from collections.abc import Sequence
from typing import Any, Literal

import torch
from tensordict import (
    MetaData,
    NonTensorData,
    NonTensorStack,
    TensorDict,
    TensorDictBase,
    lazy_stack,
    set_list_to_stack,
)
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey

from llmrl_core.collector_registration import CollectorRegistration
from llmrl_core.data.history import History
from llmrl_core.data.tensors import as_padded_tensor
from llmrl_core.modules.backends.types import SamplingConfig
from llmrl_core.modules.policies.outputs import ChatHistory, LogProbs, Masks, Text, Tokens

__all__ = ["LLMWrapperBase"]

InputMode = Literal["history", "text", "tokens"]

# what a wrapper on a resident engine takes in generate_kwargs (the engine's SamplingConfig)
ENGINE_GENERATE_KWARGS = frozenset(
    {"max_new_tokens", "temperature", "top_p", "do_sample", "seed", "stop_sequences", "stop", "num_return_sequences"}
)


# what llmrl's wrappers write beside TorchRL's out_keys, when they know it (a sample's finish reason)
LLMRL_OUT_KEYS = ("finish_reason",)


def is_resident_engine(model: Any) -> bool:
    """Whether ``model`` is one of llmrl's resident engines (a ``vLLMWorker`` / ``TransformersWorker``: it samples
    token-id prompts with ``generate(prompt_ids, sampling, n)`` and knows its policy version)."""
    return hasattr(model, "generate") and hasattr(model, "policy_version") and hasattr(model, "get_tokenizer")


class LLMWrapperBase(CollectorRegistration, TensorDictModuleBase):
    """Base class of the TensorDict LLM policy wrappers (TorchRL's ``LLMWrapperBase``).

    Subclasses set the attributes in their constructor through :meth:`_setup` and implement
    :meth:`_generate_rows` and :meth:`_score_rows`; see :class:`~llmrl_core.modules.policies.TransformersWrapper`
    for the arguments.
    """

    engine: Any = None  # llmrl: the resident engine this wrapper samples through (None: the backend's own call)
    progress: bool = False  # llmrl: the engine's progress bar over each call's prompts (vLLM engines)

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

    def _setup_engine(self, engine: Any, standardized: dict) -> None:
        """Sample through ``engine`` (a resident engine, :func:`is_resident_engine`) with the settings of
        ``standardized`` (TorchRL's common names), refusing what the engine's sampling does not have."""
        unknown = sorted(set(standardized) - ENGINE_GENERATE_KWARGS)
        if unknown:
            raise ValueError(
                f"{type(self).__name__} on a resident engine ({type(engine).__name__}) samples with the engine's "
                f"settings: generate_kwargs {unknown} are not supported there (supported: "
                f"{sorted(ENGINE_GENERATE_KWARGS)}); wrap the engine's model instead for the backend's full options"
            )
        stop = standardized.get("stop_sequences", standardized.get("stop")) or []
        greedy = standardized.get("do_sample") is False
        self.engine = engine
        self._engine_sampling = SamplingConfig(
            max_new_tokens=int(standardized.get("max_new_tokens", SamplingConfig.max_new_tokens)),
            temperature=0.0 if greedy else float(standardized.get("temperature", SamplingConfig.temperature)),
            top_p=float(standardized.get("top_p", SamplingConfig.top_p)),
            seed=standardized.get("seed"),
            stop=[stop] if isinstance(stop, str) else list(stop),
        )

    def _engine_rows(self, prompts: list[torch.Tensor]) -> list[list[tuple[Any, ...]]]:
        """:meth:`_generate_rows` through the resident engine (see :meth:`_completion_rows`)."""
        groups = self.engine.generate(
            [p.tolist() for p in prompts], self._engine_sampling, self.num_samples or 1, progress=self.progress
        )
        return self._completion_rows(groups)

    def _completion_rows(self, groups: Sequence[Sequence[Any]]) -> list[list[tuple[Any, ...]]]:
        """An engine's completions (:class:`~llmrl_core.modules.backends.types.Completion`, a group per prompt) as
        :meth:`_generate_rows` rows: per sample ``(ids, log-probs, text, finish reason)``, the engine's text and
        finish reason kept."""
        return [
            [
                (
                    torch.tensor(c.token_ids, dtype=torch.long),
                    torch.tensor(c.logprobs, dtype=torch.float32) if self.return_log_probs else None,
                    c.text,
                    c.finish_reason,
                )
                for c in group
            ]
            for group in groups
        ]

    @classmethod
    def on_engine(
        cls, engine: Any, input_mode: str, sampling: SamplingConfig | None, progress: bool = False, **kwargs: Any
    ) -> LLMWrapperBase:
        """This wrapper on a resident engine (what ``engine.policy(...)`` returns): ``sampling`` as its
        ``generate_kwargs``, ``progress`` the engine's bar, ``kwargs`` for a subclass's own arguments."""
        generate_kwargs = (sampling or SamplingConfig()).as_kwargs()
        wrapper = cls(engine, input_mode=input_mode, generate_kwargs=generate_kwargs, **kwargs)
        wrapper.progress = progress
        return wrapper

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

    # --- input ----------------------------------------------------------------------------------------
    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError(f"{type(self).__name__} needs a tokenizer for input_mode={self.input_mode!r}")
        return self.tokenizer

    def _template_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.chat_template_name is not None:
            kwargs["chat_template_name"] = self.chat_template_name
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        return kwargs

    def _input_history(self, td: TensorDictBase) -> History:
        if self.input_key not in td.keys(True):
            raise ValueError(
                f"Expected '{self.input_key}' key for history input mode, but found keys: {list(td.keys())}"
            )
        history = td.get(self.input_key)
        if not isinstance(history, History):
            raise TypeError(f"Expected History object for '{self.input_key}', got {type(history)}")
        return history

    def _input_text(self, td: TensorDictBase) -> list[str]:
        if self.input_key not in td.keys(True):
            raise ValueError(f"Expected '{self.input_key}' key for text input mode, but found keys: {list(td.keys())}")
        text = td.get(self.input_key)
        if text is None:
            raise ValueError(f"Expected '{self.input_key}' key for text input mode")
        if isinstance(text, (NonTensorStack, NonTensorData)):
            text = text.tolist()
        if not isinstance(text, list):
            raise ValueError(f"Expected list of text for text input, got {type(text)}")
        return [str(t) for t in text]

    def _tokenize_texts(self, texts: list[str]) -> list[torch.Tensor]:
        tokenizer = self._require_tokenizer()
        kwargs = {
            k: v for k, v in self.tokenizer_kwargs.items() if k not in ("padding", "return_tensors", "padding_side")
        }
        encoded = tokenizer(texts, padding=False, **kwargs)
        return [torch.as_tensor(ids, dtype=torch.long) for ids in encoded["input_ids"]]

    def _token_rows(self, td: TensorDictBase, key: NestedKey) -> list[torch.Tensor] | None:
        """The token ids under ``key`` as one 1-D tensor per element, padding removed (None if absent).

        A padded tensor is cut by its attention mask; without one, only the runs of ``padding_value`` at either end
        are padding (prompts pad on the left, responses on the right): the same id inside a row is a real token
        (SmolLM2's pad token is its ``<|im_end|>``, which closes every chat turn)."""
        if key not in td.keys(True):
            return None
        value = td.get(key, as_list=True)
        if isinstance(value, torch.Tensor) and not value.is_nested:
            if value.ndim == 1:
                value = value.unsqueeze(0)
            mask = self._mask_rows(td)
            if mask is None:
                return [_strip_pad_runs(row, self.padding_value).long() for row in value]
            return [row[m.to(row.device).bool()].long() for row, m in zip(value, mask, strict=True)]
        return [torch.as_tensor(row).long().reshape(-1) for row in value]

    def _mask_rows(self, td: TensorDictBase) -> list[torch.Tensor] | None:
        for key in (("masks", "all_attention_mask"), self.attention_mask_key):
            if key in td.keys(True):
                mask = td.get(key, as_list=True)
                if isinstance(mask, torch.Tensor) and not mask.is_nested and mask.ndim == 1:
                    mask = mask.unsqueeze(0)
                return list(mask)
        return None

    def _assistant_mask_rows(self, td: TensorDictBase) -> list[torch.Tensor] | None:
        key = ("masks", "all_assistant_mask")
        if key not in td.keys(True):
            return None
        value = td.get(key, as_list=True)
        if value is None:
            return None
        return [torch.as_tensor(v).bool() for v in value]

    # --- the computation ------------------------------------------------------------------------------
    def _compute(self, td: TensorDictBase, **kwargs: Any) -> TensorDictBase:
        if kwargs:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword arguments {sorted(kwargs)}")
        if self.generate:
            return self._compute_generate(td)
        return self._compute_score(td)

    def _compute_generate(self, td: TensorDictBase) -> TensorDictBase:
        history = None
        text_prompt: list[str] | None = None
        prompts: list[torch.Tensor] | None = None
        if self.input_mode == "history":
            history = self._input_history(td)
            if self.prefer_tokens:
                prompts = self._token_rows(td, (self.tokens_key, "prompt"))
                if prompts is None:
                    prompts = self._token_rows(td, (self.tokens_key, "full"))
            tokenizer = self._require_tokenizer()
            if prompts is not None:
                text_prompt = tokenizer.batch_decode([p.tolist() for p in prompts], skip_special_tokens=False)
            else:
                text_prompt = history.apply_chat_template(
                    tokenizer=tokenizer, add_generation_prompt=True, **self._template_kwargs()
                )
                encoded = history.apply_chat_template(
                    tokenizer=tokenizer,
                    add_generation_prompt=True,
                    tokenize=True,
                    padding=False,
                    return_dict=True,
                    return_assistant_tokens_mask=False,
                    **self._template_kwargs(),
                )
                prompts = [t.long() for t in encoded.get("input_ids", as_list=True)]
        elif self.input_mode == "text":
            text_prompt = self._input_text(td)
            prompts = self._tokenize_texts(text_prompt)
        else:
            if self.input_key not in td.keys(True):
                raise ValueError(
                    f"Expected '{self.input_key}' key for tokens input mode, but found keys: {list(td.keys())}"
                )
            prompts = self._token_rows(td, self.input_key)
        assert prompts is not None
        samples = self._engine_rows(prompts) if self.engine is not None else self._generate_rows(prompts)
        n = self.num_samples
        flat_prompts = [p for p in prompts for _ in range(n or 1)]
        flat = [sample for row in samples for sample in row]
        responses = [sample[0].long().cpu() for sample in flat]
        log_probs = [sample[1] for sample in flat]
        finish_reasons = [sample[3] if len(sample) > 3 else None for sample in flat]
        tokenizer = self.tokenizer
        text_response = (
            tokenizer.batch_decode([r.tolist() for r in responses], skip_special_tokens=False)
            if tokenizer is not None
            else None
        )
        if flat and all(len(sample) > 2 for sample in flat):  # the engine's own text
            text_response = [sample[2] for sample in flat]
        flat_text_prompt = [t for t in text_prompt for _ in range(n or 1)] if text_prompt is not None else None

        # per-sample tensors, padded the TorchRL way when asked
        prompt_rows = [p.cpu() for p in flat_prompts]
        full_rows = [torch.cat([p, r]) for p, r in zip(prompt_rows, responses, strict=True)]
        mask_rows = [torch.ones(f.numel(), dtype=torch.bool) for f in full_rows]
        lp_rows = [lp.float().cpu() for lp in log_probs] if self.return_log_probs else None
        if self.pad_output:
            pad = self.padding_value if self.padding_value is not None else 0
            prompt_pad, prompt_mask = as_padded_tensor(prompt_rows, pad, "left", return_mask=True)
            resp_pad, resp_mask = as_padded_tensor(responses, pad, "right", return_mask=True)
            prompt_pad, resp_pad = prompt_pad.long(), resp_pad.long()
            if resp_pad.ndim != 2 or resp_pad.shape[0] != len(responses):
                resp_pad = torch.full((len(responses), 0), pad, dtype=torch.long)
                resp_mask = torch.zeros((len(responses), 0), dtype=torch.bool)
            full_pad = torch.cat([prompt_pad, resp_pad], -1)
            full_mask = torch.cat([prompt_mask, resp_mask], -1)
            prompt_rows, responses, full_rows, mask_rows = (
                list(prompt_pad),
                list(resp_pad),
                list(full_pad),
                list(full_mask),
            )
            if lp_rows is not None:
                lp_pad = torch.zeros(resp_pad.shape, dtype=torch.float32)
                for i, lp in enumerate(lp_rows):
                    lp_pad[i, : lp.numel()] = lp
                lp_rows = list(lp_pad)

        response_histories = None
        if self.input_mode == "history":
            assert history is not None and flat_text_prompt is not None and text_response is not None
            prompt_histories = [history[i] for i in range(history.batch_size[0]) for _ in range(n or 1)]
            response_histories = self._response_histories(prompt_histories, flat_text_prompt, text_response)

        rows = []
        for i in range(len(flat)):
            row = TensorDict()
            if self.return_text:
                row.set(
                    self.text_key,
                    Text(
                        prompt=flat_text_prompt[i] if flat_text_prompt is not None else None,
                        response=text_response[i] if text_response is not None else None,
                        full=flat_text_prompt[i] + text_response[i]
                        if flat_text_prompt is not None and text_response is not None
                        else None,
                        batch_size=[],
                    ),
                )
            row.set(
                self.tokens_key,
                Tokens(
                    prompt=prompt_rows[i],
                    response=responses[i],
                    full=full_rows[i],
                    batch_size=[],
                ),
            )
            row.set(self.masks_key, Masks(all_attention_mask=mask_rows[i], batch_size=[]))
            if lp_rows is not None:
                row.set(self.log_probs_key, LogProbs(response=lp_rows[i], batch_size=[]))
            if finish_reasons[i] is not None:
                row.set_non_tensor("finish_reason", finish_reasons[i])
            if response_histories is not None:
                prompt_h, response_h = prompt_histories[i], response_histories[i]
                row.set(
                    self.history_key,
                    ChatHistory(
                        prompt=prompt_h,
                        response=response_h,
                        full=prompt_h.extend(response_h, inplace=False, dim=-1),
                        batch_size=[],
                    ),
                )
            rows.append(row)
        return self._stack_rows(rows, len(prompts))

    def _stack_rows(self, rows: list[TensorDictBase], batch: int | None = None) -> TensorDictBase:
        """Lazy-stack per-sample rows into ``(B,)`` (or ``(B, n)`` with samples) and mark the containers'
        ``padded`` flag once for the batch, as TorchRL does."""
        if self.num_samples is None or batch is None:
            out = lazy_stack(rows)
        else:
            n = self.num_samples
            out = lazy_stack([lazy_stack(rows[i * n : (i + 1) * n]) for i in range(batch)])
        for key in (self.tokens_key, self.masks_key, self.log_probs_key):
            if key in out.keys(True):
                out.get(key).padded = MetaData(self.pad_output)
        return out

    def _response_histories(
        self, prompt_histories: Sequence[History], text_prompt: Sequence[str], text_response: Sequence[str]
    ) -> list[History]:
        """The messages a response adds to its prompt, parsed from the rendered text as TorchRL does; all padded
        to one count with ``"<none>"`` messages."""
        out = []
        for prompt_h, prompt_txt, response_txt in zip(prompt_histories, text_prompt, text_response, strict=True):
            parsed = None
            try:
                parsed = History.from_text(
                    prompt_txt + response_txt, chat_template_name=self.chat_template_name, tokenizer=self.tokenizer
                )
            except Exception:  # noqa: BLE001 - an unparsable text falls back to one assistant message
                parsed = None
            count = prompt_h.batch_size[0]
            if parsed is not None and parsed.batch_size[0] > count:
                out.append(parsed[count:])
            elif parsed is not None and parsed.batch_size[0] == count:
                out.append(History.from_chats([{"role": "assistant", "content": ""}]))
            else:
                out.append(History.from_chats([{"role": "assistant", "content": response_txt}]))
        longest = max((h.batch_size[0] for h in out), default=0)
        padded = []
        for h in out:
            missing = longest - h.batch_size[0]
            if missing:
                filler = History.from_chats([{"role": "<none>", "content": ""} for _ in range(missing)])
                h = h.extend(filler, inplace=False, dim=-1)
            padded.append(h)
        return padded

    def _compute_score(self, td: TensorDictBase) -> TensorDictBase:
        history = None
        text_full: list[str] | None = None
        assistant_rows: list[torch.Tensor] | None = None
        if self.input_mode == "history":
            history = self._input_history(td)
            tokenizer = self._require_tokenizer()
            text_full = history.apply_chat_template(
                tokenizer=tokenizer, add_generation_prompt=False, **self._template_kwargs()
            )
            encoded = history.apply_chat_template(
                tokenizer=tokenizer,
                add_generation_prompt=False,
                tokenize=True,
                padding=False,
                return_dict=True,
                return_assistant_tokens_mask=True,
                **self._template_kwargs(),
            )
            sequences = [t.long() for t in encoded.get("input_ids", as_list=True)]
            if "assistant_masks" in encoded.keys():
                assistant_rows = [m.bool() for m in encoded.get("assistant_masks", as_list=True)]
        elif self.input_mode == "text":
            text_full = self._input_text(td)
            sequences = self._tokenize_texts(text_full)
            assistant_rows = self._assistant_mask_rows(td)
        else:
            if self.input_key not in td.keys(True):
                raise ValueError(
                    f"Expected '{self.input_key}' key for tokens input mode, but found keys: "
                    f"{list(td.keys(isinstance(self.input_key, tuple)))}"
                )
            sequences = self._token_rows(td, self.input_key)
            assert sequences is not None
            assistant_rows = self._assistant_mask_rows(td)
        for i, seq in enumerate(sequences):
            if seq.numel() == 0:
                raise ValueError(
                    "Input contains empty sequences. Packing/padding requires at least one token per sequence."
                    f" (sequence {i})"
                )
        log_probs = [lp.float() for lp in self._score_rows(sequences)]
        token_rows = [s.cpu() for s in sequences]
        mask_rows = [torch.ones(s.numel(), dtype=torch.bool) for s in token_rows]
        if self.pad_output:
            pad = self.padding_value if self.padding_value is not None else 0
            tokens_pad, mask_pad = as_padded_tensor(token_rows, pad, "left", return_mask=True)
            token_rows, mask_rows = list(tokens_pad.long()), list(mask_pad)
            log_probs = list(_pad_left(log_probs))
            if assistant_rows is not None and self.input_mode == "history":
                assistant_rows = list(as_padded_tensor([a.long() for a in assistant_rows], 0, "left").bool())
        rows = []
        for i in range(len(sequences)):
            row = TensorDict()
            if self.return_text:
                row.set(self.text_key, Text(full=text_full[i] if text_full is not None else None, batch_size=[]))
            row.set(self.tokens_key, Tokens(full=token_rows[i], batch_size=[]))
            row.set(
                self.masks_key,
                Masks(
                    all_attention_mask=mask_rows[i],
                    all_assistant_mask=assistant_rows[i] if assistant_rows is not None else None,
                    batch_size=[],
                ),
            )
            row.set(self.log_probs_key, LogProbs(full=log_probs[i], batch_size=[]))
            if history is not None:
                row.set(self.history_key, ChatHistory(full=history[i], batch_size=[]))
            rows.append(row)
        return self._stack_rows(rows)


def _pad_left(rows: list[torch.Tensor]) -> torch.Tensor:
    """Left-pad 1-D float tensors with 0 into ``(B, T)``, keeping any autograd graph."""
    longest = max(r.numel() for r in rows)
    return torch.stack([torch.nn.functional.pad(r, (longest - r.numel(), 0)) for r in rows])


def _strip_pad_runs(row: torch.Tensor, pad: int | None) -> torch.Tensor:
    """``row`` without the runs of ``pad`` at its start and its end (None: nothing is padding)."""
    if pad is None:
        return row
    real = (row != pad).nonzero()
    if real.numel() == 0:
        return row[:0]
    return row[int(real[0]) : int(real[-1]) + 1]
