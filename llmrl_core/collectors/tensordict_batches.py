"""What an :class:`~llmrl_core.collectors.llm_collector.LLMCollector` hands out, as TorchRL lays it out: a
TensorDict with one row per finished episode (or per dialog turn), lazily stacked so rows may differ in length.

Every row carries TorchRL's containers — ``history`` (:class:`ChatHistory`: ``prompt`` the conversation the
episode started from, ``response`` what followed, ``full`` both), ``text`` (``response``: the last sampled
turn), and in tokens mode ``tokens`` (``prompt``/``response``/``full`` ids exactly as sampled), ``masks``
(``all_assistant_mask``: True on the tokens the policy sampled) and ``log_probs`` (the sampler's log-probs;
``full`` holds 0 where the policy did not sample; a dialog-turn row has the same over its prompt + answer) —
plus ``reward``, ``done``, ``terminated``, ``truncated``
(shape ``(1,)``), TorchRL's ``"next"`` (the same flags and reward, ``history`` whose ``prompt`` is the conversation
so far, and the prompt row's fields, which also sit at the root: ``query``, ``answer``, ...; a dialog-turn row's
``"next"`` holds ``reward`` and ``truncated`` only as the env's step writes them, and the row also carries what a
TorchRL policy wrote beside its answer: the prompt/full ids and masks), ``policy_version``
when versions are tracked, and llmrl's bookkeeping as non-tensor fields:
``prompt_id``, ``group_id``, ``sample_index``, ``turn``/``num_turns``, ``finish_reason``, ``reward_components``,
``policy_versions``, ``data`` (the prompt row) and ``info``.

``rows(batch)`` reads such a batch back as plain per-row views (:class:`EpisodeRow`) for code that consumes
episodes one by one (the flows' Parquet writer, the evaluators).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection, lazy_stack

from llmrl_core.data.conversation import Conversation, episode_start
from llmrl_core.data.history import History
from llmrl_core.data.llm_data import LLMData, Response
from llmrl_core.envs.types import SlotState


def _history(conversation: Conversation) -> History | None:
    from llmrl_core.data.history import message_dict

    messages = conversation.messages
    return History.from_chats([message_dict(m) for m in messages]) if messages else None


def _chat_history(prompt: Conversation, response: Conversation, full: Conversation) -> Any:
    from llmrl_core.modules.policies.outputs import ChatHistory

    return ChatHistory(prompt=_history(prompt), response=_history(response), full=_history(full), batch_size=())


def _version(value: int | str | None) -> Any:
    return torch.tensor(value) if isinstance(value, int) else value


_FLAG_KEYS = ("reward", "done", "terminated", "truncated")


def _flags(reward: float, done: bool, terminated: bool, truncated: bool) -> dict[str, torch.Tensor]:
    return {
        "reward": torch.tensor([float(reward)]),
        "done": torch.tensor([bool(done)]),
        "terminated": torch.tensor([bool(terminated)]),
        "truncated": torch.tensor([bool(truncated)]),
    }


def episode_row(
    slot: SlotState,
    versions: Sequence[int | str | None],
    components: dict[str, float],
    tokens_mode: bool,
    policy_role: str = "assistant",
) -> TensorDict:
    """A finished env slot's episode as a TensorDict row (see the module docstring). Everything is copied out of
    the slot, which the env reuses on its next reset. ``versions`` holds the version that sampled each turn and
    ``components`` the episode's summed named rewards."""
    from llmrl_core.modules.policies.outputs import LogProbs, Masks, Text, Tokens

    messages = slot.history.copy().messages
    responses = list(slot.responses)
    start = episode_start(messages, policy_role, len(responses))
    row = TensorDict(_flags(slot.episode_reward, True, slot.terminated, slot.truncated), batch_size=())
    row.set(
        "history",
        _chat_history(Conversation(messages[:start]), Conversation(messages[start:]), Conversation(messages)),
    )
    row.set("text", Text(response=responses[-1].text if responses else "", batch_size=()))
    if tokens_mode:
        tokens, mask = slot.all_tokens().clone(), slot.policy_mask().clone()
        first = int(mask.nonzero()[0]) if bool(mask.any()) else len(mask)
        row.set("tokens", Tokens(prompt=tokens[:first], response=tokens[first:], full=tokens, padded=False))
        row.set("masks", Masks(all_assistant_mask=mask, all_attention_mask=torch.ones_like(mask), padded=False))
        sampled = [r.log_probs for r in responses if r.log_probs is not None]
        if sampled and int(mask.sum()) == sum(len(lp) for lp in sampled):
            full = torch.zeros(len(mask), dtype=torch.float32)
            full[mask] = torch.cat(sampled).to(torch.float32)
            row.set("log_probs", LogProbs(response=full[first:], full=full, padded=False))
    if versions and versions[0] is not None:
        row.set("policy_version", _version(versions[0]))
    row = _with_bookkeeping(
        row,
        prompt_id=slot.prompt_id,
        group_id=slot.group_id,
        sample_index=slot.sample_index,
        num_turns=len(responses),
        finish_reason=responses[-1].finish_reason if responses else None,
        reward_components=dict(components),
        policy_versions=list(versions),
        num_sampled_tokens=sum(len(r.token_ids) for r in responses if r.token_ids is not None),
        data=dict(slot.data),
        info=dict(slot.info),
    )
    return _with_torchrl_step(row, slot.data)


