"""TorchRL TensorDict transforms on ChatEnv's list calls (``reset(prompts)``, ``reset_slots``, ``step(answers)``,
the calls ``LLMCollector`` and the flows make): each transform's ``_reset``/``_step`` sees the slots in TorchRL's
layout, and what its ``_step`` writes back (reward, end flags, new entries) becomes the slots'. The TensorDict calls
(``reset(td)``/``step(td)``) run the transforms in :mod:`llmrl_core.envs.chat_env` itself.

What a transform does to ``("history", "prompt")`` becomes the slots' conversation (:func:`adopt_conversations`):
TorchRL's tool transforms extend that history with their output (a ``tool`` message), which the next prompt then
carries. The list calls hand the transforms that history in every input mode (TorchRL's TensorDict carries it in
history mode only), so a TorchRL-style tool also runs in the flows' tokens-mode envs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from llmrl_core.data.conversation import Conversation, Message
from llmrl_core.envs.tensordict_io import (
    Turn,
    add_row_fields,
    entry_keys,
    entry_rows,
    reward_change,
    reward_rows,
    turns_to_tensordict,
)
from llmrl_core.envs.types import SlotState
from llmrl_core.tools.tool_calls import tool_call_record
from llmrl_core.user_code import UserCodeError

if TYPE_CHECKING:
    from tensordict import TensorDictBase

    from llmrl_core.envs.chat_env import ChatEnv


def run_td_reset(env: ChatEnv, slots: list[SlotState]) -> None:
    """List calls: each TensorDict transform's ``_reset`` sees the new slots in TorchRL's layout; a prompt history
    it rewrites becomes the slot's prompt."""
    if not env.td_transforms or not slots:
        return
    td = add_row_fields(env._layout(slots), [s.data for s in slots], env.input_mode)
    run_reset_transforms(env, td, td, slots, list(range(len(slots))), list_call=True)


def run_reset_transforms(
    env: ChatEnv,
    given: TensorDictBase,
    td: TensorDictBase,
    td_slots: list[SlotState],
    rows: list[int],
    list_call: bool = False,
) -> TensorDictBase:
    """Each TensorDict transform's ``_reset(given, td)`` on reset data ``td`` whose rows are ``td_slots``, with
    their conversations under ``("history", "prompt")`` (lent where the input mode leaves them out); the
    conversation a transform leaves at each of ``rows`` becomes that slot's. Returns the transformed ``td``."""
    td = with_prompt_history(td, td_slots)
    with rows_as_slots(env, {row: slot.index for row, slot in enumerate(td_slots)}):
        for transform in env.td_transforms:
            with named_failure(transform, "_reset", list_call):
                td = transform._reset(given, td)
            keep_row_notes(transform, td_slots, list(range(len(td_slots))))  # e.g. an info entry set at reset
    adopt_conversations(env, [td_slots[i] for i in rows], rows, td, after="reset")
    return td


def run_td_step(env: ChatEnv, turns: list[Turn]) -> None:
    """List calls: the TensorDict transforms' ``_step`` runs on this step's active slots, as TorchRL's
    ``TransformedEnv`` runs it after the base env's step; what they write back under ``reward``,
    ``terminated``, ``truncated`` and ``done`` becomes the slots' (a change of reward is kept in
    ``reward_components`` under the transform's class name, measured by :func:`reward_change`: a per-token
    reward ``(T, 1)`` counts as its sum, a one-value reward spread over the tokens by the per-token differences;
    a transform that writes its reward's parts, ``reward_<part>`` entries as TorchRL's reward parsers do, has those
    kept instead, and a ``success`` entry becomes the slot's ``info["success"]``).
    Entries they add (``kl_penalty``, ``("ref_log_probs", "full")``, ...) are kept per slot in
    ``next_fields`` (the collector hands them out under ``"next"``).
    The action data is built from the answers: ``history`` (``prompt``/``response``/``full``), ``text``
    (``response``; ``prompt``/``full`` in tokens mode), ``tokens`` (``response``, and ``prompt``/``full`` in
    tokens mode) and ``log_probs`` (``response``) when the sampler gave them, and the prompt row's fields.
    ``_inv_call`` does not run here: the answers were given already (it runs on ``step(td)``)."""
    if not env.td_transforms or not turns:
        return
    slots = [turn.slot for turn in turns]
    action_td = add_row_fields(turns_to_tensordict(turns), [slot.data for slot in slots], env.input_mode)
    next_td = env._with_row_fields(env._layout(slots, **env.step_layout(slots)), slots)
    next_td = with_prompt_history(next_td, slots)
    rows = list(range(len(slots)))
    run_step_transforms(env, slots, rows, action_td, next_td, list_call=True)


