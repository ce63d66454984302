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

import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from tensordict import TensorDict, TensorDictBase
from torch.utils.data import DataLoader, RandomSampler

from llmrl_core.collector_registration import CollectorRegistration
from llmrl_core.data.chat_templates import assistant_char_spans, torchrl_template
from llmrl_core.data.conversation import Conversation, Message
from llmrl_core.data.llm_data import LLMData, Response
from llmrl_core.envs.env_specs import EnvSpecs
from llmrl_core.envs.td_list_calls import (
    run_reset_transforms,
    run_step_transforms,
    run_td_reset,
    run_td_step,
)
from llmrl_core.envs.tensordict_io import (
    SlotPrompts,
    Turn,
    actions_from_tensordict,
    add_row_fields,
    output_to_tensordict,
    rows_from_tensordict,
    slots_view,
)
from llmrl_core.envs.types import PromptRow, SlotState

if TYPE_CHECKING:
    from llmrl_core.envs.dataset_chat_env import DatasetChatEnv

InputMode = Literal["history", "text", "tokens"]
Action = str | Response | None


_SLOT_HOOKS = ("on_reset", "reset_slot", "on_step", "step_slot", "on_output")


def _refuse_slot_hooks(transform: Any) -> None:
    """A transform written against llmrl's former per-conversation base (``SlotTransform``: ``step_slot(slot)``,
    ``on_step(slots)``, ...) would have its hooks never run. Say so, with the fix, instead of ignoring them."""
    defined = [hook for hook in _SLOT_HOOKS if any(hook in vars(cls) for cls in type(transform).__mro__)]
    if defined:
        raise TypeError(
            f"{type(transform).__name__} defines {', '.join(defined)}: the hooks of llmrl's former per-conversation "
            "transforms, which no env calls any more. Write it as TorchRL's Transform: _step(tensordict, "
            "next_tensordict) reading the answer and writing 'reward' / 'done' under next, _reset(tensordict, "
            "tensordict_reset) on ('history', 'prompt') (README, 'Migrating')."
        )


class ChatEnvInputError(ValueError, RuntimeError):
    """A reset or a batch size the env cannot take (TorchRL raises these as ``RuntimeError``; llmrl's own code
    has caught them as ``ValueError``: both work)."""