def turn_row(
    prompt: Conversation,
    response: Response,
    *,
    reward: float,
    reward_components: dict[str, float],
    done: bool,
    turn: int,
    policy_version: int | str | None,
    prompt_id: str | int | None = None,
    group_id: int | None = None,
    sample_index: int = 0,
    prompt_tokens: torch.Tensor | None = None,
    data: dict[str, Any] | None = None,
    next_fields: dict[Any, Any] | None = None,
    step_layout: dict[str, Any] | None = None,
) -> TensorDict:
    """One sampled dialog turn as a TensorDict row (see the module docstring): the prompt it answered (its ids as
    the engine saw them in tokens mode), the answer, what the policy wrote beside it (``response.policy_fields``:
    a TorchRL policy's prompt/full ids and masks), what the env made of it (reward, named parts, done, the entries
    its TensorDict transforms added for ``"next"``) and the prompt row's fields. With the env's ``step_layout``
    (:meth:`~llmrl_core.envs.chat_env.ChatEnv.step_layout`) ``"next"`` holds ``reward`` and ``truncated`` as the env's
    step writes them (TorchRL's: no reward without a reward source, ``(1, 1)`` with its reward parsers); the row's
    root keeps llmrl's ``reward`` and ``truncated`` either way."""
    from llmrl_core.data.conversation import Message
    from llmrl_core.modules.policies.outputs import LogProbs, Masks, Text, Tokens

    answer = Conversation([Message(role="assistant", content=response.text)])
    full = Conversation([*prompt.messages, *answer.messages])
    row = TensorDict(_flags(reward, done, done, False), batch_size=())
    row.set("history", _chat_history(prompt, answer, full))
    row.set("text", Text(response=response.text, batch_size=()))
    ids, sampled = response.token_ids, response.log_probs
    if ids is not None and prompt_tokens is not None:  # tokens mode: the whole sequence, as TorchRL's policy has it
        prompt_ids, full_ids = prompt_tokens.to(torch.long), torch.cat([prompt_tokens, ids]).to(torch.long)
        row.set("tokens", Tokens(prompt=prompt_ids, response=ids, full=full_ids, padded=False))
        mask = torch.cat([torch.zeros(len(prompt_ids), dtype=torch.bool), torch.ones(len(ids), dtype=torch.bool)])
        row.set("masks", Masks(all_assistant_mask=mask, all_attention_mask=torch.ones_like(mask), padded=False))
    elif ids is not None:
        row.set("tokens", Tokens(response=ids, padded=False))
    if sampled is not None:
        full_lp = None
        if ids is not None and prompt_tokens is not None and len(sampled) == len(ids):
            full_lp = torch.cat([torch.zeros(len(prompt_tokens)), sampled.to(torch.float32)])
        row.set("log_probs", LogProbs(response=sampled.to(torch.float32), full=full_lp, padded=False))
    _with_policy_fields(row, response.policy_fields)
    if policy_version is not None:
        row.set("policy_version", _version(policy_version))
    row = _with_bookkeeping(
        row,
        prompt_id=prompt_id,
        group_id=group_id,
        sample_index=sample_index,
        turn=turn,
        finish_reason=response.finish_reason,
        reward_components=dict(reward_components),
    )
    return _with_torchrl_step(row, dict(data or {}), next_fields, step_layout)


def _with_policy_fields(row: TensorDict, fields: dict[tuple[str, str], torch.Tensor]) -> None:
    """Add the policy's entries the row does not hold yet, inside TorchRL's containers (``Tokens``, ``Masks``,
    ``LogProbs``)."""
    from llmrl_core.modules.policies.outputs import LogProbs, Masks, Tokens

    containers = {"tokens": Tokens, "masks": Masks, "log_probs": LogProbs}
    for (group, name), value in fields.items():
        holder = row.get(group, None)
        if holder is None:
            row.set(group, containers[group](**{name: value}, padded=False))
        elif getattr(holder, name, None) is None:
            setattr(holder, name, value)


