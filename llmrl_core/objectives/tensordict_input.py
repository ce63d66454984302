"""TorchRL's TensorDict input for the objectives: the keys they read, padding, masks and the actor's scores.

A TorchRL objective is called on the collector's batch (``loss(td)``): the sampled sequences under
``("tokens", "full")``, the sampler's log-probs under ``("log_probs", "full")``, the masks under ``("masks", ...)``,
the reference log-probs under ``("next", "ref_log_probs", "full")`` and the ``advantage``. Rows may be ragged (a
lazy stack) or padded; everything here is left-padded into ``(B, T)`` tensors, TorchRL's convention, so the
per-token functions (:func:`~llmrl_core.objectives.grpo.grpo_loss`, :func:`~llmrl_core.objectives.sft.sft_loss`)
take them as they are.

The current policy's log-probs come from the ``actor_network`` itself: a ``TransformersWrapper`` (its model) or a
``transformers`` causal LM, scored by teacher forcing with gradients (``hf_scoring.teacher_forced_log_probs``).
A ``vLLMWrapper`` scores without gradients and is refused with that reason.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

from llmrl_core.data.tensors import as_padded_tensor
from llmrl_core.modules.backends.transformers.scoring import teacher_forced_log_probs

MASKING_STRATEGIES = ("sft", "rlhf", "generic")


def has_key(td: TensorDictBase, key: NestedKey) -> bool:
    """Whether ``td`` holds a (non-None) value at the nested ``key`` (ragged rows included); nothing is copied."""
    return _present(td.get(key, None, as_list=True))


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, list) and any(v is None for v in value))


def rows(td: TensorDictBase, key: NestedKey) -> list[torch.Tensor] | None:
    """The per-row tensors at ``key`` (ragged rows of a lazy stack, or the rows of a padded tensor), or None."""
    value = td.get(key, None, as_list=True)
    return [torch.as_tensor(v) for v in value] if _present(value) else None


def left_padded(td: TensorDictBase, key: NestedKey, padding_value: float | int | bool = 0) -> torch.Tensor | None:
    """The rows at ``key`` left-padded into one ``(B, T)`` tensor (TorchRL's convention; a row's trailing feature
    dimension of 1, as in a per-token advantage ``(T, 1)``, is dropped), or None."""
    found = rows(td, key)
    if found is None:
        return None
    return as_padded_tensor([r.reshape(-1) for r in found], padding_value, "left")


def actor_model(actor_network: Any, owner: str) -> Any:
    """The differentiable model behind ``actor_network`` (a TransformersWrapper's model, or the model itself)."""
    if actor_network is None:
        raise ValueError(f"{owner} has no actor_network: pass a TransformersWrapper or a transformers model")
    if type(actor_network).__name__ == "vLLMWrapper":
        raise ValueError(
            f"{owner}: a vLLMWrapper scores without gradients; train with a TransformersWrapper over the same weights"
        )
    return getattr(actor_network, "model", actor_network)


def score(
    actor_network: Any, tokens: torch.Tensor, attention: torch.Tensor, *, with_entropy: bool, owner: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Teacher-forced log-prob (and entropy) of every token of the left-padded ``tokens`` under the actor."""
    model = actor_model(actor_network, owner)
    device = next(model.parameters()).device
    ids = torch.where(attention, tokens, torch.zeros_like(tokens)).long().to(device)
    log_probs, entropy = teacher_forced_log_probs(model, ids, attention.to(device), return_entropy=with_entropy)
    return log_probs, entropy


def loss_mask(td: TensorDictBase, strategy: str, attention: torch.Tensor, owner: str) -> torch.Tensor:
    """The tokens a loss trains on, by TorchRL's ``masking_strategy``.

    ``"sft"``: the response, i.e. every real token after ``("tokens", "prompt")`` (the assistant mask when the
    batch has no prompt tokens); ``"rlhf"``: the assistant tokens (``("masks", "all_assistant_mask")``);
    ``"generic"``: every real token (``("masks", "all_attention_mask")``, else the non-padding positions).
    """
    if strategy not in MASKING_STRATEGIES:
        raise ValueError(f"{owner}: masking_strategy must be one of {MASKING_STRATEGIES}, got {strategy!r}")
    width = attention.shape[-1]

    def fit(mask: torch.Tensor) -> torch.Tensor:
        mask = mask.bool()
        if mask.shape[-1] != width:
            raise ValueError(
                f"{owner}: a mask of width {mask.shape[-1]} does not match the {width} tokens of ('tokens', 'full')"
            )
        return mask & attention

    assistant = left_padded(td, ("masks", "all_assistant_mask"), False)
    if strategy == "generic":
        given = left_padded(td, ("masks", "all_attention_mask"), False)
        return fit(given) if given is not None else attention.clone()
    if strategy == "sft":
        prompts = rows(td, ("tokens", "prompt"))
        if prompts is not None:
            response = attention.clone()
            for i, prompt in enumerate(prompts):
                start = width - int(attention[i].sum())
                response[i, start : start + prompt.numel()] = False
            return response
    if assistant is None:
        raise ValueError(
            f"{owner}: masking_strategy={strategy!r} needs ('masks', 'all_assistant_mask') in the batch"
            + (" (or ('tokens', 'prompt'))" if strategy == "sft" else "")
        )
    return fit(assistant)


def tokens_and_attention(td: TensorDictBase, key: NestedKey) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequences at ``key`` left-padded, and where they are real: ragged rows give their own lengths, a padded
    tensor takes ``("masks", "all_attention_mask")`` (all True without it)."""
    value = td.get(key, None, as_list=True)
    if isinstance(value, torch.Tensor):
        attention = left_padded(td, ("masks", "all_attention_mask"), False)
        return value.long(), (attention.bool() if attention is not None else torch.ones_like(value, dtype=torch.bool))
    tokens, attention = as_padded_tensor(rows(td, key) or [], 0, "left", return_mask=True)
    return tokens.long(), attention


def chat_tokens(
    td: TensorDictBase,
    tokenizer: Any,
    tokenizer_kwargs: dict[str, Any],
    owner: str,
    history_key: NestedKey = ("history", "full"),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A batch of chats as left-padded ``(tokens, attention, assistant)``, ``(B, T)`` each.

    From ``("tokens", "full")`` and its ``("masks", "all_assistant_mask")`` when the batch has both (what a
    wrapper scored), else by rendering the chats at ``history_key`` with ``tokenizer``'s chat template
    (``tokenizer_kwargs`` passed on). ``assistant`` is None when neither gives an assistant mask.
    """
    if has_key(td, ("tokens", "full")) and has_key(td, ("masks", "all_assistant_mask")):
        tokens, attention = tokens_and_attention(td, ("tokens", "full"))
        return tokens, attention, loss_mask(td, "rlhf", attention, owner)
    history = td.get(history_key, None)
    if history is None:
        raise KeyError(f"{owner}: no {history_key} in the batch (keys: {sorted(map(str, td.keys()))})")
    if tokenizer is None:
        raise ValueError(f"{owner} needs a tokenizer (or an actor_network with one) to read the chats")
    kwargs = {"return_assistant_tokens_mask": True, **tokenizer_kwargs}
    encoded = history.apply_chat_template(tokenizer=tokenizer, tokenize=True, return_dict=True, padding=False, **kwargs)
    ids = [t.long() for t in encoded.get("input_ids", as_list=True)]
    tokens, attention = as_padded_tensor(ids, 0, "left", return_mask=True)
    if "assistant_masks" not in encoded.keys():
        return tokens, attention, None
    masks = [m.bool() for m in encoded.get("assistant_masks", as_list=True)]
    return tokens, attention, as_padded_tensor(masks, False, "left").bool() & attention
