"""The tokens-mode bookkeeping of :class:`~llmrl_core.envs.chat_env.ChatEnv` (:class:`SlotTokens`, one of its base
classes): each slot's ids exactly as sampled, next prompt = previous prompt + sampled response ids + the ids of
whatever the chat template adds after them (tool output, next generation prompt), so no re-tokenization drift
enters the log-probs; ``SlotState.policy_mask()`` marks the sampled tokens."""

from __future__ import annotations

from typing import Any

import torch

from llmrl_core.data.chat_templates import ResolvedTemplate, assistant_char_spans
from llmrl_core.data.conversation import Conversation
from llmrl_core.envs.types import SlotState


class SlotTokens:
    """Rendering, encoding and the token segments of the env's slots in tokens mode; the env sets ``tokenizer``,
    ``input_mode``, ``template_kwargs``, ``policy_role``, ``max_prompt_tokens``, ``_template`` and ``end_of_turn``."""

    tokenizer: Any
    input_mode: str
    template_kwargs: dict[str, Any]
    policy_role: str
    max_prompt_tokens: int | None
    _template: ResolvedTemplate
    end_of_turn: str | None

    def _start_tokens(self, slots: list[SlotState]) -> None:
        if self.input_mode == "tokens":
            for slot in slots:
                slot.prompt_text = self._render(slot.history, add_generation_prompt=True)
                slot.token_segments = [self._encode(slot.prompt_text)]
                slot.segment_is_policy = [False]

    def _check_context(self, slot: SlotState) -> None:
        """Tokens mode: truncate a slot whose next prompt would not fit ``max_prompt_tokens`` (its ids end with the
        sampled ones then)."""
        limit = self.max_prompt_tokens
        if limit is not None and not slot.done and sum(len(t) for t in slot.token_segments) > limit:
            slot.info["context_full"] = True  # e.g. a tool printed pages: the next prompt would not fit
            slot.truncate()

    # --- rendering / tokens ----------------------------------------------------------------------
    def _render(self, history: Conversation, add_generation_prompt: bool) -> str:
        return history.apply_chat_template(
            self.tokenizer,
            add_generation_prompt=add_generation_prompt,
            chat_template=self._template.template,
            **self.template_kwargs,
        )  # type: ignore[return-value]

    def _encode(self, text: str) -> torch.Tensor:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def _extend_tokens(self, slot: SlotState) -> None:
        """Tokens mode: add the sampled ids, then the ids of the text the template adds after them."""
        response = slot.last_response
        assert response is not None and slot.prompt_text is not None
        if response.token_ids is not None:
            sampled_ids = response.token_ids.to(torch.long)
            sampled_text = self.tokenizer.decode(sampled_ids.tolist(), skip_special_tokens=False)
        else:
            sampled_text = response.text
            sampled_ids = self._encode(sampled_text)
        slot.token_segments.append(sampled_ids)
        slot.segment_is_policy.append(True)
        consumed = slot.prompt_text + sampled_text
        next_text = self._render(slot.history, add_generation_prompt=not slot.done)
        if not next_text.startswith(consumed):
            # The template renders the turn differently from the sampled text (e.g. it strips whitespace):
            # keep the sampled ids and take the glue from where the template closes the policy turn.
            msgs = [m.to_template_dict() for m in slot.history.messages]
            spans = assistant_char_spans(
                msgs,
                self._template.template,
                next_text,
                roles=(self.policy_role,),
                end_of_turn=self.end_of_turn,
                include_end_of_turn=bool(self.end_of_turn) and sampled_text.endswith(self.end_of_turn or ""),
                tokenizer=self.tokenizer,
                **self.template_kwargs,
            )
            consumed = next_text[: spans[-1][1][1]]
            slot.info["token_text_mismatch"] = True
        # A finished episode has no next prompt: the template's closing text after the last turn is not added.
        glue = "" if slot.done else next_text[len(consumed) :]
        if glue:
            slot.token_segments.append(self._encode(glue))
            slot.segment_is_policy.append(False)
        slot.prompt_text = consumed + glue

    def _drop_glue(self, slot: SlotState) -> None:
        """Tokens mode: take away the ids the template added after the slot's last answer (its next prompt's
        opening), as for an episode that ended: its ids then end with the sampled ones."""
        if self.input_mode != "tokens" or not slot.segment_is_policy or slot.segment_is_policy[-1]:
            return
        if len(slot.segment_is_policy) == 1:  # the first prompt is not glue
            return
        glue = slot.token_segments.pop()
        slot.segment_is_policy.pop()
        text = self.tokenizer.decode(glue.tolist(), skip_special_tokens=False)
        if slot.prompt_text is not None and slot.prompt_text.endswith(text):
            slot.prompt_text = slot.prompt_text[: len(slot.prompt_text) - len(text)]

    def _retemplate_after_answer(self, slot: SlotState, changed_by: str) -> None:
        """Tokens mode: the ids after the slot's last answer again, from its conversation as it is now (a TensorDict
        transform appended messages after the answer, e.g. a tool's output). The ids before stay as they are."""
        if self.input_mode != "tokens" or slot.done:
            return
        self._drop_glue(slot)
        consumed = slot.prompt_text or ""
        next_text = self._render(slot.history, add_generation_prompt=True)
        if not next_text.startswith(consumed):
            raise ValueError(
                f"{changed_by} changed slot {slot.index}'s conversation so that the chat template renders the "
                "text before its last answer differently; in tokens mode a transform may only append messages"
            )
        glue = next_text[len(consumed) :]
        if glue:
            slot.token_segments.append(self._encode(glue))
            slot.segment_is_policy.append(False)
        slot.prompt_text = next_text
        self._check_context(slot)
