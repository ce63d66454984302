"""``TransformersWrapper``: any Hugging Face causal LM as a policy (generate) or a scorer (log-probs)."""

from __future__ import annotations

from typing import Any

import torch

from llmrl_core.data.tensors import as_padded_tensor
from llmrl_core.policies.base import InputMode, LLMWrapperBase, PolicyOutput, SamplingConfig
from llmrl_core.policies.hf_scoring import gather_log_probs, teacher_forced_log_probs


def _stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class TransformersWrapper(LLMWrapperBase):
    """A transformers ``PreTrainedModel`` behind the policy interface of :mod:`llmrl_core.policies.base`.

    Generation left-pads each batch of at most ``max_batch`` prompts (so every prompt ends where sampling
    starts) and returns the log-prob of each sampled token: under the raw model (``logprobs_mode=
    "raw_logprobs"``, the default) or under the distribution it was drawn from (``"processed_logprobs"``:
    temperature and top-p applied, as vLLM's mode of that name). A response ends at the first stop token
    (included) or at the first ``sampling.stop`` string (its tokens kept up to the one that completes it, the
    text cut before it, as vLLM does). Scoring right-pads prompt + response and reads the log-probs of the
    response tokens in micro-batches of ``score_batch_size`` (the vocabulary-sized logits dominate memory).
    ``model`` may be a loaded model or anything :func:`llmrl_core.model_store.resolve_model` takes, in which
    case it is loaded in ``dtype`` on ``device``.
    """

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        *,
        input_mode: InputMode = "history",
        generate: bool = True,
        sampling: SamplingConfig | None = None,
        return_entropy: bool = False,
        pad_output: bool = False,
        chat_template: str | None = None,
        dtype: str = "float32",
        device: str = "cpu",
        score_batch_size: int = 8,
        logprobs_mode: str = "raw_logprobs",
        max_batch: int = 64,
    ) -> None:
        if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ValueError(f"logprobs_mode must be 'raw_logprobs' or 'processed_logprobs', got {logprobs_mode!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if model is None or isinstance(model, str):
            from llmrl_core.policies.hf_scoring import load_causal_lm

            model, loaded_tokenizer = load_causal_lm(model, dtype=dtype, device=device)
            tokenizer = tokenizer or loaded_tokenizer
        if tokenizer is None:
            raise ValueError("TransformersWrapper needs a tokenizer when given a loaded model")
        super().__init__(
            tokenizer,
            input_mode=input_mode,
            generate=generate,
            sampling=sampling,
            return_entropy=return_entropy,
            pad_output=pad_output,
            chat_template=chat_template,
        )
        self.model = model
        self.score_batch_size = score_batch_size
        self.logprobs_mode = logprobs_mode
        self.max_batch = max_batch
        self.stop_ids = _stop_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.stop_ids, default=0)

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live."""
        return next(self.model.parameters()).device

    @torch.no_grad()
    def _generate(self, prompts: list[list[int]]) -> PolicyOutput:
        cfg = self.sampling
        kwargs: dict[str, Any] = dict(
            max_new_tokens=cfg.max_new_tokens,
            do_sample=cfg.temperature > 0,
            pad_token_id=self.pad_id,
            eos_token_id=sorted(self.stop_ids) or None,
            processed=self.logprobs_mode == "processed_logprobs",
        )
        if cfg.temperature > 0:
            kwargs.update(temperature=cfg.temperature, top_p=cfg.top_p, top_k=0)
        if cfg.stop:
            kwargs.update(stop_strings=list(cfg.stop), tokenizer=self.tokenizer)
        texts, tokens, log_probs, reasons = [], [], [], []
        for start in range(0, len(prompts), self.max_batch):
            batch = prompts[start : start + self.max_batch]
            ids, mask = as_padded_tensor(batch, padding_value=self.pad_id, padding_side="left", return_mask=True)
            with torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device]):
                if cfg.seed is not None:
                    torch.manual_seed(cfg.seed + start)
                new, sampled = generate_with_log_probs(self.model, ids, mask, **kwargs)
            for row in range(new.shape[0]):
                length, reason, text = self._response_end(new[row])
                tokens.append(new[row, :length].clone())
                log_probs.append(sampled[row, :length].clone())
                reasons.append(reason)
                texts.append(text)
        return PolicyOutput(
            tokens=[torch.tensor(p, dtype=torch.long) for p in prompts],
            text_response=texts,
            tokens_response=tokens,
            log_probs=log_probs,
            finish_reasons=reasons,
        )

    def _response_end(self, row: torch.Tensor) -> tuple[int, str, str]:
        """``(length, finish reason, text)`` of a generated row: up to and including the first stop token, or up to
        the token that completes the first stop string (the text cut before that string), else the whole row."""
        ids = row.tolist()
        length, reason = len(ids), "length"
        for i, token in enumerate(ids):
            if token in self.stop_ids:
                length, reason = i + 1, "stop"
                break

        def decode(n: int) -> str:
            return self.tokenizer.decode(ids[:n], skip_special_tokens=True)

        def first_stop(text: str) -> int:
            found = [text.find(s) for s in self.sampling.stop if s and s in text]
            return min(found) if found else -1

        text = decode(length)
        if self.sampling.stop and first_stop(text) >= 0:
            low, high = 1, length  # the shortest prefix whose text holds a stop string (found at high)
            while low < high:
                mid = (low + high) // 2
                if first_stop(decode(mid)) >= 0:
                    high = mid
                else:
                    low = mid + 1
            text = decode(high)
            return high, "stop", text[: first_stop(text)]
        return length, reason, text

    def sample(self, prompts: list[list[int]]) -> PolicyOutput:
        """Sample one response per token-id prompt with this wrapper's sampling settings (the engine entry point
        of :class:`~llmrl_core.policies.transformers_worker.TransformersWorker`)."""
        return self._generate([list(p) for p in prompts])

    @torch.no_grad()
    def _score(
        self, prompts: list[list[int]], responses: list[list[int]]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        log_probs: list[torch.Tensor] = []
        entropies: list[torch.Tensor] = []
        for start in range(0, len(prompts), self.score_batch_size):
            chunk = range(start, min(start + self.score_batch_size, len(prompts)))
            seqs = [prompts[i] + responses[i] for i in chunk]
            ids, mask = as_padded_tensor(seqs, padding_value=self.pad_id, return_mask=True)
            token_lp, ent = teacher_forced_log_probs(self.model, ids, mask, return_entropy=self.return_entropy)
            for row, i in enumerate(chunk):
                begin, end = len(prompts[i]), len(prompts[i]) + len(responses[i])
                log_probs.append(token_lp[row, begin:end].cpu())
                if ent is not None:
                    entropies.append(ent[row, begin:end].cpu())
        return log_probs, (entropies if self.return_entropy else None)


def generate_with_log_probs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, processed: bool = False, **generate_kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``model.generate`` on a left-padded batch: ``(new_tokens, log_probs)``, both ``(N, R)`` on the CPU.

    ``N`` is the batch times ``num_return_sequences`` (the samples of a row are consecutive), ``R`` the longest
    continuation; rows that stopped early are filled with the pad id by ``generate`` (their log-probs there are
    meaningless: trim with the stop tokens). ``log_probs`` is the log-prob of each new token under the model's
    raw logits (before temperature / top-p processing), or, with ``processed=True``, under the scores ``generate``
    sampled from (its logits processors applied: temperature, top-p). ``generate_kwargs`` go to ``model.generate``
    (``output_logits`` / ``output_scores`` and ``return_dict_in_generate`` are forced on).
    """
    device = next(model.parameters()).device
    kwargs = dict(generate_kwargs, return_dict_in_generate=True)
    kwargs["output_scores" if processed else "output_logits"] = True
    out = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device).long(), **kwargs)
    new = out.sequences[:, input_ids.shape[1] :]
    logits = torch.stack(list(out.scores if processed else out.logits), dim=1)
    log_probs = gather_log_probs(logits, new[:, : logits.shape[1]])
    return new.cpu(), log_probs.detach().cpu()
