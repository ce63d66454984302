"""TorchRL's TensorDict door of :class:`~llmrl_core.envs.chat_env.ChatEnv`: reading prompts and actions out of a
TensorDict, and writing an env output back as TorchRL lays it out.

Layout (TorchRL's ``ChatEnv``): a reset returns ``history`` (a ``ChatHistory`` whose ``prompt`` is each slot's
conversation so far), ``text`` (``Text(prompt=...)``, text and tokens modes), ``tokens`` (``Tokens(prompt=...)``,
tokens mode), the data key (e.g. ``query``) and ``done``/``terminated`` of shape ``(B, 1)``; a step writes the same
under ``"next"`` plus ``truncated`` and ``reward`` ``(B, 1)``. An action is read from ``("history", "full")``
(the whole conversation: its last message is the answer), ``("history", "response")``, a bare ``History`` under
``"history"`` (taken as the full conversation), ``("text", "response")`` (or TorchRL's older
``"text_response"``); a reset reads the data key (``query``), or TorchRL's older ``text=`` field when the data
key is absent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase, is_tensor_collection, lazy_stack

from llmrl_core.data.conversation import Conversation
from llmrl_core.data.history import History
from llmrl_core.data.llm_data import Response
from llmrl_core.envs.types import EnvOutput, SlotState

_LAYOUT_KEYS = ("history", "text", "tokens", "log_probs", "done", "terminated", "truncated", "reward", "next")


def plain_value(value: Any) -> Any:
    """A TensorDict leaf as plain Python: a ``NonTensorData``'s value, a ``NonTensorStack``'s list, other values as
    they are (a tensor stays a tensor)."""
    if isinstance(value, NonTensorData | NonTensorStack):
        return value.tolist()
    if hasattr(value, "tolist") and not isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def rows_from_tensordict(td: TensorDictBase, data_key: str) -> list[dict[str, Any]]:
    """One prompt row per batch entry of a reset TensorDict: every non-tensor field (``query``, ``answer``, ...)."""
    if td.batch_dims != 1:
        raise ValueError(f"ChatEnv.reset expects a TensorDict with one batch dimension, got {tuple(td.batch_size)}")
    size = td.batch_size[0]
    fields: dict[str, list[Any]] = {}
    for key in td.keys():
        if key in _LAYOUT_KEYS:
            continue
        values = plain_value(td.get(key))
        if isinstance(values, list) and len(values) == size:
            fields[key] = values
    if data_key not in fields and isinstance(td.get("text", None), NonTensorData | NonTensorStack):
        fields[data_key] = plain_value(td.get("text"))  # TorchRL's older calls: reset(TensorDict(text=...))
        if not isinstance(fields[data_key], list):
            fields[data_key] = [fields[data_key]] * size
    if data_key not in fields:
        raise KeyError(
            f"ChatEnv.reset: the TensorDict has no {data_key!r} entry (the env's data_key); "
            f"it has {sorted(str(k) for k in td.keys())}"
        )
    return [{name: values[i] for name, values in fields.items()} for i in range(size)]


def _last_content(history: History) -> str:
    messages = history.to_messages()
    if not messages:
        raise ValueError("ChatEnv.step: an action's conversation is empty")
    return messages[-1].text


def actions_from_tensordict(td: TensorDictBase, policy_role: str) -> list[str | None]:
    """The answer of each slot in a step TensorDict (see the module docstring for the keys read)."""
    history = td.get("history", None)
    if isinstance(history, History):
        histories = [history[i] for i in range(td.batch_size[0])]
        return [_last_content(h) for h in histories]
    if history is not None:
        full = getattr(history, "full", None)
        if full is not None:
            return [_last_content(full[i]) for i in range(td.batch_size[0])]
        response = getattr(history, "response", None)
        if response is not None:
            return ["".join(m.text for m in response[i].to_messages()) for i in range(td.batch_size[0])]
    text = td.get(("text", "response"), None) if is_tensor_collection(td.get("text", None)) else None
    if text is None:
        text = td.get("text_response", None)  # TorchRL's older key for the sampled text
    if text is not None:
        values = plain_value(text)
        return [str(plain_value(t)) for t in (values if isinstance(values, list) else [values])]
    raise KeyError(
        "ChatEnv.step: no action found; expected ('history', 'full'), ('history', 'response'), a History under "
        f"'history' or ('text', 'response'); got keys {sorted(str(k) for k in td.keys(True, True))}"
    )


def output_to_tensordict(out: EnvOutput, input_mode: str, with_reward: bool) -> TensorDict:
    """An :class:`EnvOutput` as TorchRL's ChatEnv TensorDict (see the module docstring)."""
    from llmrl_core.modules.policies.common import ChatHistory, Text, Tokens

    size = out.batch_size
    fields: dict[str, Any] = {
        "history": ChatHistory(prompt=History.from_conversations(list(out.history)), batch_size=(size,)),
        "done": out.done.reshape(size, 1).clone(),
        "terminated": out.terminated.reshape(size, 1).clone(),
    }
    if with_reward:  # TorchRL's reset carries done/terminated only; a step may also be cut short (max_turns)
        fields["truncated"] = out.truncated.reshape(size, 1).clone()
    if out.text is not None and input_mode in ("text", "tokens"):
        fields["text"] = Text(prompt=list(out.text), batch_size=(size,))
    if out.tokens is not None and input_mode == "tokens":  # ragged ids: one Tokens per slot, lazily stacked
        fields["tokens"] = lazy_stack([Tokens(prompt=ids, padded=False, batch_size=()) for ids in out.tokens])
    if with_reward:
        fields["reward"] = out.reward.reshape(size, 1).to(torch.float32)
    return TensorDict(fields, batch_size=(size,))


