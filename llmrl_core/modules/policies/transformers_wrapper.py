"""``TransformersWrapper``: a Hugging Face causal LM as a TensorDict policy (TorchRL's constructor and outputs).

Generation runs ``model.generate`` on the left-padded prompts (the shared helper
:func:`llmrl_core.modules.backends.transformers.scoring.generate_with_log_probs`), or, on a resident engine (a
``TransformersWorker``), the engine's own ``generate``; scoring (``generate=False``) runs one teacher-forced forward
pass per micro-batch through :func:`llmrl_core.modules.backends.transformers.scoring.teacher_forced_log_probs`, the
scorer every llmrl component uses. The TensorDict layout, input modes and argument checks are those of
:class:`~llmrl_core.modules.policies.llm_wrapper_base.LLMWrapperBase` (see there for where llmrl differs from
TorchRL 0.14.1).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Literal

import torch
from tensordict.utils import NestedKey

from llmrl_core.data.tensors import as_padded_tensor
from llmrl_core.modules.backends.transformers.scoring import (
    generate_with_log_probs,
    load_causal_lm,
    stop_token_ids,
    teacher_forced_log_probs,
)
from llmrl_core.modules.policies.llm_wrapper_base import LLMWrapperBase, is_resident_engine

__all__ = ["TransformersWrapper"]


def _load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    from llmrl_core.model_store import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(name))


class TransformersWrapper(LLMWrapperBase):
    """A transformers causal LM that generates (``generate=True``) or scores (``generate=False``) TensorDicts.

    Args:
        model: a loaded ``PreTrainedModel``, a resident ``TransformersWorker`` (sampling through its ``generate``),
            or a model reference for
            :func:`llmrl_core.model_store.resolve_model` (``"default"``, a local folder, a cached hub id), loaded
            in fp32 (on ``device`` when given).

    Keyword Args:
        tokenizer: the tokenizer, or a reference to load one (default: the model's). A tokenizer without a pad
            token gets its EOS token as pad token, as in TorchRL.
        input_mode: ``"history"`` (default), ``"text"`` or ``"tokens"``.
        input_key: where the input is read; default ``(input_mode, "prompt")`` when generating and
            ``(input_mode, "full")`` when scoring.
        attention_mask_key: a tokens-mode attention mask read when ``("masks", "all_attention_mask")`` is absent.
        generate: generate responses (True) or only compute the log-probs of the full sequences (False).
        generate_kwargs: ``model.generate`` settings (``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``,
            ``do_sample``, ``num_return_sequences``, ...; vLLM's ``max_tokens`` and ``n`` are accepted).
        tokenizer_kwargs: extra tokenizer arguments (text mode).
        pad_output: padded ``(B, T)`` outputs (True) or one tensor per sample (False, default).
        pad_model_input: TorchRL's padding-vs-packing switch (scoring only): True (default) scores left-padded
            batches; False packs the sequences into one row per forward pass (no padding computed), the trainer's
            packed scorer (:func:`llmrl_core.trainer.scoring.score_packed`).
        inplace: ``True`` (default with one sample): write into the input; ``False``: a new TensorDict;
            ``"empty"``: an empty copy of the input.
        device: where inputs are moved for the model (the model itself is not moved).
        layout: layout of unpadded outputs (default ``torch.strided``).
        num_samples: samples per prompt (adds a batch dimension; needs ``do_sample=True``).
        chat_template_name / chat_template: the chat template (history mode).
        return_log_probs: return the log-probs (default True; must be True when ``generate=False``).
        history_key / text_key / tokens_key / masks_key / log_probs_key: the output keys.
        batching / min_batch_size / max_batch_size / batching_timeout: TorchRL's batching options, validated as
            TorchRL does; llmrl processes every call as its own batch.
        prefer_tokens: in history mode, generate from ``(tokens_key, "prompt")`` when present.
        score_batch_size: (llmrl) sequences per scoring forward pass (the vocabulary-sized logits dominate memory).
        score_token_budget: (llmrl, packed scoring) tokens per forward pass instead of ``score_batch_size``
            sequences (:func:`llmrl_core.trainer.batch.plan_micro_batches`; a longer sequence gets a pass alone).
        score_temperature: (llmrl) scoring divides the logits by this first, so the log-probs are those of the
            distribution a sampler at that temperature drew from (default 1.0: the model's own).
    """

    def __init__(
        self,
        model: Any,
        *,
        tokenizer: Any = None,
        input_mode: str = "history",
        input_key: str | None = None,
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
        score_batch_size: int = 8,
        score_token_budget: int | None = None,
        score_temperature: float = 1.0,
    ) -> None:
        super().__init__()
        engine = model if is_resident_engine(model) else None
        if engine is not None:
            model, tokenizer = engine.model, tokenizer if tokenizer is not None else engine.get_tokenizer()
        if isinstance(model, str):
            model, loaded_tokenizer = load_causal_lm(model, device=str(device) if device is not None else "cpu")
            if tokenizer is None:
                tokenizer = loaded_tokenizer
        if isinstance(tokenizer, str):
            tokenizer = _load_tokenizer(tokenizer)
        if tokenizer is None:
            name = getattr(model, "name_or_path", None) or getattr(
                getattr(model, "config", None), "_name_or_path", None
            )
            if name and os.path.isdir(str(name)):
                tokenizer = _load_tokenizer(str(name))
        if score_batch_size <= 0:
            raise ValueError(f"score_batch_size must be positive, got {score_batch_size}")
        if score_token_budget is not None and score_token_budget <= 0:
            raise ValueError(f"score_token_budget must be positive, got {score_token_budget}")
        if not score_temperature > 0:
            raise ValueError(f"score_temperature must be > 0, got {score_temperature}")
        self.model = model
        self.score_batch_size = int(score_batch_size)
        self.score_token_budget = score_token_budget
        self.score_temperature = float(score_temperature)
        if pad_model_input is not None and generate:
            raise ValueError("pad_model_input is not supported when generate=True.")
        self.pad_model_input = True if pad_model_input is None else pad_model_input
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
        hf_kwargs: dict[str, Any] = {}
        for key, value in standardized.items():
            if key not in self.COMMON_GENERATION_PARAMS:
                continue
            if key == "stop_sequences" and engine is None:
                warnings.warn(
                    "stop_sequences parameter is not yet fully supported in TransformersWrapper. "
                    "Use eos_token_id or implement custom stopping criteria for full support.",
                    UserWarning,
                    stacklevel=2,
                )
            elif key == "logprobs":
                hf_kwargs["output_scores"] = value
            else:
                hf_kwargs[key] = value
        hf_kwargs.update(self._get_wrapper_specific_kwargs(standardized, "transformers"))
        self._setup_samples(num_samples, int(hf_kwargs.get("num_return_sequences", 1)), inplace)
        if self.num_samples is not None:
            hf_kwargs["num_return_sequences"] = self.num_samples
        if not generate:
            hf_kwargs["max_new_tokens"] = 1
        hf_kwargs.setdefault("tokenizer", self.tokenizer)
        hf_kwargs.setdefault("output_logits", self.return_log_probs)
        hf_kwargs.setdefault("return_dict_in_generate", True)
        self.generate_kwargs = hf_kwargs
        self._in_get_dist_call = False
        if engine is not None:
            self._setup_engine(engine, standardized)

    def get_new_version(self, **kwargs: Any) -> TransformersWrapper:
        """A wrapper on the same model with some settings changed, e.g. ``get_new_version(generate=False)``.

        Unchanged settings are copied; a default ``input_key`` follows the new ``input_mode`` / ``generate``
        (TorchRL copies the old key, so a scoring copy of a generating wrapper would read the prompt).
        """
        model = kwargs.pop("model", self.engine if self.engine is not None else self.model)
        constructor = self._new_version_kwargs(kwargs)
        constructor.setdefault("score_batch_size", self.score_batch_size)
        constructor.setdefault("score_token_budget", self.score_token_budget)
        constructor.setdefault("score_temperature", self.score_temperature)
        return type(self)(model, **constructor)

    # --- backend primitives ------------------------------------------------------------------------
    @property
    def _model_device(self) -> torch.device:
        for tensor in self.model.parameters():
            return tensor.device
        return torch.device("cpu")

    @torch.no_grad()
    def _generate_rows(self, prompts: list[torch.Tensor]) -> list[list[tuple[torch.Tensor, torch.Tensor | None]]]:
        pad = self.padding_value if self.padding_value is not None else 0
        ids, mask = as_padded_tensor([p.cpu() for p in prompts], pad, "left", return_mask=True)
        kwargs = dict(self.generate_kwargs)
        kwargs.pop("output_logits", None)
        kwargs.pop("return_dict_in_generate", None)
        kwargs.setdefault("pad_token_id", pad)
        if kwargs.get("tokenizer") is None:
            kwargs.pop("tokenizer", None)
        device = self._device or self._model_device
        new, log_probs = generate_with_log_probs(self.model, ids.long().to(device), mask.to(device), **kwargs)
        stop_ids = stop_token_ids(self.model, self.tokenizer) if self.tokenizer is not None else set()
        extra_eos = kwargs.get("eos_token_id")
        if extra_eos is not None:
            stop_ids |= set(extra_eos if isinstance(extra_eos, (list, tuple)) else [extra_eos])
        per_prompt = self.num_samples or 1
        rows: list[list[tuple[torch.Tensor, torch.Tensor | None]]] = []
        for i in range(len(prompts)):
            samples = []
            for j in range(per_prompt):
                k = i * per_prompt + j
                length = _response_length(new[k], stop_ids, pad)
                samples.append(
                    (new[k, :length].clone(), log_probs[k, :length].clone() if self.return_log_probs else None)
                )
            rows.append(samples)
        return rows

    def _score_rows(self, sequences: list[torch.Tensor]) -> list[torch.Tensor]:
        if not self.pad_model_input:
            return self._score_packed_rows(sequences)
        pad = self.padding_value if self.padding_value is not None else 0
        device = self._device or self._model_device
        out: list[torch.Tensor] = []
        for start in range(0, len(sequences), self.score_batch_size):
            chunk = [s.cpu() for s in sequences[start : start + self.score_batch_size]]
            ids, mask = as_padded_tensor(chunk, pad, "left", return_mask=True)
            config = getattr(self.model, "config", None)
            max_len = getattr(config, "max_position_embeddings", None)
            if max_len is not None and ids.shape[-1] > max_len:
                raise ValueError(
                    f"Input sequence length ({ids.shape[-1]}) exceeds model's max_position_embeddings ({max_len}). "
                    "Consider truncating or splitting your input."
                )
            log_probs, _ = teacher_forced_log_probs(
                self.model, ids.long().to(device), mask.to(device), temperature=self.score_temperature
            )
            for row, seq in enumerate(chunk):
                out.append(log_probs[row, ids.shape[1] - seq.numel() :])
        return out

    def _score_packed_rows(self, sequences: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per-token log-probs of each sequence (its first token: 0), several sequences packed into one row."""
        from llmrl_core.trainer.batch import TrainSample, pack_samples, plan_micro_batches
        from llmrl_core.trainer.scoring import score_packed

        device = self._device or self._model_device
        rows = [s.cpu().long().tolist() for s in sequences]
        if self.score_token_budget is not None:
            plan = plan_micro_batches([len(r) for r in rows], self.score_token_budget)
        else:
            size = self.score_batch_size
            plan = [list(range(i, min(i + size, len(rows)))) for i in range(0, len(rows), size)]
        out: list[torch.Tensor | None] = [None] * len(rows)
        for group in plan:
            samples = [TrainSample(prompt_ids=rows[i][:1], response_ids=rows[i][1:]) for i in group]
            scores = score_packed(self.model, pack_samples(samples).to(device), temperature=self.score_temperature)
            for row, i in enumerate(group):
                first = scores.log_probs.new_zeros(1)
                out[i] = torch.cat([first, scores.log_probs[row, : len(rows[i]) - 1]])
        return [r for r in out if r is not None]

    def _logits_rows(self, sequences: list[torch.Tensor]) -> list[torch.Tensor]:
        from llmrl_core.modules.policies.distributions import logits_rows

        pad = self.padding_value if self.padding_value is not None else 0
        device = self._device or self._model_device
        out: list[torch.Tensor] = []
        for start in range(0, len(sequences), self.score_batch_size):
            out.extend(logits_rows(self.model, sequences[start : start + self.score_batch_size], pad, device))
        return out


def _response_length(row: torch.Tensor, stop_ids: set[int], pad: int) -> int:
    """Length of a generated row: through its first stop token, else without the trailing padding."""
    tokens = row.tolist()
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return i + 1
    length = len(tokens)
    while length and tokens[length - 1] == pad and pad not in stop_ids:
        length -= 1
    return length
