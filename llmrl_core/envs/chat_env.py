"""``ChatEnv``: a batched chat environment, the blank canvas of TorchRL's LLM API, in plain Python.

Contract with the policy (one env holds B slots; each GRPO copy is its own slot with a group id):

* ``out = env.reset_batch(prompts)`` (or ``env.reset(prompts)`` with a list) builds B conversations (system
  prompt + user query) and returns them in TorchRL's layout, a TensorDict of batch size ``(B,)``, with llmrl's
  per-row entries (:func:`~llmrl_core.envs.tensordict_io.slots_view`). Without ``prompts`` a primer transform
  (DataLoadingPrimer) supplies them; ``env.reset()`` with no argument is TorchRL's call (TorchRL's layout only).
  The policy reads the prompt in the env's ``input_mode``: ``"history"`` -> ``out["history", "prompt"]`` (a
  ``History``; the policy applies the chat template), ``"text"`` -> ``out["text", "prompt"]`` (rendered with the
  generation prompt), ``"tokens"`` -> ``out["tokens", "prompt"]`` (ids).
* ``out = env.step(actions)`` takes one action per slot: a :class:`~llmrl_core.data.llm_data.Response`
  (text, token ids, log-probs, finish reason), a plain string, or an :class:`~llmrl_core.data.llm_data.LLMData`
  batch; ``None`` for slots already done. The response is appended to the slot's Conversation as the
  ``policy_role`` message (``is_complete=False`` when it was cut by the token limit), the transforms run
  (tools, reward parsers), and the full conversation becomes the next prompt (multi-turn).
* ``done = terminated | truncated``: transforms terminate (e.g. an answer was given); the env truncates
  slots that reach ``max_turns`` (None = no limit). ``reward`` is the reward of this step (``(B, 1)`` float);
  :func:`~llmrl_core.envs.tensordict_io.active_rows` lists the rows that still need an action.
* ``out = env.reset_slots(indices)`` starts new conversations in those slots only (the others keep theirs);
  ``step_and_maybe_reset(actions)`` steps and then resets the slots that are done (TorchRL's partial reset),
  so a slot in a long episode never holds back the others' next prompts.

TorchRL's calls work too: ``reset`` and ``step`` given a TensorDict read it and answer in TorchRL's layout
(:mod:`llmrl_core.envs.tensordict_io`). Inside, the env keeps each conversation's bookkeeping in ``env.slots``
(:class:`~llmrl_core.envs.types.SlotState`: exact sampled ids, policy mask), which no transform sees.
Text and tokens are rendered with the template TorchRL's ``History`` picks (``template_kwargs`` may name it:
``chat_template`` / ``chat_template_name``); ``chat_template_name="tokenizer"`` renders with the model's own
template instead (the flows' envs do: prompts as the model was trained on).
In tokens mode the env keeps each slot's ids exactly as sampled: next prompt = previous prompt + sampled
response ids + the ids of whatever the template adds after it (tool output, next generation prompt), so no
re-tokenization drift enters the log-probs; ``SlotState.policy_mask()`` marks the sampled tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from tensordict import TensorDict, TensorDictBase
from torch.utils.data import DataLoader, RandomSampler

from llmrl_core.collector_registration import CollectorRegistration
from llmrl_core.data.chat_templates import torchrl_template
from llmrl_core.data.conversation import Conversation, Message
from llmrl_core.data.llm_data import LLMData, Response
from llmrl_core.envs.env_checkpoint import EnvCheckpoint
from llmrl_core.envs.env_inputs import (
    ChatEnvInputError,  # noqa: F401  (importable from here, as before)
    _flat_batch_size,
)
from llmrl_core.envs.env_specs import EnvSpecs
from llmrl_core.envs.prompt_rows import PromptRows
from llmrl_core.envs.slot_layout import SlotLayout
from llmrl_core.envs.slot_tokens import SlotTokens
from llmrl_core.envs.td_list_calls import (
    run_reset_transforms,
    run_step_transforms,
    run_td_reset,
    run_td_step,
)
from llmrl_core.envs.tensordict_io import (
    Turn,
    actions_from_tensordict,
    add_row_fields,
    rows_from_tensordict,
)
from llmrl_core.envs.transform_chain import TransformChain
from llmrl_core.envs.types import PromptRow, SlotState

if TYPE_CHECKING:
    from llmrl_core.envs.dataset_chat_env import DatasetChatEnv

InputMode = Literal["history", "text", "tokens"]
Action = str | Response | None


class ChatEnv(TransformChain, PromptRows, SlotTokens, SlotLayout, EnvCheckpoint, EnvSpecs, CollectorRegistration):
    """A batched multi-turn chat env with composable transforms (TorchRL's ``ChatEnv`` semantics).

    Its parts are base classes, each in a module of its own: the transform chain
    (:class:`~llmrl_core.envs.transform_chain.TransformChain`), the prompt rows of a reset
    (:class:`~llmrl_core.envs.prompt_rows.PromptRows`), the tokens-mode bookkeeping
    (:class:`~llmrl_core.envs.slot_tokens.SlotTokens`), the answers in TorchRL's layout
    (:class:`~llmrl_core.envs.slot_layout.SlotLayout`), the checkpointed state
    (:class:`~llmrl_core.envs.env_checkpoint.EnvCheckpoint`) and the specs
    (:class:`~llmrl_core.envs.env_specs.EnvSpecs`).
    """

    def __init__(
        self,
        *,
        batch_size: int | Sequence[int] | torch.Size | None = None,
        system_prompt: str | None = None,
        tokenizer: Any = None,
        input_mode: InputMode = "history",
        template_kwargs: dict[str, Any] | None = None,
        chat_template_name: str | None = None,
        system_role: str = "system",
        user_role: str = "user",
        policy_role: str = "assistant",
        data_key: str | None = None,
        max_turns: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        batch_size = _flat_batch_size(batch_size, type(self).__name__)
        if input_mode not in ("history", "text", "tokens"):
            raise ValueError(f"input_mode must be 'history', 'text' or 'tokens', got {input_mode!r}")
        if input_mode == "tokens" and tokenizer is None:
            raise ValueError("input_mode='tokens' needs a tokenizer")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1 or None, got {max_turns}")
        self.num_slots: int | None = batch_size  # None: as many slots as a reset's prompts
        self.system_prompt = system_prompt
        self.tokenizer = tokenizer
        self.input_mode: InputMode = input_mode
        # TorchRL hands template_kwargs to History.apply_chat_template, which takes the template from them too
        self.template_kwargs = dict(template_kwargs or {})
        chat_template = self.template_kwargs.pop("chat_template", None)
        chat_template_name = self.template_kwargs.pop("chat_template_name", None) or chat_template_name
        self.chat_template_name = chat_template_name
        self.system_role = system_role
        self.user_role = user_role
        self.policy_role = policy_role
        self.data_key = data_key or "query"  # TorchRL's default field
        self.max_turns = max_turns
        self.device = torch.device(device) if device is not None else None
        # Tokens mode: a slot whose next prompt would be longer is truncated (``info["context_full"]``) instead of
        # being sent to an engine that cannot take it. Rollout loops set it from the engine's context length.
        self.max_prompt_tokens: int | None = None
        self.td_transforms: list[Any] = []  # TorchRL's TensorDict transforms (td_base.Transform), in order
        # while the TensorDict transforms run: the env slot of each row of their data (td_list_calls.rows_as_slots)
        self.td_row_slots: dict[int, int] | None = None
        self.slots: list[SlotState] = []
        # TorchRL's choice (its History's): a tokenizer's own template only when it marks generations, else ChatML;
        # chat_template_name="tokenizer" keeps the model's own (the flows' envs do)
        self._template = torchrl_template(tokenizer, chat_template, chat_template_name)
        # Rows a primer supplied for a partial reset but no slot has taken yet (see ``reset_slots``).
        self._pending_rows: list[PromptRow] = []
        self._seed: int | None = None

    @classmethod
    def from_dataloader(
        cls,
        dataloader: Any,
        *,
        repeats: int | None = None,
        device: torch.device | str | None = None,
        group_repeats: bool = False,
        batch_size: int | Sequence[int] | torch.Size | None = None,
        primers: Any = None,
        tokenizer: Any = None,
        template_kwargs: dict[str, Any] | None = None,
        input_mode: InputMode = "history",
        data_key: str | None = None,
        system_prompt: str | None = None,
        shuffle: bool | None = None,
        seed: int = 0,
        rename: dict[str, str] | None = None,
        id_key: str | None = "id",
        **chat_env_kwargs: Any,
    ) -> DatasetChatEnv:
        """A :class:`~llmrl_core.envs.dataset_chat_env.DatasetChatEnv` whose prompts come from ``dataloader``.

        ``dataloader`` is anything :class:`~llmrl_core.envs.primer.DataLoadingPrimer` reads (a Hugging Face
        ``Dataset``, a ``.jsonl``/``.parquet`` path, an iterable of dict rows), a ``torch.utils.data.DataLoader``
        (its ``dataset`` is read; its ``batch_size`` and shuffling are the defaults here), or a ready
        ``DataLoadingPrimer``. ``batch_size`` prompts per reset (default 1), each in ``repeats`` copies sharing a
        group id; with ``group_repeats=True`` the env holds ``batch_size * repeats`` slots, otherwise (the default,
        as in TorchRL) ``batch_size``. ``primers`` (TorchRL specs) is refused: extra fields come from the rows.
        ``shuffle`` defaults to True (seeded by
        ``seed``). The other keyword arguments go to :class:`ChatEnv` (``system_prompt``, ``tokenizer``,
        ``input_mode``, ``max_turns`` (None by default here, 1 in ``DatasetChatEnv``), ...). As in TorchRL, a
        subclass's own transforms are not added.
        """
        from llmrl_core.envs.dataset_chat_env import DatasetChatEnv
        from llmrl_core.envs.primer import DataLoadingPrimer
        from llmrl_core.envs.torchrl_only import refuse_torchrl_only

        refuse_torchrl_only(f"{cls.__name__}.from_dataloader", primers=primers)
        batch_size = _flat_batch_size(batch_size, f"{cls.__name__}.from_dataloader")
        repeats = 1 if repeats is None else repeats
        if isinstance(dataloader, DataLoadingPrimer):
            primer = dataloader
        else:
            source = dataloader
            if isinstance(dataloader, DataLoader):
                source = dataloader.dataset
                batch_size = batch_size if batch_size is not None else dataloader.batch_size
                shuffle = shuffle if shuffle is not None else isinstance(dataloader.sampler, RandomSampler)
            primer = DataLoadingPrimer(
                source,
                batch_size=batch_size or 1,
                repeats=repeats,
                group_repeats=group_repeats,
                shuffle=True if shuffle is None else shuffle,
                seed=seed,
                rename=rename,
                id_key=id_key,
            )
        target = cls if issubclass(cls, DatasetChatEnv) else DatasetChatEnv
        env = target.__new__(target)
        slots = primer.batch_size * (primer.repeats if primer.group_repeats else 1)
        ChatEnv.__init__(
            env,
            batch_size=slots,
            device=device,
            tokenizer=tokenizer,
            template_kwargs=template_kwargs,
            input_mode=input_mode,
            data_key=data_key,
            system_prompt=system_prompt,
            **chat_env_kwargs,
        )
        env.primer = primer
        env.append_transform(primer)
        return env

    @property
    def base_env(self) -> ChatEnv:
        """The env without its transforms, as a TorchRL transform reaches it (``self.parent.base_env.input_mode``):
        llmrl's env holds its transforms itself, so it is its own base env."""
        return self

    @property
    def batch_size(self) -> torch.Size:
        """TorchRL's batch size, ``torch.Size([slots])`` (before the first reset of an env without a fixed size:
        ``torch.Size([])``); set it with an int, a one-dimensional size or None (as many slots as prompts)."""
        if self.num_slots is not None:
            return torch.Size([self.num_slots])
        return torch.Size([len(self.slots)]) if self.slots else torch.Size([])

    @batch_size.setter
    def batch_size(self, value: int | Sequence[int] | torch.Size | None) -> None:
        self.num_slots = _flat_batch_size(value, type(self).__name__)

    @property
    def end_of_turn(self) -> str | None:
        """The marker that closes a policy turn in the active chat template (e.g. ``<|im_end|>``)."""
        return self._template.end_of_turn

    # --- reset -----------------------------------------------------------------------------------
    def reset(self, prompts: Sequence[Any] | TensorDictBase | None = None) -> TensorDictBase:
        """Start B new conversations and return them in TorchRL's layout, or as llmrl's slot view for a list.

        ``env.reset()`` (TorchRL's call on an env with a primer) draws the prompts from the primer and returns a
        TensorDict, as TorchRL does. Given a TensorDict (``env.reset(TensorDict({"query": [...]},
        batch_size=(B,)))``) the rows come from its fields and it is filled in with TorchRL's layout and returned
        (:mod:`llmrl_core.envs.tensordict_io`). Given a sequence of prompts (str, Conversation, list of messages,
        dict row or PromptRow: llmrl's own call) the answer is :meth:`reset_batch`'s (TorchRL's layout of every slot
        with llmrl's per-row entries).
        """
        if prompts is None:
            prompts = TensorDict(batch_size=())
        if isinstance(prompts, TensorDictBase):
            # An empty TensorDict (TorchRL's ``env.reset()`` on an env with a primer) draws from the primer.
            given = rows_from_tensordict(prompts, self.data_key) if not prompts.is_empty() else None
            self._reset_rows(given)
            rows = given if given is not None else [dict(slot.data) for slot in self.slots]
            result = add_row_fields(self._layout(self.slots), rows, self.input_mode)
            if prompts.batch_size != result.batch_size:
                prompts = prompts.expand(result.batch_size).clone() if not prompts.batch_dims else prompts
            prompts = prompts.update(result)  # as TorchRL: the reset TensorDict is filled in and returned
            return self._reset_transforms(prompts, prompts, list(range(len(self.slots))))
        return self.reset_batch(prompts)

    def _reset_transforms(self, given: TensorDictBase, reset_td: TensorDictBase, rows: list[int]) -> TensorDictBase:
        """TorchRL's reset hooks on a TensorDict call: each TensorDict transform's ``_reset(given, reset_td)``, where
        ``rows`` are the slots that start new episodes (``given["_reset"]`` marks them on a partial reset); a prompt
        they rewrite becomes those slots' conversation. In text and tokens modes the conversations are lent under
        ``("history", "prompt")`` meanwhile (as on the list calls) and the prompt entry is rendered again after."""
        if not self.td_transforms:
            return reset_td
        lent_history = "history" not in reset_td.keys()
        reset_td = run_reset_transforms(self, given, reset_td, self.slots, rows)
        if lent_history:
            fresh = self._layout(self.slots)
            reset_td.set(self.input_mode, fresh.get(self.input_mode))  # the prompts as the conversations now read
            del reset_td["history"]
        return reset_td

    def reset_batch(self, prompts: Sequence[Any] | None = None) -> TensorDict:
        """llmrl's list call: start B new conversations (from ``prompts``, else the primer) and return the batch in
        TorchRL's layout with llmrl's per-row entries (:func:`~llmrl_core.envs.tensordict_io.slots_view`: what the
        collector and the flows' rollout actors read); TensorDict transforms' ``_reset`` runs on the new slots."""
        self._reset_rows(prompts)
        if self.td_transforms:
            run_td_reset(self, self.slots)
        return self._view()

    def _reset_rows(self, prompts: Sequence[Any] | None) -> None:
        rows = self._collect_prompts(prompts)
        self.slots = [self._make_slot(i, row) for i, row in enumerate(rows)]
        self._start_episodes(self.slots)
        self._start_tokens(self.slots)

    def reset_slots(self, indices: Sequence[int], prompts: Sequence[Any] | None = None) -> TensorDict:
        """Start new conversations in the slots ``indices`` only; every other slot keeps its episode as it is.

        ``prompts`` gives one item per index (as in :meth:`reset`); without it the primer supplies them: it
        draws whole batches as usual and the rows no slot took yet wait for the next reset, so no prompt is
        skipped and a row keeps the ``group_id``/``sample_index`` the primer gave it. Transforms'
        ``on_reset`` sees the new slots only. Any slot may be reset (a running episode is abandoned). The
        output covers all slots (as :meth:`reset_batch`'s); the others' ``reward``/``done`` are those of their last
        step.
        """
        new_slots = self._reset_slot_rows(indices, prompts)
        if self.td_transforms and new_slots:
            run_td_reset(self, new_slots)
        return self._view()

    def _reset_slot_rows(self, indices: Sequence[int], prompts: Sequence[Any] | None) -> list[SlotState]:
        if not self.slots:
            raise RuntimeError("reset_slots() called before reset()")
        index_list = [int(i) for i in indices]
        if len(set(index_list)) != len(index_list):
            raise ValueError(f"reset_slots(): repeated slot indices {index_list}")
        for i in index_list:
            if not 0 <= i < len(self.slots):
                raise IndexError(f"reset_slots(): slot {i} out of range for {len(self.slots)} slots")
        if not index_list:
            return []
        if prompts is None:
            rows = self._draw_rows(len(index_list), "reset_slots()")
        else:
            if isinstance(prompts, str | Conversation | dict | PromptRow):
                prompts = [prompts]
            if len(prompts) != len(index_list):
                raise ValueError(f"reset_slots() got {len(prompts)} prompts for {len(index_list)} slots")
            rows = [self._as_row(item, i) for i, item in zip(index_list, prompts, strict=True)]
        new_slots = [self._make_slot(i, row) for i, row in zip(index_list, rows, strict=True)]
        for slot in new_slots:
            self.slots[slot.index] = slot
        self._start_episodes(new_slots)
        self._start_tokens(new_slots)
        return new_slots

    def step_and_maybe_reset(
        self, actions: LLMData | Sequence[Action] | TensorDictBase, prompts: Sequence[Any] | None = None
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Step, then reset the slots that are done; returns ``(step output, next output)``.

        The step output is what :meth:`step` returned (rewards and done flags of this step, the finished
        conversations). The next output holds the prompts to answer next: finished slots start new episodes
        (from ``prompts``, one per finished slot in slot order, or the primer), running ones continue. When no
        slot finished, both are the same object. A finished slot needs ``prompts`` or a primer. TorchRL returns
        the step's tensordict (with ``"next"``) and the partially reset one, as here for a TensorDict; for a list of
        answers both are llmrl's list-call answers (:meth:`reset_batch`).
        """
        if isinstance(actions, TensorDictBase):
            stepped = self.step(actions)
            done = [i for i, d in enumerate(stepped.get(("next", "done")).reshape(-1).tolist()) if d]
            if done:
                self._reset_slot_rows(done, prompts)
            reset_td = self._layout(self.slots)
            mask = torch.zeros(len(self.slots), 1, dtype=torch.bool)
            mask[done] = True
            given = TensorDict({"_reset": mask}, batch_size=reset_td.batch_size)  # TorchRL's partial-reset flags
            return stepped, self._reset_transforms(given, reset_td, done)
        out = self.step(actions)
        done = [i for i, ended in enumerate(out.get("done").reshape(-1).tolist()) if ended]
        if not done:
            return out, out
        return out, self.reset_slots(done, prompts)

    def rollout(self, max_steps: int, policy: Any = None, callback: Any = None, **kwargs: Any) -> TensorDictBase:
        """TorchRL's ``env.rollout``: up to ``max_steps`` turns of ``policy`` (a TensorDict module) from a reset,
        stacked as ``(B, T)``; the keywords are TorchRL's (``tensordict=`` the reset data, ``auto_reset``,
        ``break_when_any_done``, ``break_when_all_done``, ``return_contiguous``, ``set_truncated``, ``actions``, ...).
        See :mod:`llmrl_core.envs.rollout`."""
        from llmrl_core.envs.rollout import rollout

        return rollout(self, max_steps, policy, callback, **kwargs)

    # --- step ------------------------------------------------------------------------------------
    def step(self, actions: LLMData | Sequence[Action] | TensorDictBase) -> TensorDictBase:
        """Append each active slot's response, run the transforms, return the next prompts and rewards.

        Given a TensorDict (TorchRL's call) the answers are read from it and the outcome is written under its
        ``"next"`` key; a bare ``History`` under ``"history"`` (the whole conversation) becomes a ``ChatHistory``
        whose ``prompt`` and ``full`` are that conversation.
        """
        if isinstance(actions, TensorDictBase):
            from llmrl_core.data.history import History
            from llmrl_core.modules.policies.outputs import ChatHistory

            for transform in self.td_transforms:
                actions = transform._inv_call(actions)
            turns = self._apply_actions(actions_from_tensordict(actions, self.tokenizer))
            bare = actions.get("history", None)
            if isinstance(bare, History):
                actions.set("history", ChatHistory(prompt=bare, full=bare, batch_size=actions.batch_size))
            next_td = self._layout(self.slots, **self.step_layout(self.slots))
            next_td = self._with_row_fields(next_td, self.slots)
            if self.td_transforms:
                slots = [turn.slot for turn in turns]
                position = {id(slot): i for i, slot in enumerate(self.slots)}
                rows = [position[id(slot)] for slot in slots]
                lent = [name for name in self.slots[0].data if name not in next_td.keys()] if self.slots else []
                add_row_fields(next_td, [slot.data for slot in self.slots], self.input_mode)  # lent to the transforms
                next_td = run_step_transforms(self, slots, rows, actions, next_td)
                next_td = next_td.exclude(*[name for name in lent if name in next_td.keys()])
            return actions.set("next", next_td)
        turns = self._apply_actions(actions)
        run_td_step(self, turns)
        return self._view()

    def _apply_actions(self, actions: LLMData | Sequence[Action]) -> list[Turn]:
        """Append the answers, run the slot transforms and the turn limits; the turns of the active slots."""
        if not self.slots:
            raise RuntimeError("step() called before reset()")
        responses = actions.responses() if isinstance(actions, LLMData) else list(actions)
        if len(responses) != len(self.slots):
            raise ValueError(f"step() got {len(responses)} actions for {len(self.slots)} slots")
        active = []
        turns = []
        for slot, action in zip(self.slots, responses, strict=True):
            slot.reward = 0.0
            slot.reward_components = {}
            slot.next_fields = {}
            if slot.done:
                continue
            if action is None:
                raise ValueError(f"step(): slot {slot.index} is not done but its action is None")
            response = action if isinstance(action, Response) else Response(str(action))
            prompt_text = slot.prompt_text
            # tokens mode, for the TensorDict transforms' ("tokens", "prompt"/"full"): the ids the answer followed
            prompt_ids = slot.all_tokens() if self.td_transforms and self.input_mode == "tokens" else None
            self._apply_response(slot, response)
            active.append(slot)
            turns.append(Turn(slot, len(slot.history.messages), response, prompt_text, prompt_ids))
        self._answer_turns(active)
        for slot in active:
            if self.max_turns is not None and slot.turn >= self.max_turns and not slot.done:
                slot.truncate()
            slot.episode_reward += slot.reward
            if self.input_mode == "tokens":
                self._extend_tokens(slot)
                self._check_context(slot)
        return turns

    # --- the env's own dynamics (a subclass's: the gym wrapper plays its games here) -------------------
    def _start_episodes(self, slots: list[SlotState]) -> None:
        """Called with the new slots of a reset, before the transforms' ``_reset``; nothing by default."""

    def _answer_turns(self, slots: list[SlotState]) -> None:
        """Called with this step's active slots once their answers are appended, before the turn limit and the
        transforms' ``_step`` (the env's reply: reward, end flags, an observation message); nothing by default."""

    def _apply_response(self, slot: SlotState, response: Response) -> None:
        content, ended = self.strip_end_of_turn(response.text)
        # A turn is open (is_complete=False) only when the sampler says it hit the token limit.
        complete = ended or response.finish_reason != "length"
        slot.history.append(Message(self.policy_role, content, is_complete=complete))
        slot.responses.append(response)
        slot.turn += 1

    def strip_end_of_turn(self, text: str) -> tuple[str, bool]:
        """``(text without its closing end-of-turn / EOS marker, whether it had one)``: an answer as the
        conversation keeps it."""
        markers = [m for m in (self.end_of_turn, getattr(self.tokenizer, "eos_token", None)) if m]
        trimmed = text.rstrip()  # a hand-written answer may end "<|im_end|>\n"; a sampled one ends at the marker
        for marker in markers:
            if trimmed.endswith(marker):
                return trimmed[: -len(marker)], True
        return text, False

    def __enter__(self) -> ChatEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(input_mode={self.input_mode!r}, max_turns={self.max_turns}, "
            f"transforms={self.td_transforms})"
        )