def add_row_fields(td: TensorDictBase, rows: Sequence[Mapping[str, Any]]) -> TensorDictBase:
    """Write the prompt rows' fields (``query``, ``answer``, ...) into ``td``, one entry per row (a stack, as TorchRL
    writes them), except a field named like a layout entry (``text``), which the layout holds already."""
    for name in rows[0] if rows else ():
        if name not in _LAYOUT_KEYS and name not in td.keys():
            td.set(name, [row.get(name) for row in rows])
    return td


@dataclass
class Turn:
    """One slot's answer in a list-call step: the slot, how many messages its conversation had once the answer was
    appended (tools may add more after), the answer, and the tokens-mode prompt text it answered."""

    slot: SlotState
    messages_with_answer: int
    response: Response
    prompt_text: str | None


def turns_to_tensordict(turns: Sequence[Turn]) -> TensorDict:
    """The action data of a step made by a list call, in TorchRL's layout (see ``ChatEnv._td_step``)."""
    from llmrl_core.modules.policies.common import ChatHistory, LogProbs, Text, Tokens

    size = len(turns)
    messages = [turn.slot.history.messages[: turn.messages_with_answer] for turn in turns]
    fields: dict[str, Any] = {
        "history": ChatHistory(
            prompt=History.from_conversations([Conversation(list(m[:-1])) for m in messages]),
            response=History.from_conversations([Conversation([m[-1]]) for m in messages]),
            full=History.from_conversations([Conversation(list(m)) for m in messages]),
            batch_size=(size,),
        )
    }
    answers = [turn.response.text for turn in turns]
    if all(turn.prompt_text is not None for turn in turns):
        prompts = [str(turn.prompt_text) for turn in turns]
        fields["text"] = Text(
            prompt=prompts,
            response=answers,
            full=[p + a for p, a in zip(prompts, answers, strict=True)],
            batch_size=(size,),
        )
    else:
        fields["text"] = Text(response=answers, batch_size=(size,))
    if all(turn.response.token_ids is not None for turn in turns):
        fields["tokens"] = lazy_stack(
            [Tokens(response=turn.response.token_ids, padded=False, batch_size=()) for turn in turns]
        )
    if all(turn.response.log_probs is not None for turn in turns):
        fields["log_probs"] = lazy_stack(
            [LogProbs(response=turn.response.log_probs, padded=False, batch_size=()) for turn in turns]
        )
    return TensorDict(fields, batch_size=(size,))


def per_slot_reward(td: TensorDictBase, transform: Any) -> list[float]:
    """The ``reward`` entry of a step's ``"next"`` data as one number per slot (a per-token reward ``(T, 1)``
    counts as its sum); ``transform`` is named when it left no reward behind."""
    reward = td.get("reward", None)
    if reward is None:
        after = f" after {type(transform).__name__}._step" if transform is not None else ""
        raise KeyError(f"ChatEnv.step: the step data has no 'reward'{after}; keys {sorted(map(str, td.keys()))}")
    if isinstance(reward, torch.Tensor) and not reward.is_nested:
        return reward.reshape(td.batch_size[0], -1).sum(-1).tolist()
    return [float(torch.as_tensor(row).sum()) for row in reward.unbind(0)]
