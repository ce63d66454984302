"""``TemplateTransform``: render the env's prompts for a policy that wants text.

A ChatEnv in ``history`` mode hands out conversations; a policy that wants text or token ids can either run
the env in ``text``/``tokens`` mode, or append ``TemplateTransform``, which fills ``output.text`` with each slot's
chat rendered through the tokenizer's template (or a named one). TorchRL's ``Tokenizer`` (strings to ids on
TensorDicts) is :mod:`llmrl_core.envs.transforms.tokenizer`.
"""

from __future__ import annotations

from typing import Any

from llmrl_core.envs.transforms.base import SlotTransform
from llmrl_core.envs.types import EnvOutput


class TemplateTransform(SlotTransform):
    """Renders each slot's Conversation into ``output.text`` (with the generation prompt for active slots)."""

    writes_reward = False

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
