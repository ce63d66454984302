"""``vLLMWrapper``: a vLLM engine as a TensorDict policy (TorchRL's constructor and outputs).

Generation samples with ``vllm.LLM.generate`` on token-id prompts and reads the log-prob of each sampled token
(the engine's ``logprobs_mode`` decides raw or processed log-probs); scoring (``generate=False``) reads vLLM's
``prompt_logprobs`` over the full sequence through :func:`llmrl_core.modules.backends.vllm.engine.score_with_vllm`,
the scorer llmrl's rollout code uses. On a resident engine (a ``vLLMWorker``) it samples through the engine's own
``generate`` (see :mod:`llmrl_core.modules.policies.llm_wrapper_base`). The TensorDict layout, input modes and
argument checks are those of
:class:`~llmrl_core.modules.policies.llm_wrapper_base.LLMWrapperBase`.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from tensordict.utils import NestedKey

from llmrl_core.modules.policies.llm_wrapper_base import LLMWrapperBase, is_resident_engine

__all__ = ["vLLMWrapper"]


def _as_llm(model: Any) -> Any:
    """A ``vllm.LLM`` from an engine, a worker holding one (``.llm``), an ``EngineConfig`` or a model reference."""
    from llmrl_core.modules.backends.types import EngineConfig
    from llmrl_core.modules.backends.vllm.engine import make_llm

    if isinstance(model, str):
        return make_llm(EngineConfig(model=model))
    if isinstance(model, EngineConfig):
        return make_llm(model)
    inner = getattr(model, "llm", None)
    if inner is not None and hasattr(inner, "generate"):
        return inner
    if hasattr(model, "generate") and hasattr(model, "get_tokenizer"):
        return model
    raise ValueError(f"model must be a string, vllm.LLM, or an EngineConfig. Got {type(model)}")


class vLLMWrapper(LLMWrapperBase):  # noqa: N801 - TorchRL's name
    """A vLLM engine that generates (``generate=True``) or scores (``generate=False``) TensorDicts.

    Args:
        model: a ``vllm.LLM``, a :class:`~llmrl_core.modules.backends.vllm.worker.vLLMWorker` (sampling through its
            ``generate``), an :class:`~llmrl_core.modules.backends.types.EngineConfig`, or a model reference
            (``"default"``, a folder, a cached hub id) from which an engine is started.

    Keyword Args:
        generate_kwargs: sampling settings in TorchRL's common names (``max_new_tokens``, ``temperature``,
            ``top_p``, ``top_k``, ``num_return_sequences``, ``do_sample``, ``stop_sequences``, ...) or vLLM's
            (``max_tokens``, ``n``, ``stop``, ``seed``, ``ignore_eos``, ...); vLLM's default ``max_tokens`` is 16.
        pad_model_input: not supported (``ValueError`` unless None), as in TorchRL.

    The other arguments are :class:`~llmrl_core.modules.policies.TransformersWrapper`'s.
    """

    _VLLM_EXTRA = {"seed", "min_tokens", "min_p", "stop_token_ids", "bad_words", "logits_processors"}

    def __init__(
        self,
        model: Any,
        *,
        tokenizer: Any = None,
        input_mode: str = "history",
        input_key: NestedKey | None = None,
        attention_mask_key: str = "attention_mask",
        generate: bool = True,
        generate_kwargs: dict | None = None,
        tokenizer_kwargs: dict | None = None,
        pad_output: bool = False,
        pad_model_input: bool | None = None,
        inplace: Literal[True, False, "empty"] | None = None,
        device: torch.device | None = None,
        layout: torch.layout | None = None,
        num_samples: int | None = None,
        chat_template_name: Literal["chatml_format", "qwen"] | None = None,
        chat_template: str | None = None,
        return_log_probs: bool | None = None,
        history_key: NestedKey | None = "history",
        text_key: NestedKey | None = "text",
        tokens_key: NestedKey | None = "tokens",
        masks_key: NestedKey | None = "masks",
        log_probs_key: NestedKey | None = "log_probs",
        batching: bool | None = None,
        min_batch_size: int | None = None,
        max_batch_size: int | None = None,
        batching_timeout: float = 10.0,
        prefer_tokens: bool = False,
    ) -> None:
        super().__init__()
        if input_mode not in ("history", "text", "tokens"):
            raise ValueError(f"input_mode must be one of 'history', 'text', 'tokens'. Got '{input_mode}'")
        if pad_model_input is not None:
            raise ValueError("pad_model_input is not supported by vLLMWrapper.")
        engine = model if is_resident_engine(model) else None
        llm = _as_llm(model)
        self.model = llm
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            from llmrl_core.model_store import resolve_model

            tokenizer = AutoTokenizer.from_pretrained(resolve_model(tokenizer))
        if tokenizer is None:
            tokenizer = llm.get_tokenizer()
        self._setup(
            tokenizer=tokenizer,
            input_mode=input_mode,
            input_key=input_key,
            attention_mask_key=attention_mask_key,
            generate=generate,
            tokenizer_kwargs=tokenizer_kwargs,
            pad_output=pad_output,
            device=device,
            layout=layout,
            chat_template_name=chat_template_name,
            chat_template=chat_template,
            return_log_probs=return_log_probs,
            history_key=history_key,
            text_key=text_key,
            tokens_key=tokens_key,
            masks_key=masks_key,
            log_probs_key=log_probs_key,
            batching=batching,
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
            batching_timeout=batching_timeout,
            prefer_tokens=prefer_tokens,
        )
        standardized = self._standardize_generate_kwargs(generate_kwargs)
        self._user_generate_kwargs = dict(generate_kwargs or {})
        vllm_kwargs: dict[str, Any] = {}
        for key, value in standardized.items():
            if key not in self.COMMON_GENERATION_PARAMS:
                continue
            if key == "max_new_tokens":
                vllm_kwargs["max_tokens"] = value
            elif key == "num_return_sequences":
                vllm_kwargs["n"] = value
            elif key == "stop_sequences":
                vllm_kwargs["stop"] = value
            elif key == "logprobs":
                vllm_kwargs["logprobs"] = (1 if value else None) if isinstance(value, bool) else value
            elif key == "do_sample":
                if not value:
                    vllm_kwargs["temperature"] = 0.0
            elif key not in ("length_penalty", "early_stopping", "num_beams"):
                vllm_kwargs[key] = value
        vllm_kwargs.update(self._get_wrapper_specific_kwargs(standardized, "vllm"))
        vllm_kwargs.update({k: v for k, v in standardized.items() if k in self._VLLM_EXTRA})
        self._setup_samples(num_samples, int(vllm_kwargs.get("n", 1)), inplace)
        if self.num_samples is not None:
            vllm_kwargs["n"] = self.num_samples
        if not generate:
            vllm_kwargs["max_tokens"] = 1
        # the sampled token's own log-prob (logprobs=0) is all a generating call needs
        vllm_kwargs.setdefault("logprobs", 0 if self.return_log_probs else None)
        vllm_kwargs.setdefault("include_stop_str_in_output", True)
        vllm_kwargs.setdefault("skip_special_tokens", False)
        self._sampling_kwargs = vllm_kwargs
        if engine is not None:
            self._setup_engine(engine, standardized)

    @property
    def sampling_params(self) -> Any:
        """The ``vllm.SamplingParams`` a generating call uses."""
        from vllm import SamplingParams

        return SamplingParams(**self._sampling_kwargs)

    @property
    def generate_kwargs(self) -> dict[str, Any]:
        return dict(self._sampling_kwargs)

    def get_new_version(self, **kwargs: Any) -> vLLMWrapper:
        """A wrapper on the same engine with some settings changed, e.g. ``get_new_version(generate=False)``."""
        model = kwargs.pop("model", self.engine if self.engine is not None else self.model)
        return type(self)(model, **self._new_version_kwargs(kwargs))

    # --- backend primitives ------------------------------------------------------------------------
    def _generate_rows(self, prompts: list[torch.Tensor]) -> list[list[tuple[Any, ...]]]:
        """Samples of each prompt through :func:`~llmrl_core.modules.backends.vllm.engine.generate` (prompt ``i``
        seeded with ``seed + i`` when a seed is given): ``(ids, log-probs, vLLM's text, finish reason)``."""
        from llmrl_core.modules.backends.vllm.engine import generate

        for i, prompt in enumerate(prompts):
            if prompt.numel() == 0:
                raise ValueError(f"prompt {i} is empty: vLLM needs at least one prompt token")
        kwargs = dict(self._sampling_kwargs)
        kwargs.setdefault("max_tokens", 16)  # vLLM's own default
        groups = generate(self.model, [p.tolist() for p in prompts], use_tqdm=self.progress, **kwargs)
        return self._completion_rows(groups)

    def _score_rows(self, sequences: list[torch.Tensor]) -> list[torch.Tensor]:
        from llmrl_core.modules.backends.vllm.engine import score_with_vllm

        lists = [s.tolist() for s in sequences]
        scores = score_with_vllm(self.model, [s[:1] for s in lists], [s[1:] for s in lists])
        return [torch.cat([torch.zeros(1), lp.float()]) for lp in scores]
