"""Teacher-forced per-token log-probs with transformers: the reference for sampler log-probs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from llmrl_core.model_store import resolve_model

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_causal_lm(model: str | None = None, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer (``None`` is the packaged SmolLM2), in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    path = resolve_model(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype]).to(device).eval()
    return lm, tokenizer


def render_chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template plus the generation prompt."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def score_response_tokens(
    model: Any, prompt_token_ids: Sequence[int], response_token_ids: Sequence[int]
) -> torch.Tensor:
    """Log-prob of each response token given the prompt and the response tokens before it."""
    if not response_token_ids:
        return torch.empty(0)
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_token_ids) + list(response_token_ids)], device=device)
    logits = model(input_ids=ids).logits[0, len(prompt_token_ids) - 1 : -1].float()
    targets = ids[0, len(prompt_token_ids) :]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1).cpu()