def run_step_transforms(
    env: ChatEnv,
    slots: list[SlotState],
    rows: list[int],
    action_td: TensorDictBase,
    next_td: TensorDictBase,
    list_call: bool = False,
) -> TensorDictBase:
    """Run each TensorDict transform's ``_step`` on ``(action_td, next_td)`` and write what they changed back to
    ``slots``, the active slots of this step, found at ``rows`` of the two TensorDicts: the reward (its changes
    in ``reward_components`` under the transform's class name), the messages they appended to the conversation
    (:func:`adopt_conversations`), the entries they added (``next_fields``) and the end flags. Returns the
    transformed ``next_td``."""
    base_keys = set(entry_keys(next_td))
    # no reward entry (the env has no reward source): the slots' rewards, until a transform writes one
    baseline = [torch.zeros(1) for _ in range(next_td.batch_size[0])]
    for slot, i in zip(slots, rows, strict=True):
        baseline[i] = torch.tensor([slot.reward])
    rewards = reward_rows(next_td, None, baseline)
    had_reward = "reward" in next_td.keys()
    totals = {i: float(rewards[i].sum()) for i in rows}
    for transform in env.td_transforms:
        keys_before = set(next_td.keys())
        with rows_as_slots(env, {i: slot.index for slot, i in zip(slots, rows, strict=True)}):
            with named_failure(transform, "_step", list_call):
                next_td = transform._step(action_td, next_td)
        named = keep_row_notes(transform, slots, rows)
        after = reward_rows(next_td, transform, None if had_reward else rewards)  # a reward taken away is named
        had_reward = had_reward or "reward" in next_td.keys()
        parts = [key for key in next_td.keys() if key not in keys_before and str(key).startswith("reward_")]
        for slot, i in zip(slots, rows, strict=True):
            change = reward_change(rewards[i], after[i])
            if parts:  # the transform names its reward's parts (TorchRL's parsers: reward_answer, reward_right, ...)
                for key in parts:
                    slot.reward_components[key] = float(next_td.get(key)[i].sum())
            elif change != 0.0 and i not in named:  # (a transform's noted components name its reward's parts)
                name = type(transform).__name__
                slot.reward_components[name] = slot.reward_components.get(name, 0.0) + change
            totals[i] += change
        rewards = after
    for slot, i in zip(slots, rows, strict=True):
        slot.episode_reward += totals[i] - slot.reward
        slot.reward = totals[i]
    for key in entry_keys(next_td):
        if key not in base_keys and key != "reward":
            values = entry_rows(next_td, key)
            for slot, i in zip(slots, rows, strict=True):
                slot.next_fields[key] = values[i]
                if key == "success":  # TorchRL's reward parsers' flag: the episode's success (accuracy, evaluations)
                    slot.info["success"] = bool(torch.as_tensor(values[i]).any())
    flags = {key: next_td.get(key, None) for key in ("terminated", "truncated", "done")}
    reopened = []
    for slot, i in zip(slots, rows, strict=True):
        if slot.done:
            if _reopens(env, slot, flags, i):
                slot.terminated = slot.truncated = False
                reopened.append(slot)
            elif _flag(flags, "terminated", i) and _cut_at_turn_limit(env, slot):
                slot.terminate()  # a reward parser's answer on the last turn: the task ended (_ended_by_the_task)
                _ended_by_the_task(env, slot)
                _set_flags(next_td, slot, i)
            elif flags["done"] is not None and not bool(flags["done"][i].any()):
                _set_flags(next_td, slot, i)  # cleared, but the turn limit holds: the data says the episode ended
            continue
        if flags["truncated"] is not None and bool(flags["truncated"][i].any()):
            slot.truncate()
        elif any(flags[key] is not None and bool(flags[key][i].any()) for key in ("terminated", "done")):
            slot.terminate()
        if slot.done:
            env._drop_glue(slot)
    running = [not slot.done for slot in slots]
    adopt_conversations(env, slots, rows, next_td, after="step")
    for slot, i, was_running in zip(slots, rows, running, strict=True):
        if was_running and slot.done:  # the tools' output made the next prompt too long (tokens mode's context limit)
            _set_flags(next_td, slot, i)
    for slot in reopened:
        if env.input_mode == "tokens" and slot.segment_is_policy and slot.segment_is_policy[-1]:
            names = ", ".join(type(transform).__name__ for transform in env.td_transforms)
            env._retemplate_after_answer(slot, f"the TensorDict transforms ({names})")  # the next prompt's opening
    return next_td