class ChatEnv(EnvSpecs, CollectorRegistration):
    """A batched multi-turn chat env with composable transforms (TorchRL's ``ChatEnv`` semantics)."""

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

    # --- composition -----------------------------------------------------------------------------
    def append_transform(self, transform: Any) -> ChatEnv:
        """Add a TorchRL TensorDict transform (:class:`~llmrl_core.envs.transforms.td_base.Transform`: tools, reward
        parsers, the primer, ``RetrieveKL``, ...) at the end of the chain; returns the env (chainable).

        As in a TorchRL ``TransformedEnv``: ``_reset`` runs on every reset, ``_inv_call`` on the action and
        ``_step`` on the ``"next"`` data of every step, in the order appended; on the list calls (``reset(prompts)``,
        ``step(answers)``: the collector's and the flows') they see the slots in TorchRL's layout and what they write
        becomes the slots' (:mod:`llmrl_core.envs.td_list_calls`).
        """
        self._check_transform(transform, "append_transform")
        transform.set_container(self)
        self.td_transforms.append(transform)
        return self

    def insert_transform(self, index: int, transform: Any) -> ChatEnv:
        """Insert a TensorDict transform at ``index`` in the chain (TorchRL's ``insert_transform``)."""
        self._check_transform(transform, "insert_transform")
        transform.set_container(self)
        self.td_transforms.insert(index, transform)
        return self

    @staticmethod
    def _check_transform(transform: Any, caller: str) -> None:
        from llmrl_core.envs.transforms import td_base

        _refuse_slot_hooks(transform)
        if not isinstance(transform, td_base.Transform):
            raise TypeError(
                f"{caller} expects a Transform (TorchRL's TensorDict transform), got {type(transform).__name__}"
            )

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

    def set_seed(self, seed: int | None = None) -> int:
        """Seed the prompt order: every primer restarts its stream in the order of ``seed``; returns the seed.

        Transforms with their own ``set_seed(seed)`` get it too. Rows drawn for a partial reset but not used
        yet are dropped (they came from the old order). ``None`` picks a random seed. (TorchRL's
        ``set_seed`` returns a derived seed for a sibling env; this returns the seed itself.)
        """
        from llmrl_core.envs.primer import DataLoadingPrimer

        seed = secrets.randbits(31) if seed is None else int(seed)
        self._pending_rows = []
        for transform in self.td_transforms:
            set_seed = getattr(transform, "set_seed", None)
            if callable(set_seed):
                set_seed(seed)
            elif isinstance(transform, DataLoadingPrimer):
                transform.reset_dataloader(seed)
        self._seed = seed
        return seed

    def _provided_rows(self, caller: str) -> list[Any]:
        """The next batch of the env's prompt source: the first transform (e.g. the
        ``DataLoadingPrimer``) whose ``provide_prompts`` answers."""
        for transform in self.td_transforms:
            provide = getattr(transform, "provide_prompts", None)
            provided = provide(self.num_slots) if callable(provide) else None
            if provided is not None:
                return list(provided)
        raise ChatEnvInputError(f"{caller} got no prompts and no transform provides them (add a DataLoadingPrimer)")

    def _draw_rows(self, n: int, caller: str) -> list[PromptRow]:
        """``n`` rows from the pending ones first, then from the primer, batch by batch."""
        while len(self._pending_rows) < n:
            provided = self._provided_rows(caller)
            if not provided:
                raise ValueError(f"{caller}: the primer supplied an empty batch")
            self._pending_rows.extend(self._as_row(item, i) for i, item in enumerate(provided))
        rows, self._pending_rows = self._pending_rows[:n], self._pending_rows[n:]
        return rows

    def _start_tokens(self, slots: list[SlotState]) -> None:
        if self.input_mode == "tokens":
            for slot in slots:
                slot.prompt_text = self._render(slot.history, add_generation_prompt=True)
                slot.token_segments = [self._encode(slot.prompt_text)]
                slot.segment_is_policy = [False]

    def _collect_prompts(self, prompts: Sequence[Any] | None) -> list[PromptRow]:
        if prompts is None and self._pending_rows:
            # Rows left over from a partial reset come first, so none is skipped.
            prompts = self._draw_rows(self.num_slots or len(self.slots) or len(self._pending_rows), "reset()")
        if prompts is None:
            prompts = self._provided_rows("reset()")
        if isinstance(prompts, str | Conversation | dict | PromptRow):
            prompts = [prompts]
        rows = [self._as_row(item, i) for i, item in enumerate(prompts)]
        if not rows:
            raise ValueError("reset() got an empty batch of prompts")
        if self.num_slots is not None and len(rows) != self.num_slots:
            raise ValueError(f"reset() got {len(rows)} prompts but the env's batch_size is {self.num_slots}")
        return rows

    def _as_row(self, item: Any, index: int) -> PromptRow:
        if isinstance(item, PromptRow):
            return item
        if isinstance(item, dict) and not ("role" in item and "content" in item):
            if self.data_key not in item:
                raise ValueError(f"prompt {index}: row has no {self.data_key!r} field (fields: {sorted(item)})")
            return PromptRow(data=dict(item), prompt_id=item.get("id", index))
        return PromptRow(data={self.data_key: item}, prompt_id=index)

    def _make_slot(self, index: int, row: PromptRow) -> SlotState:
        query = row.data.get(self.data_key)
        if query is None:
            raise ValueError(f"prompt {index} (id {row.prompt_id!r}): missing {self.data_key!r}")
        if isinstance(query, str):
            history = Conversation([Message(self.user_role, query)])
        elif isinstance(query, Conversation):
            history = query.copy()
        elif isinstance(query, list | tuple):
            history = Conversation(list(query))
        else:
            raise TypeError(
                f"prompt {index}: {self.data_key!r} must be str, Conversation or messages, got {type(query)}"
            )
        if self.system_prompt is not None and (not history.messages or history[0].role != self.system_role):
            history.messages.insert(0, Message(self.system_role, self.system_prompt))
        return SlotState(
            index=index,
            history=history,
            data=dict(row.data),
            prompt_id=row.prompt_id,
            group_id=row.group_id,
            sample_index=row.sample_index,
        )

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

    def _check_context(self, slot: SlotState) -> None:
        """Tokens mode: truncate a slot whose next prompt would not fit ``max_prompt_tokens`` (its ids end with the
        sampled ones then)."""
        limit = self.max_prompt_tokens
        if limit is not None and not slot.done and sum(len(t) for t in slot.token_segments) > limit:
            slot.info["context_full"] = True  # e.g. a tool printed pages: the next prompt would not fit
            slot.truncate()

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

    def step_layout(self, slots: Sequence[SlotState]) -> dict[str, Any]:
        """Which entries a TensorDict step writes under ``"next"`` besides the prompt and done flags: ``reward``
        when the env or a transform may reward (:meth:`reward_row_shape`; each row of the longest ``reward_shape`` among
        them), ``truncated`` when the env can cut an episode short (``max_turns``, ``max_prompt_tokens``) or a
        transform did. TorchRL's bare ``ChatEnv`` writes neither; its ``DatasetChatEnv`` both (a reward parser, a
        step counter)."""
        truncated = self.can_cut_short() or any(slot.truncated for slot in slots)
        return {"step": True, "reward": self.reward_row_shape(), "truncated": truncated}

    def _with_row_fields(self, next_td: TensorDictBase, slots: Sequence[SlotState]) -> TensorDictBase:
        """An env fed by a ``DataLoadingPrimer`` carries the prompt rows' fields (``query``, ``answer``, ...) in a
        step's ``"next"`` data too, as TorchRL's primer does (its reward parsers read ``("next", "answer")``)."""
        from llmrl_core.envs.primer import DataLoadingPrimer

        if any(isinstance(transform, DataLoadingPrimer) for transform in self.td_transforms):
            add_row_fields(next_td, [slot.data for slot in slots], self.input_mode)
        return next_td

    def _prompts_of(self, slots: Sequence[SlotState]) -> SlotPrompts:
        """The slots' prompts in the env's input mode: rendered text (text, tokens modes), exact ids (tokens)."""
        if self.input_mode == "text":
            return SlotPrompts(text=[self._render(s.history, add_generation_prompt=not s.done) for s in slots])
        if self.input_mode == "tokens":
            return SlotPrompts(text=[s.prompt_text or "" for s in slots], tokens=[s.all_tokens() for s in slots])
        return SlotPrompts()

    def _layout(self, slots: Sequence[SlotState], **layout: Any) -> TensorDict:
        """``slots`` in TorchRL's layout (the TensorDict calls' answer; ``layout``: :meth:`step_layout`'s)."""
        return output_to_tensordict(slots, self._prompts_of(slots), self.input_mode, **layout)

    def _view(self) -> TensorDict:
        """llmrl's list calls' answer: every slot (:func:`~llmrl_core.envs.tensordict_io.slots_view`)."""
        return slots_view(self.slots, self._prompts_of(self.slots))

    # --- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The transforms' checkpointable state, by position: those of the TensorDict transforms that are
        checkpointed with the env (``td_transforms``: those whose ``env_checkpoint`` is True, e.g. the primer's
        cursor).

        After a partial reset, the primer rows no slot has taken yet are saved too (``pending_prompts``).
        """
        state: dict[str, Any] = {}
        if self._checkpointed_td_transforms():
            state["td_transforms"] = [t.state_dict() for t in self._checkpointed_td_transforms()]
        if self._pending_rows:
            state["pending_prompts"] = [
                {"data": r.data, "prompt_id": r.prompt_id, "group_id": r.group_id, "sample_index": r.sample_index}
                for r in self._pending_rows
            ]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output into the same transform chain."""
        if any(state.get("transforms") or []):  # saved when llmrl had per-conversation transforms with state
            raise ValueError(
                "the state holds per-conversation transforms' state ('transforms'), saved by an llmrl whose "
                "transforms were not all TorchRL's TensorDict transforms; start the run afresh"
            )
        checkpointed, td_states = self._checkpointed_td_transforms(), state.get("td_transforms", [])
        if len(td_states) != len(checkpointed):
            names = [type(t).__name__ for t in checkpointed]
            raise ValueError(
                f"state has {len(td_states)} TensorDict transform entries, the env checkpoints {len(checkpointed)} "
                f"({names})"
            )
        for transform, sub in zip(checkpointed, td_states, strict=True):
            transform.load_state_dict(sub)
        self._pending_rows = [PromptRow(**dict(row)) for row in state.get("pending_prompts", [])]

    def _checkpointed_td_transforms(self) -> list[Any]:
        return [t for t in self.td_transforms if getattr(t, "env_checkpoint", False)]

    def close(self) -> None:
        """Release what the transforms hold (sandboxed interpreters, MCP servers, browsers)."""
        for transform in self.td_transforms:
            close = getattr(transform, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> ChatEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(input_mode={self.input_mode!r}, max_turns={self.max_turns}, "
            f"transforms={self.td_transforms})"
        )


def _flat_batch_size(batch_size: int | Sequence[int] | torch.Size | None, owner: str) -> int | None:
    """TorchRL's batch sizes (``(1,)``, ``[4]``, ``torch.Size([2])``) as llmrl's slot count; ``()`` is refused."""
    if batch_size is None or isinstance(batch_size, int):
        return batch_size
    dims = list(batch_size)
    if not dims:
        raise ValueError(f"{owner} must have at least one dimension")
    if len(dims) != 1:
        raise ChatEnvInputError(f"{owner} takes a one-dimensional batch size, got {tuple(dims)}")
    return int(dims[0])