def _with_torchrl_step(
    row: TensorDict,
    data: dict[str, Any],
    added: dict[Any, Any] | None = None,
    step_layout: dict[str, Any] | None = None,
) -> TensorDict:
    """TorchRL's collector layout beside llmrl's: the prompt row's fields (``query``, ``answer``, ...) at the root
    and under ``"next"``, which also holds the step's ``reward``/``done``/``terminated``/``truncated`` (with a
    ``step_layout``: ``reward`` and ``truncated`` only as the env's step writes them) and the conversation so far as
    the next prompt (``("next", "history").prompt``), and what the env's TensorDict transforms added to it
    (``added``: ``kl_penalty``, ...). A field named like an entry the row has already (``text``, ``data``, ...) is
    left out of the root."""
    from llmrl_core.modules.policies.outputs import ChatHistory

    flags = {key: row.get(key).clone() for key in _FLAG_KEYS}
    if step_layout is not None:
        reward = flags.pop("reward")
        if step_layout["reward"] is not None:
            flags["reward"] = reward.reshape(step_layout["reward"])
        if not step_layout["truncated"]:
            del flags["truncated"]
    following = TensorDict(flags, batch_size=())
    following.set("history", ChatHistory(prompt=row.get("history").full, batch_size=()))
    for name, value in data.items():
        if name not in row.keys():
            row.set_non_tensor(name, value)
        if name not in following.keys():
            following.set_non_tensor(name, value)
    for key, value in (added or {}).items():
        if isinstance(value, torch.Tensor) or is_tensor_collection(value):
            following.set(key, value)
        else:
            following.set_non_tensor(key, value)
    row.set("next", following)
    return row


def _with_bookkeeping(row: TensorDict, **fields: Any) -> TensorDict:
    for name, value in fields.items():
        row.set_non_tensor(name, value)
    return row


def stack_rows(rows: Sequence[TensorDict]) -> TensorDictBase:
    """Collector rows as one lazily stacked TensorDict of shape ``(len(rows),)``."""
    if not rows:
        return TensorDict(batch_size=(0,))
    return lazy_stack(list(rows))


@dataclass
class EpisodeRow:
    """Plain Python view of one row of a collector batch, for code that consumes episodes one by one."""

    messages: list[dict[str, Any]]
    episode_messages: list[dict[str, Any]]
    tokens: torch.Tensor | None
    policy_mask: torch.Tensor | None
    sampler_log_probs: torch.Tensor | None
    response_text: str
    reward: float
    terminated: bool
    truncated: bool
    prompt_id: Any
    group_id: Any
    sample_index: int
    num_turns: int
    num_sampled_tokens: int
    finish_reason: str | None
    reward_components: dict[str, float]
    policy_versions: list[Any]
    data: dict[str, Any]
    info: dict[str, Any]

    @property
    def policy_version(self) -> Any:
        """The version that sampled the first turn."""
        return self.policy_versions[0] if self.policy_versions else None


def _message_dicts(history: History | None) -> list[dict[str, Any]]:
    return [{"role": m.role, "content": m.text} for m in history.to_messages()] if history is not None else []


def _maybe(td: TensorDictBase, key: Any) -> Any:
    return td.get(key, None) if key in td.keys(include_nested=True) else None


def rows(batch: TensorDictBase) -> list[EpisodeRow]:
    """The episodes of a trajectory batch (``yield_completed_trajectories``) as :class:`EpisodeRow` views."""
    out = []
    for i in range(batch.batch_size[0] if batch.batch_dims else 0):
        row = batch[i]
        full = row.get(("history", "full"))
        response = _maybe(row, ("history", "response"))
        mask = _maybe(row, ("masks", "all_assistant_mask"))
        log_probs = _maybe(row, ("log_probs", "full"))
        out.append(
            EpisodeRow(
                messages=_message_dicts(full),
                episode_messages=_message_dicts(response),
                tokens=_maybe(row, ("tokens", "full")),
                policy_mask=mask,
                sampler_log_probs=log_probs[mask] if log_probs is not None and mask is not None else None,
                response_text=str(row["text", "response"]),
                reward=float(row.get("reward")[0]),
                terminated=bool(row.get("terminated")[0]),
                truncated=bool(row.get("truncated")[0]),
                prompt_id=row["prompt_id"],
                group_id=row["group_id"],
                sample_index=int(row["sample_index"]),
                num_turns=int(row["num_turns"]),
                num_sampled_tokens=int(row["num_sampled_tokens"]),
                finish_reason=row["finish_reason"],
                reward_components=dict(row["reward_components"]),
                policy_versions=list(row["policy_versions"]),
                data=dict(row["data"]),
                info=dict(row["info"]),
            )
        )
    return out


def llm_data_to_tensordict(data: LLMData, input_mode: str | None = None) -> TensorDict:
    """The prompts of an :class:`LLMData` batch as the input of a TensorDict policy wrapper (TorchRL's keys): every
    form the data has, or with ``input_mode`` ``"tokens"`` / ``"text"`` only that one (what such a wrapper reads)."""
    from llmrl_core.modules.policies.outputs import ChatHistory, Text, Tokens

    size = data.batch_size
    per_row = []
    with_history = input_mode not in ("tokens", "text")
    for i in range(size):
        row = TensorDict(batch_size=())
        if data.history is not None and with_history:
            row.set("history", ChatHistory(prompt=_history(data.history[i]), batch_size=()))
        if data.text is not None:
            row.set("text", Text(prompt=data.text[i], batch_size=()))
        if data.tokens is not None:
            row.set("tokens", Tokens(prompt=data.tokens[i], padded=False))
        per_row.append(row)
    return lazy_stack(per_row) if per_row else TensorDict(batch_size=(0,))