class EnvTransformError(UserCodeError):
    """An env transform raised on a list call (the flows', the collector's): the message names the transform, the
    hook and the error (the cause is chained), so a run ends in one line that says which of the user's code failed."""


@contextmanager
def named_failure(transform: Any, hook: str, list_call: bool) -> Iterator[None]:
    """A transform's error on a list call becomes an :class:`EnvTransformError` naming the transform and the hook; on
    TorchRL's TensorDict calls it goes on as it was raised (TorchRL's types), with a note naming them. An error
    already said as the user's code (a reward function's) passes untouched."""
    try:
        yield
    except UserCodeError:
        raise
    except Exception as err:
        where = f"env transform {type(transform).__name__}.{hook}"
        if list_call:
            raise EnvTransformError(f"{where} raised {type(err).__name__}: {err}") from err
        err.add_note(f"(raised in {where})")
        raise


@contextmanager
def rows_as_slots(env: ChatEnv, slot_of_row: dict[int, int]) -> Iterator[None]:
    """While the transforms run: which env slot each row of their data is (``env.td_row_slots``; the list calls
    give them the active slots only), for the state they keep per episode (a persistent interpreter)."""
    env.td_row_slots = slot_of_row
    try:
        yield
    finally:
        env.td_row_slots = None


def keep_row_notes(transform: Any, slots: list[SlotState], rows: list[int]) -> set[int]:
    """What a transform noted about this step's rows (``Transform._note_row``) into each slot: reward components,
    ``info`` entries, and the tool calls it ran (``info["tool_calls"]`` with the turn, ``num_tool_calls``,
    ``tool_errors``). Returns the rows it gave (or cleared) reward components for."""
    take = getattr(transform, "take_row_notes", None)
    notes = take() if callable(take) else None
    if not notes:
        return set()
    for slot, i in zip(slots, rows, strict=True):
        note = notes.get(i)
        if note is None:
            continue
        if note.get("replace_reward_components"):
            slot.reward_components.clear()
        slot.reward_components.update(note["reward_components"])
        slot.info.update(note["info"])
        for tool, arguments, result, failed in note["tool_calls"]:
            record = tool_call_record(slot.turn - 1, tool, arguments, result, failed)
            slot.info.setdefault("tool_calls", []).append(record)
            slot.info["num_tool_calls"] = slot.info.get("num_tool_calls", 0) + 1
            slot.info["tool_errors"] = slot.info.get("tool_errors", 0) + int(failed)
    return {
        i for i in rows if i in notes and (notes[i]["reward_components"] or notes[i].get("replace_reward_components"))
    }


def _set_flags(next_td: TensorDictBase, slot: SlotState, row: int) -> None:
    """Row ``row`` of the step data's end flags (``terminated``, ``truncated``, ``done``) from ``slot``."""
    for key, value in (("terminated", slot.terminated), ("truncated", slot.truncated), ("done", slot.done)):
        flags = next_td.get(key, None)
        if isinstance(flags, torch.Tensor):
            flags[row] = value


