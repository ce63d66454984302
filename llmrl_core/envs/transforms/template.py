"""``TemplateTransform`` and ``Tokenizer``: render and tokenize the env's prompts for a policy.

A ChatEnv in ``history`` mode hands out conversations; a policy that wants text or token ids can either run
the env in ``text``/``tokens`` mode, or append these transforms: ``TemplateTransform`` fills ``output.text``
with each slot's chat rendered through the tokenizer's template (or a named one), ``Tokenizer`` fills
``output.tokens`` by tokenizing ``output.text`` (run it after TemplateTransform).
"""

from __future__ import annotations

from typing import Any

import torch

from llmrl_core.envs.transforms.base import Transform
from llmrl_core.envs.types import EnvOutput


class TemplateTransform(Transform):
    """Renders each slot's Conversation into ``output.text`` (with the generation prompt for active slots)."""

    def __init__(
        self,
        tokenizer: Any = None,
        chat_template: str | None = None,
        chat_template_name: str | None = None,
        **template_kwargs: Any,
    ) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.chat_template_name = chat_template_name
        self.template_kwargs = template_kwargs

    def on_output(self, output: EnvOutput) -> None:
        """Set ``output.text``."""
        done = output.done.tolist()
        output.text = [
            history.apply_chat_template(  # type: ignore[misc]
                self.tokenizer,
                add_generation_prompt=not is_done,
                chat_template=self.chat_template,
                chat_template_name=self.chat_template_name,
                **self.template_kwargs,
            )
            for history, is_done in zip(output.history, done, strict=True)
        ]


class Tokenizer(Transform):
    """Tokenizes ``output.text`` into ``output.tokens`` (1-D long tensors, no special tokens added)."""

    def __init__(self, tokenizer: Any, add_special_tokens: bool = False) -> None:
        super().__init__()
        if tokenizer is None:
            raise ValueError("Tokenizer transform needs a tokenizer")
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens

    def on_output(self, output: EnvOutput) -> None:
        """Set ``output.tokens`` from ``output.text``."""
        if output.text is None:
            raise ValueError(
                "Tokenizer transform needs output.text: use input_mode='text' or a TemplateTransform first"
            )
        ids = self.tokenizer(output.text, add_special_tokens=self.add_special_tokens)["input_ids"]
        output.tokens = [torch.tensor(row, dtype=torch.long) for row in ids]
