"""TorchRL's ``RetrieveLogProb``: a scoring model's per-token log-probs of the full conversation, stored in the data
(part of :mod:`llmrl_core.envs.transforms.kl`)."""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Any

import torch
from tensordict import TensorDictBase, unravel_key
from tensordict.utils import NestedKey

from llmrl_core.envs.transforms.kl_rows import (
    on_device,
    pad_rows,
    rows_of,
    write_rows,
)
from llmrl_core.envs.transforms.td_base import Transform, forward_as_step


# --- RetrieveLogProb ---------------------------------------------------------------------------------
class RetrieveLogProb(Transform):
    """Store a scoring model's per-token log-probs of the full conversation.

    Args:
        model: a policy wrapper with ``generate=False`` and ``return_log_probs=True``
            (:class:`~llmrl_core.modules.policies.TransformersWrapper` or
            :class:`~llmrl_core.modules.policies.vLLMWrapper`).

    Keyword Args:
        log_probs_full_key: where the log-probs are written; default ``(model.log_probs_key, "full")`` (a key that
            is not a tuple ending in ``"full"`` gets a warning).
        assistant_only: zero the log-probs of non-assistant tokens (default True; needs ``input_mode="history"``,
            which gives the assistant mask).
        tokenizer_kwargs: chat-template arguments (defaults as TorchRL's; the model's own settings tokenize).
        detach: compute without an autograd graph (default True).
        device: the model is moved there, and incoming TensorDicts are moved there for the call.
        tokenizer: kept for TorchRL compatibility (the model's tokenizer is used).
        padding_side: padding side of the stored log-probs when the model pads its output (default ``"left"``).

    ``transform(td)`` scores ``td`` and writes into ``td["next"]`` when it exists, else into ``td``.
    """

    def __init__(
        self,
        model: Any,
        *,
        log_probs_full_key: NestedKey | None = None,
        assistant_only: bool = True,
        tokenizer_kwargs: dict | None = None,
        detach: bool = True,
        device: torch.device | None = None,
        tokenizer: Any = None,
        padding_side: str = "left",
    ) -> None:
        if log_probs_full_key is None:
            log_probs_full_key = (model.log_probs_key, "full")
        elif not isinstance(log_probs_full_key, tuple) or log_probs_full_key[-1] != "full":
            warnings.warn(
                f"The log_probs_full_key {log_probs_full_key} is not a tuple or does not end with 'full'. "
                "This may cause issues with the KL computation. "
                "Please use a tuple with the log_probs_key and 'full' as the last element.",
                stacklevel=2,
            )
        self.log_probs_full_key = log_probs_full_key
        super().__init__(in_keys=list(model.in_keys), out_keys=[log_probs_full_key])
        self._io_device = None
        if device is not None:
            model = model.to(device)
            self._io_device = torch.device(device)
        self.model = model
        self.assistant_only = assistant_only
        self.detach = detach
        self.tokenizer = tokenizer
        self.padding_side = padding_side
        tokenizer_kwargs = dict(tokenizer_kwargs or {})
        tokenizer_kwargs.setdefault("return_assistant_tokens_mask", True)
        tokenizer_kwargs.setdefault("tokenize", True)
        tokenizer_kwargs.setdefault("return_dict", True)
        tokenizer_kwargs.setdefault("padding", False)
        tokenizer_kwargs.setdefault("add_generation_prompt", False)
        self.tokenizer_kwargs = tokenizer_kwargs
        self._validate_model_config(model)

    @property
    def device(self) -> torch.device | None:
        """Where incoming TensorDicts are moved for the call (the constructor's ``device``)."""
        return self._io_device

    def _validate_model_config(self, model: Any) -> None:
        if not getattr(model, "return_log_probs", True):
            raise ValueError("The model must have `return_log_probs=True` to use the `RetrieveLogProb` transform.")
        if getattr(model, "generate", True):
            raise ValueError("The model must have `generate=False` to use the `RetrieveLogProb` transform.")
        input_mode = getattr(model, "input_mode", "history")
        if self.assistant_only and input_mode != "history":
            raise ValueError(
                f"The model must have `input_mode='history'` when `assistant_only=True`. "
                f"Current input_mode is '{input_mode}'. "
                f"To use input_mode '{input_mode}', set `assistant_only=False`."
            )

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return forward_as_step(self, tensordict)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        original_device = tensordict.device if self._io_device is not None else None
        tensordict = on_device(tensordict, self._io_device)
        next_tensordict = on_device(next_tensordict, self._io_device)
        with torch.no_grad() if self.detach else nullcontext():
            scored = self.model(tensordict.copy())
        model_key = (self.model.log_probs_key, "full")
        log_probs = rows_of(scored.get(model_key, as_list=True))
        if self.assistant_only:
            masks = scored.get(("masks", "all_assistant_mask"), None, as_list=True)
            if masks is None:
                raise ValueError(
                    "assistant_only=True needs the assistant mask ('masks', 'all_assistant_mask') from the model "
                    "(input_mode='history')"
                )
            log_probs = [
                lp.masked_fill(~m.bool().to(lp.device), 0.0) for lp, m in zip(log_probs, rows_of(masks), strict=True)
            ]
        if self.detach:
            log_probs = [lp.detach() for lp in log_probs]
        target = unravel_key(self.log_probs_full_key)
        if (
            isinstance(target, tuple)
            and len(target) == 2
            and target[0] == unravel_key(self.model.log_probs_key)
            and target[0] not in next_tensordict.keys()
        ):
            # the model's own container (LogProbs: prompt / response / full / padded) moves over, as in TorchRL
            next_tensordict.set(target[0], scored.get(target[0]))
        if self.model.pad_output:
            next_tensordict.set(target, pad_rows(log_probs, self.padding_side))
        else:
            write_rows(next_tensordict, target, log_probs)
        if original_device is not None:
            next_tensordict = next_tensordict.to(original_device)
        return next_tensordict

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(log_probs_full_key={self.log_probs_full_key}, "
            f"assistant_only={self.assistant_only}, model={type(self.model).__name__})"
        )
