"""A resident Transformers model as a rollout engine: ``TransformersWorker`` (``rollout.backend: transformers``).

It has the interface of :class:`~llmrl_core.modules.backends.vllm.worker.vLLMWorker` that the rollout actors, the
episode
loop and the evaluations use (``generate`` with the sampler's log-probs, ``score``, ``load_weights`` with the
policy version, ``weights_fingerprint``, ``policy``, ``close``), so every flow runs where vLLM is not installed
(a CUDA or torch version vLLM ships no wheel for, a workstation). vLLM stays the default and the fast path: this
engine samples with ``model.generate`` (no paged KV cache, no continuous batching).

Sampling follows the engine's ``logprobs_mode`` as vLLM does: ``processed_logprobs`` records the log-prob of each
token under the distribution it was drawn from (temperature and top-p applied), ``raw_logprobs`` under the
unscaled model. Prompts of one call are sampled in batches of at most ``max_batch`` sequences, each seeded with
``seed + its first sequence's index`` (a call with the same prompts and seed samples the same tokens again).
Weights arrive only as a checkpoint (file, bytes or state dict): there is no NCCL group on this engine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from llmrl_core.data.tensors import as_padded_tensor
from llmrl_core.modules.backends.transformers.scoring import (
    generate_with_log_probs,
    load_causal_lm,
    stop_token_ids,
    teacher_forced_log_probs,
)
from llmrl_core.modules.backends.types import Completion, EngineConfig, SamplingConfig

NO_WEIGHT_GROUP = (
    "rollout.backend=transformers loads each version from its checkpoint and joins no NCCL weight group; "
    "set rollout.weight_sync=checkpoint (or auto)"
)


class TransformersWorker:
    """One resident Hugging Face causal LM used as a rollout engine, plus the policy version of its weights."""

    def __init__(self, config: EngineConfig | None = None, max_batch: int = 64, score_batch_size: int = 8) -> None:
        from llmrl_core.hardware import choose_dtype

        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.config = config or EngineConfig(backend="transformers")
        if self.config.tensor_parallel_size > 1:
            raise ValueError(
                f"tensor_parallel_size={self.config.tensor_parallel_size}: rollout.backend=transformers runs one "
                "model per engine; use rollout.backend=vllm for tensor parallelism"
            )
        device = self.config.resolved_device()
        self.dtype = choose_dtype(self.config.dtype, device).dtype
        self.model, self.tokenizer = load_causal_lm(self.config.model, dtype=self.dtype, device=device)
        self.max_batch = max_batch
        self.score_batch_size = score_batch_size
        self.stop_ids = stop_token_ids(self.model, self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.stop_ids, default=0)
        self.policy_version: int | str = 0
        self.last_reload_s = 0.0
        self._fingerprint: str | None = None

    def get_tokenizer(self) -> Any:
        """The engine's tokenizer."""
        return self.tokenizer

    def policy(
        self,
        input_mode: str = "tokens",
        sampling: SamplingConfig | None = None,
        progress: bool = False,
        cls: type | None = None,
        **kwargs: Any,
    ) -> Any:
        """TorchRL's :class:`~llmrl_core.modules.policies.TransformersWrapper` (or ``cls``, a subclass, with
        ``kwargs``) on this engine, the episode loop's policy: it samples through :meth:`generate`; ``progress`` is
        accepted for the vLLM engine's sake."""
        from llmrl_core.modules.policies import TransformersWrapper

        return (cls or TransformersWrapper).on_engine(self, input_mode, sampling, progress, **kwargs)

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live."""
        return next(self.model.parameters()).device

    @torch.no_grad()
    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        sampling: SamplingConfig | None = None,
        n: int = 1,
        progress: bool | Callable[[int, int], None] = False,
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt (token-id prompts), with the sampler's log-probs (see the module
        docstring). A response ends at the first stop token (included) or at the first ``sampling.stop`` string
        (its tokens kept up to the one that completes it, the text cut before it, as vLLM does). ``progress``: a
        callback ``(answers done, answers)`` called after each batch (a bool is accepted for vLLM's sake)."""
        cfg = sampling or SamplingConfig()
        prompts = [list(p) for p in prompt_token_ids for _ in range(n)]
        kwargs: dict[str, Any] = dict(
            max_new_tokens=cfg.max_new_tokens,
            do_sample=cfg.temperature > 0,
            pad_token_id=self.pad_id,
            eos_token_id=sorted(self.stop_ids) or None,
            processed=self.config.logprobs_mode == "processed_logprobs",
        )
        if cfg.temperature > 0:
            kwargs.update(temperature=cfg.temperature, top_p=cfg.top_p, top_k=0)
        if cfg.stop:
            kwargs.update(stop_strings=list(cfg.stop), tokenizer=self.tokenizer)
        completions: list[Completion] = []
        for start in range(0, len(prompts), self.max_batch):
            batch = prompts[start : start + self.max_batch]
            ids, mask = as_padded_tensor(batch, padding_value=self.pad_id, padding_side="left", return_mask=True)
            with torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device]):
                if cfg.seed is not None:
                    torch.manual_seed(cfg.seed + start)
                new, sampled = generate_with_log_probs(self.model, ids, mask, **kwargs)
            for row in range(new.shape[0]):
                length, reason, text = self._response_end(new[row], cfg.stop)
                tokens = new[row, :length].tolist()
                completions.append(Completion(batch[row], tokens, sampled[row, :length].tolist(), text, reason))
            if callable(progress):
                progress(len(completions), len(prompts))
        return [completions[i * n : (i + 1) * n] for i in range(len(prompt_token_ids))]

    def _response_end(self, row: torch.Tensor, stop: Sequence[str]) -> tuple[int, str, str]:
        """``(length, finish reason, text)`` of a generated row: up to and including the first stop token, or up to
        the token that completes the first stop string (the text cut before that string), else the whole row."""
        ids = row.tolist()
        length, reason = len(ids), "length"
        for i, token in enumerate(ids):
            if token in self.stop_ids:
                length, reason = i + 1, "stop"
                break

        def decode(count: int) -> str:
            return self.tokenizer.decode(ids[:count], skip_special_tokens=True)

        def first_stop(text: str) -> int:
            found = [text.find(s) for s in stop if s and s in text]
            return min(found) if found else -1

        text = decode(length)
        if stop and first_stop(text) >= 0:
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

    @torch.no_grad()
    def score(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Teacher-forced log-probs of ``responses`` under the current weights (the raw model distribution), in
        micro-batches of ``score_batch_size`` sequences (the vocabulary-sized logits dominate memory)."""
        out: list[torch.Tensor] = []
        for start in range(0, len(prompts), self.score_batch_size):
            chunk = range(start, min(start + self.score_batch_size, len(prompts)))
            seqs = [list(prompts[i]) + list(responses[i]) for i in chunk]
            ids, mask = as_padded_tensor(seqs, padding_value=self.pad_id, return_mask=True)
            token_lp, _ = teacher_forced_log_probs(self.model, ids, mask)
            for row, i in enumerate(chunk):
                begin = len(prompts[i])
                out.append(token_lp[row, begin : begin + len(responses[i])].cpu())
        return out

    def load_weights(
        self, weights: Mapping[str, torch.Tensor] | bytes | str | os.PathLike, version: int | str
    ) -> int | str:
        """Load new weights (state dict, safetensors bytes or file path) and record ``version``; a state dict that
        does not fit the model (a tensor missing or unknown) is refused and the held weights are kept."""
        from llmrl_core.weight_sync.serialization import state_dict_from
        from llmrl_core.weight_sync.updater import spell_out_tied_names

        state = state_dict_from(weights)
        # a tied tensor may travel under either name; the model's state dict lists both
        spell_out_tied_names(state, bool(getattr(self.model.config, "tie_word_embeddings", False)))
        expected = set(self.model.state_dict())
        missing, unexpected = expected - set(state), set(state) - expected
        if missing or unexpected:
            raise ValueError(
                f"weights for version {version} do not fit the engine's model {self.config.model or 'default'}: "
                f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
            )
        start = time.perf_counter()
        with torch.no_grad():
            self.model.load_state_dict(state)
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        self.last_reload_s = time.perf_counter() - start
        self._fingerprint = None
        self.policy_version = version
        return version

    def weights_fingerprint(self) -> dict[str, str]:
        """``{"fingerprint", "dtype"}`` of the weights the engine holds
        (:mod:`llmrl_core.weight_sync.fingerprint`), computed once per load."""
        from llmrl_core.weight_sync.fingerprint import weights_fingerprint

        if self._fingerprint is None:
            tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
            self._fingerprint = weights_fingerprint(self.model.state_dict(), self.dtype, tied=tied)
        return {"fingerprint": self._fingerprint, "dtype": self.dtype}

    def weight_group_size(self) -> int:
        """Refused: this engine joins no NCCL weight group."""
        raise RuntimeError(NO_WEIGHT_GROUP)

    def join_weight_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int) -> None:
        """Refused: this engine joins no NCCL weight group."""
        raise RuntimeError(NO_WEIGHT_GROUP)

    def receive_weights(self, metadata: Sequence[tuple[str, str, tuple[int, ...]]], version: int | str) -> int | str:
        """Refused: this engine joins no NCCL weight group."""
        raise RuntimeError(NO_WEIGHT_GROUP)

    def close(self) -> None:
        """Drop the model and free its memory (idempotent); the worker cannot be used afterwards."""
        model, self.model = getattr(self, "model", None), None
        if model is None:
            return
        on_cuda = model.device.type == "cuda"
        del model
        import gc

        gc.collect()
        if on_cuda:
            torch.cuda.empty_cache()
