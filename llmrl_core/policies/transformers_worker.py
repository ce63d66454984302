"""A resident Transformers model as a rollout engine: ``TransformersWorker`` (``rollout.backend: transformers``).

It has the interface of :class:`~llmrl_core.policies.vllm_worker.vLLMWorker` that the rollout actors, the episode
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
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from llmrl_core.policies.base import SamplingConfig
from llmrl_core.policies.vllm_engine import Completion, EngineConfig

NO_WEIGHT_GROUP = (
    "rollout.backend=transformers loads each version from its checkpoint and joins no NCCL weight group; "
    "set rollout.weight_sync=checkpoint (or auto)"
)


class TransformersWorker:
    """One resident Hugging Face causal LM used as a rollout engine, plus the policy version of its weights."""

    def __init__(self, config: EngineConfig | None = None, max_batch: int = 64) -> None:
        from llmrl_core.hardware import choose_dtype
        from llmrl_core.policies.hf_scoring import load_causal_lm

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
        self.policy_version: int | str = 0
        self.last_reload_s = 0.0
        self._fingerprint: str | None = None

    def get_tokenizer(self) -> Any:
        """The engine's tokenizer."""
        return self.tokenizer

    def policy(self, input_mode: str = "tokens", sampling: SamplingConfig | None = None, progress: bool = False) -> Any:
        """A :class:`~llmrl_core.policies.transformers_wrapper.TransformersWrapper` on this engine's model (the
        episode loop's policy); ``progress`` is accepted for the vLLM engine's sake and ignored."""
        from llmrl_core.policies.transformers_wrapper import TransformersWrapper

        return TransformersWrapper(
            self.model,
            self.tokenizer,
            input_mode=input_mode,  # type: ignore[arg-type]
            sampling=sampling,
            logprobs_mode=self.config.logprobs_mode,
            max_batch=self.max_batch,
        )

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], sampling: SamplingConfig | None = None, n: int = 1
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt (token-id prompts), with the sampler's log-probs."""
        prompts = [list(p) for p in prompt_token_ids]
        expanded = [p for p in prompts for _ in range(n)]
        out = self.policy(sampling=sampling or SamplingConfig()).sample(expanded)
        completions = [
            Completion(
                expanded[i],
                out.tokens_response[i].tolist(),
                out.log_probs[i].tolist(),
                out.text_response[i],
                out.finish_reasons[i],
            )
            for i in range(len(expanded))
        ]
        return [completions[i * n : (i + 1) * n] for i in range(len(prompts))]

    def score(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Teacher-forced log-probs of ``responses`` under the current weights (the raw model distribution)."""
        return self.policy(input_mode="tokens").score(prompts, responses)

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
