"""llmrl's engine mode of the policy wrappers: a wrapper built on a *resident engine* (a ``vLLMWorker`` or
``TransformersWorker``, what the flows' rollout workers hold) samples through the engine's own ``generate``
(:class:`EngineMode`, a part of :class:`~llmrl_core.modules.policies.llm_wrapper_base.LLMWrapperBase`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import torch

from llmrl_core.modules.backends.types import SamplingConfig

# what a wrapper on a resident engine takes in generate_kwargs (the engine's SamplingConfig)
ENGINE_GENERATE_KWARGS = frozenset(
    {"max_new_tokens", "temperature", "top_p", "do_sample", "seed", "stop_sequences", "stop", "num_return_sequences"}
)


def is_resident_engine(model: Any) -> bool:
    """Whether ``model`` is one of llmrl's resident engines (a ``vLLMWorker`` / ``TransformersWorker``: it samples
    token-id prompts with ``generate(prompt_ids, sampling, n)`` and knows its policy version)."""
    return hasattr(model, "generate") and hasattr(model, "policy_version") and hasattr(model, "get_tokenizer")


class EngineMode:
    """The wrapper's calls on a resident engine: set up by ``_setup_engine``, sampled by ``_engine_rows``, built by
    the classmethod ``on_engine`` (what ``engine.policy(...)`` returns)."""

    engine: Any = None  # the resident engine this wrapper samples through (None: the backend's own call)
    progress: bool = False  # the engine's progress bar over each call's prompts (vLLM engines)

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
    ) -> Self:
        """This wrapper on a resident engine (what ``engine.policy(...)`` returns): ``sampling`` as its
        ``generate_kwargs``, ``progress`` the engine's bar, ``kwargs`` for a subclass's own arguments."""
        generate_kwargs = (sampling or SamplingConfig()).as_kwargs()
        wrapper = cls(engine, input_mode=input_mode, generate_kwargs=generate_kwargs, **kwargs)
        wrapper.progress = progress
        return wrapper