def _flag(flags: dict[str, Any], key: str, row: int) -> bool:
    return flags[key] is not None and bool(flags[key][row].any())


def _cut_at_turn_limit(env: ChatEnv, slot: SlotState) -> bool:
    """The env truncated the slot at its turn limit in this step (not for a prompt that outgrew the context)."""
    return (
        slot.truncated
        and env.max_turns is not None
        and slot.turn >= env.max_turns
        and not slot.info.get("context_full", False)
    )


def _ended_by_the_task(env: ChatEnv, slot: SlotState) -> None:
    """A transform (they run after the env's turn limit) ended the task on the last turn (a reward parser saw an
    answer): the episode is terminated, not truncated, as when the task ends before the limit."""
    if slot.terminated and _cut_at_turn_limit(env, slot):
        slot.truncated = False


def _reopens(env: ChatEnv, slot: SlotState, flags: dict[str, Any], row: int) -> bool:
    """A transform cleared the done flags of an episode that had ended (``AddThinkingPrompt(undo_done=True)``): it
    goes on, unless it reached the env's turn limit."""
    done = flags["done"]
    if done is None or bool(done[row].any()):
        return False
    if any(flags[key] is not None and bool(flags[key][row].any()) for key in ("terminated", "truncated")):
        return False
    return env.max_turns is None or slot.turn < env.max_turns


def with_prompt_history(td: TensorDictBase, slots: list[SlotState]) -> TensorDictBase:
    """``td`` with the slots' conversations as ``("history", "prompt")``, where its input mode left them out (text
    and tokens modes): what a tool transform reads and extends."""
    if "history" not in td.keys():
        from llmrl_core.data.history import History
        from llmrl_core.modules.policies.outputs import ChatHistory

        prompt = History.from_conversations([slot.history for slot in slots])
        td.set("history", ChatHistory(prompt=prompt, batch_size=td.batch_size))
    return td


def _same_messages(old: list[Message], new: list[Message]) -> bool:
    if len(old) != len(new):
        return False
    return all(a.role == b.role and a.content == b.content for a, b in zip(old, new, strict=True))


def adopt_conversations(env: ChatEnv, slots: list[SlotState], rows: list[int], td: TensorDictBase, after: str) -> None:
    """Make each slot's conversation what the TensorDict transforms left at its row of ``td``'s
    ``("history", "prompt")``. After a ``step`` (TorchRL's tool transforms), messages appended after the answer join
    the conversation: the next prompt carries them (tokens mode: the ids after the answer are rendered again; the ids
    before stay, so a transform that rewrote earlier messages is refused there, naming the transforms; an episode that
    ended takes nothing after its last answer, so its messages and ids stay the same); in history and text modes a
    rewritten conversation is taken as it is. After a ``reset`` the prompt is taken as it is."""
    try:
        prompt = td.get(("history", "prompt"), None)
    except (KeyError, AttributeError):
        return
    if prompt is None or not hasattr(prompt, "to_conversations"):
        return
    conversations = prompt.to_conversations()
    names = ", ".join(type(transform).__name__ for transform in env.td_transforms)
    for slot, i in zip(slots, rows, strict=True):
        if after == "step" and slot.done and env.input_mode == "tokens":
            continue  # an ended episode's ids end with its last answer: its messages do too
        old, new = slot.history.messages, conversations[i].messages
        kept = _same_messages(old, new[: len(old)])
        if kept and len(new) == len(old):
            continue
        if after == "reset":
            slot.history = Conversation(list(new))
            env._start_tokens([slot])
        elif kept:
            for message in new[len(old) :]:
                slot.history.append(message)
            env._retemplate_after_answer(slot, f"the TensorDict transforms ({names})")
        elif env.input_mode == "tokens":
            raise ValueError(
                f"ChatEnv.step: the TensorDict transforms ({names}) changed the conversation up to the answer in "
                f"slot {slot.index}; in tokens mode they may only append messages after it (the ids sampled so far "
                "stay as they were), as TorchRL's tool transforms do"
            )
        else:
            slot.history = Conversation(list(new))
