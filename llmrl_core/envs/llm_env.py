"""``LLMEnv``: TorchRL's plain completion env (observation + action -> next observation), as a ``ChatEnv``.

Each prompt is a conversation of one user message whose *observation* is its plain text: the env renders a
conversation by concatenating its messages' contents (no role markup), so after a step the observation is the
prompt followed by every answer so far, as TorchRL's ``LLMEnv`` builds it. ``from_text=True`` (the default) gives
the observation as text (``input_mode="text"``), ``from_text=False`` as token ids (``input_mode="tokens"``: the
sampled ids are kept exactly, a tokenizer is needed to read text answers and prompts). The conversation itself
travels as ``("history", "prompt")`` as in every ChatEnv, so a policy in history mode (the wrappers' default)
answers the prompt through its chat template.

A slot is done when its answer contains ``eos_token_id`` (the sampled ids, or the text's EOS marker), or when its
token observation grows past ``max_length`` (tokens mode). The reward is 0: add a reward transform. Prompts come from
``reset(prompts)``, a ``primer`` or :meth:`LLMEnv.from_dataloader` (any loader TorchRL takes, endless iterators
included). TorchRL's key and spec arguments (``token_key``, ``attention_key``, ``action_key``, ``reward_key``,
``vocab_size``, ``has_attention``, ``assign_reward``, ``assign_done``) are accepted for its signature; the layout
written is ChatEnv's (:mod:`llmrl_core.envs.tensordict_io`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from llmrl_core.data.chat_templates import resolve_template
from llmrl_core.data.llm_data import Response
from llmrl_core.envs.chat_env import ChatEnv, _flat_batch_size
from llmrl_core.envs.primer import DataLoadingPrimer
from llmrl_core.envs.torchrl_only import refuse_torchrl_only
from llmrl_core.envs.types import PromptRow, SlotState

# A conversation rendered as the plain concatenation of its contents: the observation of a completion env.
CONCATENATION_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


class LLMEnv(ChatEnv):
    """A completion env: ``reset`` takes prompts (text or ids), ``step`` appends each answer to its observation."""

    def __init__(
        self,
        *,
        token_key: Any = None,
        str_key: str | None = None,
        attention_key: Any = None,
        action_key: Any = None,
        reward_key: Any = "reward",
        from_text: bool = True,
        device: torch.device | str | None = None,
        vocab_size: int | None = None,
        has_attention: bool = True,
        assign_reward: bool = False,
        assign_done: bool = False,
        batch_size: int | Sequence[int] | torch.Size | None = None,
        as_llm_data: bool = False,
        eos_token_id: int | None = None,
        tokenizer: Any = None,
        max_length: int | None = None,
        primer: DataLoadingPrimer | None = None,
        max_turns: int | None = None,
    ) -> None:
        if as_llm_data:
            raise ValueError(
                "LLMEnv(as_llm_data=True) (TorchRL's LLMData-shaped observations) is not supported: the env hands out "
                "TensorDicts in TorchRL's layout; leave as_llm_data=False"
            )
        if not from_text and tokenizer is None:
            raise ValueError("LLMEnv(from_text=False) needs a tokenizer: token observations are kept beside their text")
        if max_length is not None and from_text:
            raise ValueError("LLMEnv: max_length counts tokens, set from_text=False (or cut text in a transform)")
        super().__init__(
            batch_size=batch_size,
            tokenizer=tokenizer,
            input_mode="text" if from_text else "tokens",
            data_key=str_key or "text",
            max_turns=max_turns,
            device=device,
        )
        self._template = resolve_template(tokenizer, chat_template=CONCATENATION_TEMPLATE)
        self.from_text = from_text
        self.eos_token_id = eos_token_id
        self.max_length = max_length
        self.max_prompt_tokens = max_length
        self.vocab_size = vocab_size
        self.token_key, self.attention_key, self.action_key, self.reward_key = (
            token_key,
            attention_key,
            action_key,
            reward_key,
        )
        self.has_attention, self.assign_reward, self.assign_done = has_attention, assign_reward, assign_done
        self.primer = primer
        if primer is not None:
            self.append_transform(primer)

    @classmethod
    def from_dataloader(  # type: ignore[override] - TorchRL's LLMEnv.from_dataloader signature
        cls,
        dataloader: Any,
        *,
        tokenizer: Any = None,
        token_key: Any = None,
        str_key: str | None = None,
        attention_key: Any = None,
        action_key: Any = None,
        reward_key: Any = "reward",
        from_text: bool = True,
        device: torch.device | str | None = None,
        vocab_size: int | None = None,
        batch_size: int | Sequence[int] | torch.Size | None = None,
        has_attention: bool = True,
        assign_reward: bool = False,
        assign_done: bool = False,
        primers: Any = None,
        example_data: Any = None,
        stack_method: Any = None,
        repeats: int | None = None,
        group_repeats: bool = True,
        eos_token_id: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        max_length: int | None = None,
    ) -> LLMEnv:
        """An ``LLMEnv`` whose prompts come from ``dataloader`` (anything a ``DataLoadingPrimer`` reads, including
        endless iterators of strings or batches). ``batch_size`` prompts per reset, each in ``repeats`` copies (with
        ``group_repeats=True``, TorchRL's default here, the env holds ``batch_size * repeats`` slots)."""
        refuse_torchrl_only(f"{cls.__name__}.from_dataloader", primers=primers)
        del example_data  # TorchRL builds specs from it; rows carry their own fields here
        prompts = _flat_batch_size(batch_size, f"{cls.__name__}.from_dataloader") or 1
        primer = (
            dataloader
            if isinstance(dataloader, DataLoadingPrimer)
            else DataLoadingPrimer(
                dataloader,
                batch_size=prompts,
                repeats=repeats,
                group_repeats=group_repeats,
                shuffle=shuffle,
                seed=seed,
                str_key=str_key or "text",
                stack_method=stack_method,
            )
        )
        slots = primer.batch_size * (primer.repeats if primer.group_repeats else 1)
        return cls(
            token_key=token_key,
            str_key=str_key,
            attention_key=attention_key,
            action_key=action_key,
            reward_key=reward_key,
            from_text=from_text,
            device=device,
            vocab_size=vocab_size,
            has_attention=has_attention,
            assign_reward=assign_reward,
            assign_done=assign_done,
            batch_size=slots,
            eos_token_id=eos_token_id,
            tokenizer=tokenizer,
            max_length=max_length,
            primer=primer,
        )

    # --- prompts and answers as ids ----------------------------------------------------------------
    def _as_row(self, item: Any, index: int) -> PromptRow:
        if isinstance(item, torch.Tensor) or (isinstance(item, list | tuple) and item and isinstance(item[0], int)):
            return super()._as_row(self._decode(item), index)
        return super()._as_row(item, index)

    def _decode(self, ids: Any) -> str:
        if self.tokenizer is None:
            raise ValueError("LLMEnv got token ids but has no tokenizer to read them")
        return self.tokenizer.decode(torch.as_tensor(ids).tolist(), skip_special_tokens=False)

    def step(self, actions: Any) -> Any:
        """Append each answer (a string, a :class:`Response`, token ids, or a TorchRL TensorDict)."""
        if isinstance(actions, list | tuple):
            actions = [self._as_response(a) for a in actions]
        return super().step(actions)

    def _as_response(self, action: Any) -> Any:
        if isinstance(action, torch.Tensor) or (isinstance(action, list | tuple) and action):
            ids = torch.as_tensor(action, dtype=torch.long).reshape(-1)
            return Response(self._decode(ids), token_ids=ids)
        return action

    def _apply_response(self, slot: SlotState, response: Response) -> None:
        ended = self._ends_with_eos(response)
        super()._apply_response(slot, response)
        if ended:
            slot.terminate()

    def strip_end_of_turn(self, text: str) -> tuple[str, bool]:
        return text, False  # the observation keeps every character the policy wrote, EOS included

    def _ends_with_eos(self, response: Response) -> bool:
        if self.eos_token_id is None:
            return False
        if response.token_ids is not None:
            return bool((torch.as_tensor(response.token_ids) == self.eos_token_id).any())
        marker = getattr(self.tokenizer, "eos_token", None)
        if marker is None:
            raise ValueError("eos_token_id is set but text actions come without tokens or a tokenizer")
        return marker in response.text
