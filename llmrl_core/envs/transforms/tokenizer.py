"""``Tokenizer``: TorchRL's tokenizing TensorDict transform (strings under ``in_keys`` -> ids under ``out_keys``).

Called on a TensorDict (``Tokenizer(in_keys=["text"], out_keys=["tokens"], tokenizer=tok)(td)``) or appended to an
env (it runs on every step's ``"next"`` data and on resets, as TorchRL's does), it tokenizes the strings under each
``in_key`` and writes the ids under the matching ``out_key``: one string gives a 1-D tensor, a batch of strings a
padded ``(B, T)`` tensor (the tokenizer's padding side and pad token; ``max_length`` pads every row to that
length). With ``return_attention_mask`` (the default) the mask is written beside the ids, under the out key's last
name replaced by ``"attention_mask"``. The inverse (``in_keys_inv``/``out_keys_inv``) decodes ids back to strings.

``tokenizer=None`` uses the packaged default model's tokenizer (TorchRL downloads ``bert-base-uncased``; nothing
is downloaded here); a string is a tokenizer path or id for ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDictBase
from tensordict.utils import NestedKey

from llmrl_core.envs.tensordict_io import plain_value
from llmrl_core.envs.transforms.td_base import Transform, set_missing_tolerance


def _mask_key(key: NestedKey) -> NestedKey:
    """The attention mask's key: ``key`` with its last name replaced by ``"attention_mask"``."""
    return (*key[:-1], "attention_mask") if isinstance(key, tuple) else "attention_mask"


def _load_tokenizer(tokenizer: Any) -> Any:
    from transformers import AutoTokenizer

    if tokenizer is None:
        from llmrl_core.model_store import ensure_default_model

        return AutoTokenizer.from_pretrained(str(ensure_default_model()))
    if isinstance(tokenizer, str):
        return AutoTokenizer.from_pretrained(tokenizer)
    return tokenizer


class Tokenizer(Transform):
    """Tokenizes the strings under ``in_keys`` into ids under ``out_keys`` (TorchRL's arguments and defaults; see
    the module docstring); the inverse decodes ids under ``out_keys_inv`` into strings under ``in_keys_inv``."""

    invertible = True

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        in_keys_inv: Sequence[NestedKey] | None = None,
        out_keys_inv: Sequence[NestedKey] | None = None,
        *,
        tokenizer: Any = None,
        use_raw_nontensor: bool = False,
        additional_tokens: list[str] | None = None,
        skip_special_tokens: bool = True,
        add_special_tokens: bool = False,
        padding: bool = True,
        max_length: int | None = None,
        return_attention_mask: bool = True,
        missing_tolerance: bool = True,
        call_before_reset: bool = False,
    ) -> None:
        if in_keys is not None and out_keys is None:
            out_keys = in_keys
        if in_keys_inv is not None and out_keys_inv is None:
            out_keys_inv = in_keys_inv
        for given, name in ((in_keys, "in_keys"), (out_keys, "out_keys"), (in_keys_inv, "in_keys_inv")):
            if given is not None and not isinstance(given, str | tuple | list):
                raise TypeError(
                    f"Tokenizer: {name} must be keys, got {type(given).__name__} (pass the tokenizer as tokenizer=...)"
                )
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        if len(self.in_keys) != len(self.out_keys) or len(self.in_keys_inv) != len(self.out_keys_inv):
            raise ValueError(
                f"Tokenizer: in_keys {self.in_keys} and out_keys {self.out_keys} (and the inverse keys) must pair up"
            )
        self.tokenizer = _load_tokenizer(tokenizer)
        if additional_tokens:
            self.tokenizer.add_tokens(additional_tokens)
        self.use_raw_nontensor = use_raw_nontensor
        self.skip_special_tokens = skip_special_tokens
        self.add_special_tokens = add_special_tokens
        self.padding = padding
        self.max_length = max_length
        self.return_attention_mask = return_attention_mask
        self.call_before_reset = call_before_reset
        self._missing_tolerance = missing_tolerance

    # --- tokenizing ------------------------------------------------------------------------------
    def call_tokenizer_fn(self, value: Any) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Ids of one string (1-D) or of a batch of strings (padded 2-D), with the attention mask when asked."""
        if not self.use_raw_nontensor:
            value = plain_value(value)
        kwargs: dict[str, Any] = {
            "add_special_tokens": self.add_special_tokens,
            "return_attention_mask": self.return_attention_mask,
            "return_tensors": "pt",
        }
        if self.max_length is not None:
            kwargs.update(padding="max_length", max_length=self.max_length)
        elif not isinstance(value, str):
            kwargs["padding"] = self.padding
        encoded = self.tokenizer(value, **kwargs)
        ids = encoded["input_ids"][0] if isinstance(value, str) else encoded["input_ids"]
        if not self.return_attention_mask:
            return ids
        mask = encoded["attention_mask"][0] if isinstance(value, str) else encoded["attention_mask"]
        return ids, mask

    def call_tokenizer_inv_fn(self, value: torch.Tensor) -> NonTensorData | NonTensorStack:
        """Strings of ids: one for a 1-D tensor, one per row of a 2-D one."""
        if value.ndim == 1:
            return NonTensorData(self.tokenizer.decode(value.int(), skip_special_tokens=self.skip_special_tokens))
        texts = self.tokenizer.batch_decode(value.int(), skip_special_tokens=self.skip_special_tokens)
        return NonTensorStack(*texts)

    def _tokenize_into(self, tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            value = tensordict.get(in_key, None)
            if value is None:
                if not self.missing_tolerance:
                    raise KeyError(f"{self}: {in_key!r} not found in tensordict {tensordict}")
                continue
            result = self.call_tokenizer_fn(value)
            if self.return_attention_mask:
                result, mask = result
                tensordict.set(_mask_key(out_key), mask)
            tensordict.set(out_key, result)
        return tensordict

    # --- the transform hooks ---------------------------------------------------------------------
    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._tokenize_into(next_tensordict)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._tokenize_into(tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        if self.call_before_reset:
            return tensordict_reset
        with set_missing_tolerance(self, True):
            return self._call(tensordict_reset)

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys_inv, self.out_keys_inv, strict=True):
            ids = tensordict.get(out_key, None, as_padded_tensor=True)
            if ids is not None:
                tensordict.set(in_key, self.call_tokenizer_inv_fn(ids))
            elif not self.missing_tolerance:
                raise KeyError(f"{out_key!r} not found in tensordict {tensordict}")
        return tensordict

    def __repr__(self) -> str:
        return f"Tokenizer(in_keys={self.in_keys}, out_keys={self.out_keys}, tokenizer={type(self.tokenizer).__name__})"
