"""``vLLMWrapper``: a ``vllm.LLM`` engine behind the same policy interface as ``TransformersWrapper``."""

from __future__ import annotations

from typing import Any

import torch

from llmrl_core.policies.base import InputMode, LLMWrapperBase, PolicyOutput, SamplingConfig
from llmrl_core.policies.vllm_engine import EngineConfig, generate, make_llm


class vLLMWrapper(LLMWrapperBase):  # noqa: N801 - TorchRL's name
    """Sampling (and teacher-forced scoring) on a vLLM engine.

    ``llm`` is a ``vllm.LLM``, a :class:`~llmrl_core.policies.vllm_worker.vLLMWorker`, or an
    :class:`~llmrl_core.policies.vllm_engine.EngineConfig` to start one (``None``: the packaged model).
    Scoring uses vLLM's ``prompt_logprobs`` over prompt + response, so it needs no second model.
    """

    def __init__(
        self,
        llm: Any = None,
        *,
        input_mode: InputMode = "history",
        generate: bool = True,
        sampling: SamplingConfig | None = None,
        pad_output: bool = False,
        chat_template: str | None = None,
        tokenizer: Any = None,
        progress: bool = False,
    ) -> None:
        self.progress = progress  # vLLM's own progress bar over the prompts of each generate call
        if llm is None or isinstance(llm, EngineConfig):
            llm = make_llm(llm)
        self.llm = getattr(llm, "llm", llm)  # unwrap a vLLMWorker
        super().__init__(
            tokenizer or self.llm.get_tokenizer(),
            input_mode=input_mode,
            generate=generate,
            sampling=sampling,
            return_entropy=False,
            pad_output=pad_output,
            chat_template=chat_template,
        )

    def _generate(self, prompts: list[list[int]]) -> PolicyOutput:
        cfg = self.sampling
        groups = generate(
            self.llm,
            prompts,
            max_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            seed=cfg.seed,
            stop=cfg.stop or None,
            use_tqdm=self.progress,
        )
        completions = [group[0] for group in groups]
        return PolicyOutput(
            tokens=[torch.tensor(p, dtype=torch.long) for p in prompts],
            text_response=[c.text for c in completions],
            tokens_response=[torch.tensor(c.token_ids, dtype=torch.long) for c in completions],
            log_probs=[torch.tensor(c.logprobs, dtype=torch.float32) for c in completions],
            finish_reasons=[c.finish_reason for c in completions],
        )

    def _score(
        self, prompts: list[list[int]], responses: list[list[int]]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        return score_with_vllm(self.llm, prompts, responses), None


def score_with_vllm(llm: Any, prompts: list[list[int]], responses: list[list[int]]) -> list[torch.Tensor]:
    """Log-prob of each response token given its prompt, read from vLLM's ``prompt_logprobs``."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {i} is empty: scoring needs at least one prompt token")
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    seqs = [TokensPrompt(prompt_token_ids=p + r) for p, r in zip(prompts, responses, strict=True)]
    outputs = llm.generate(seqs, params, use_tqdm=False)
    result = []
    for prompt, response, out in zip(prompts, responses, outputs, strict=True):
        steps = out.prompt_logprobs[len(prompt) :]
        result.append(torch.tensor([step[tok].logprob for tok, step in zip(response, steps, strict=True)]))
    return result
