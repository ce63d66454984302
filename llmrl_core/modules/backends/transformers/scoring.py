"""A transformers causal LM as an engine's parts: loading it, teacher-forced per-token log-probs (the reference for
sampler log-probs) and sampling with the sampled tokens' log-probs."""

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


def gather_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[..., target]`` in fp32: the log-prob of each target under its logits row.

    ``logits`` is ``(..., V)`` and ``targets`` the matching ``(...)`` integer ids. The one log-softmax + gather
    every llmrl scorer uses (teacher forcing here, the sampled tokens of a ``generate`` call, the policy
    wrappers of :mod:`llmrl_core.modules.policies`).
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets.to(logp.device).long().unsqueeze(-1)).squeeze(-1)


def teacher_forced_log_probs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    return_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position log-prob of each token of a padded batch given the tokens before it (one forward pass).

    ``input_ids`` is ``(B, L)``, padded on either side; ``attention_mask`` (``(B, L)``, True on real tokens,
    default all True) also gives the position ids, so a left-padded row is scored exactly as it would be alone.
    Returns ``(log_probs, entropy)``, both ``(B, L)`` and aligned with ``input_ids``: entry ``t`` is about the
    token at ``t`` (its log-prob; the entropy of the distribution it was drawn from); the first real token of a
    row (no context) and padding positions are 0. ``entropy`` is None unless ``return_entropy``. Gradients flow
    when enabled by the caller. ``temperature``: the logits are divided by it first (the distribution a sampler at
    that temperature drew from).
    """
    device = next(model.parameters()).device
    ids = input_ids.to(device)
    mask = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask.to(device).bool()
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=position_ids).logits[:, :-1]
    if temperature != 1.0:
        logits = logits.float() / temperature
    scored = mask[:, 1:] & mask[:, :-1]  # a token with a real token before it
    log_probs = torch.zeros(ids.shape, dtype=torch.float32, device=device)
    log_probs[:, 1:] = torch.where(scored, gather_log_probs(logits, ids[:, 1:]), 0.0)
    entropy = None
    if return_entropy:
        logp = torch.log_softmax(logits.float(), dim=-1)
        entropy = torch.zeros(ids.shape, dtype=torch.float32, device=device)
        entropy[:, 1:] = torch.where(scored, -(logp.exp() * logp).sum(-1), 0.0)
    return log_probs, entropy


@torch.no_grad()
def score_response_tokens(
    model: Any, prompt_token_ids: Sequence[int], response_token_ids: Sequence[int]
) -> torch.Tensor:
    """Log-prob of each response token given the prompt and the response tokens before it."""
    if not response_token_ids:
        return torch.empty(0)
    ids = torch.tensor([list(prompt_token_ids) + list(response_token_ids)])
    log_probs, _ = teacher_forced_log_probs(model, ids)
    return log_probs[0, len(prompt_token_ids) :].cpu()


def stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """The ids that end a response: the model's generation-config EOS id(s) and the tokenizer's EOS."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


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
