"""TorchRL's TensorDict door of :class:`~llmrl_core.envs.chat_env.ChatEnv`: reading prompts and actions out of a
TensorDict, and writing an env output back as TorchRL lays it out.

Layout (TorchRL's ``ChatEnv``): a reset returns the prompt in the env's input mode only: ``history`` (a
``ChatHistory`` whose ``prompt`` is each slot's conversation so far), ``text`` (``Text(prompt=...)``) or ``tokens``
(``Tokens(prompt=...)``); then the data key (e.g. ``query``) and ``done``/``terminated`` of shape ``(B, 1)``; a step
writes the same under ``"next"``, plus ``reward`` ``(B, 1)`` when the env has a reward source (one value for the
answer; ``(B, 1, 1)`` with the GSM8K and IFEval parsers, as TorchRL's; a transform may widen it to one value per
token, ``(B, T, 1)``, as TorchRL's KL transforms do) and
``truncated`` when it can cut an episode short (``max_turns``, a prompt-token limit): a bare env writes neither,
as TorchRL's. An action is read from
``("history", "full")`` (the whole conversation: its last message is the answer), ``("history", "response")``, a bare
``History`` under ``"history"`` (taken as the full conversation), ``("text", "response")`` (or TorchRL's older
``"text_response"``), what ``("text", "full")`` adds to ``("text", "prompt")`` (TorchRL's env reads ``full``),
or ``("tokens", "response")`` decoded with the env's tokenizer; the sampled ids and log-probs
(``("tokens", "response")``, ``("log_probs", "response")``) ride along with the answer. A reset reads the data key
(``query``), or TorchRL's older ``text=`` field when the data key is absent.

llmrl's list calls (``reset(prompts)``, ``reset_slots``, ``step(answers)``) answer the same layout for every slot,
with every prompt entry the env has and llmrl's per-row entries (:func:`slots_view`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import (
    NonTensorData,
    NonTensorStack,
    TensorDict,
    TensorDictBase,
    is_tensor_collection,
    is_tensorclass,
    lazy_stack,
)
from tensordict.utils import NestedKey

from llmrl_core.data.conversation import Conversation
from llmrl_core.data.history import History
from llmrl_core.data.llm_data import Response
from llmrl_core.envs.types import SlotState

_LAYOUT_KEYS = ("history", "text", "tokens", "log_probs", "done", "terminated", "truncated", "reward", "next")


def plain_value(value: Any) -> Any:
    """A TensorDict leaf as plain Python: a ``NonTensorData``'s value, a ``NonTensorStack``'s list, other values as
    they are (a tensor stays a tensor)."""
    if isinstance(value, NonTensorData | NonTensorStack):
        return value.tolist()
    if hasattr(value, "tolist") and not isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def row_field_lists(td: TensorDictBase) -> dict[str, list[Any]]:
    """The prompt rows' fields a one-dimensional TensorDict carries (``query``, ``answer``, ...: every top-level
    entry outside TorchRL's layout with one plain value per row), as ``{name: [value per row]}``."""
    size = td.batch_size[0]
    fields: dict[str, list[Any]] = {}
    for key in td.keys():
        if key in _LAYOUT_KEYS:
            continue
        values = plain_value(td.get(key))
        if isinstance(values, torch.Tensor) and values.ndim == 1 and len(values) == size:
            values = values.tolist()  # numbers, one per row (a row's integer id)
        if isinstance(values, list) and len(values) == size:
            fields[key] = values
    return fields


def rows_from_tensordict(td: TensorDictBase, data_key: str) -> list[dict[str, Any]]:
    """One prompt row per batch entry of a reset TensorDict: every non-tensor field (``query``, ``answer``, ...)."""
    if td.batch_dims != 1:
        raise ValueError(f"ChatEnv.reset expects a TensorDict with one batch dimension, got {tuple(td.batch_size)}")
    size = td.batch_size[0]
    fields = row_field_lists(td)
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


def _answer_texts(td: TensorDictBase, text_first: bool) -> tuple[list[str], list[bool]] | None:
    """Each row's answer text from the conversation or the sampled text (that one first with ``text_first``), and
    whether the answer's turn is complete (False: the conversation's last message says it was cut); None when the
    data has neither."""
    if text_first and (sampled := _sampled_texts(td)) is not None:
        return sampled
    size = td.batch_size[0]
    history = td.get("history", None)
    full = history if isinstance(history, History) else getattr(history, "full", None)
    if full is not None:
        messages = [h.to_messages() for h in (full[i] for i in range(size))]
        if any(not m for m in messages):
            raise ValueError("ChatEnv.step: an action's conversation is empty")
        return [m[-1].text for m in messages], [m[-1].is_complete is not False for m in messages]
    response = getattr(history, "response", None) if history is not None else None
    if response is not None:
        messages = [response[i].to_messages() for i in range(size)]
        return ["".join(m.text for m in row) for row in messages], [
            all(m.is_complete is not False for m in row) for row in messages
        ]
    return _sampled_texts(td)


def _sampled_texts(td: TensorDictBase) -> tuple[list[str], list[bool]] | None:
    structured = is_tensor_collection(td.get("text", None))
    text = td.get(("text", "response"), None) if structured else None
    if text is None:
        text = td.get("text_response", None)  # TorchRL's older key for the sampled text
    if text is None and structured and td.get(("text", "full"), None) is not None:
        prompt = td.get(("text", "prompt"), None)
        full = _text_rows(td.get(("text", "full")))
        return _answers_after_prompts(full, None if prompt is None else _text_rows(prompt))
    if text is None:
        return None
    texts = _text_rows(text)
    return texts, [True] * len(texts)


def _text_rows(value: Any) -> list[str]:
    values = plain_value(value)
    return [str(plain_value(t)) for t in (values if isinstance(values, list) else [values])]


def _answers_after_prompts(full: list[str], prompts: list[str] | None) -> tuple[list[str], list[bool]]:
    """Text mode with only ``("text", "full")`` (TorchRL's env reads that one): each answer is what follows its
    prompt, ``("text", "prompt")``."""
    if prompts is None or len(prompts) != len(full):
        raise KeyError("('text', 'full') is given without ('text', 'prompt') of the same rows: no answer to cut out")
    answers = []
    for i, (whole, prompt) in enumerate(zip(full, prompts, strict=True)):
        if not whole.startswith(prompt):
            raise ValueError(f"row {i}: ('text', 'full') does not start with its ('text', 'prompt')")
        answers.append(whole[len(prompt) :])
    return answers, [True] * len(answers)


def _sampled_rows(td: TensorDictBase, key: NestedKey) -> list[torch.Tensor] | None:
    """The rows of a response entry (``("tokens", "response")``, ``("log_probs", "response")``) without padding:
    a padded output keeps the positions its attention mask marks (the response is the mask's last columns)."""
    if key not in td.keys(include_nested=True):
        return None
    value = td.get(key, as_list=True)
    if not isinstance(value, torch.Tensor):
        return [torch.as_tensor(row) for row in value]
    rows = list(value.reshape(value.shape[0], -1).unbind(0))
    attention = td.get(("masks", "all_attention_mask"), None) if "masks" in td.keys() else None
    if isinstance(attention, torch.Tensor) and attention.ndim == 2 and attention.shape[-1] >= value.shape[-1]:
        keep = attention[:, -value.shape[-1] :].bool()
        rows = [row[k] for row, k in zip(rows, keep.unbind(0), strict=True)]
    return rows


# What a TorchRL policy writes for a row beside its answer, and a collector's dialog-turn row carries as TorchRL's does.
POLICY_ROW_KEYS = (
    ("tokens", "prompt"),
    ("tokens", "full"),
    ("masks", "all_attention_mask"),
    ("masks", "all_assistant_mask"),
    ("log_probs", "full"),
)


def policy_row_fields(td: TensorDictBase) -> list[dict[tuple[str, str], torch.Tensor]]:
    """Each row's entries of :data:`POLICY_ROW_KEYS` in a policy's output (ragged rows at their own length)."""
    fields: list[dict[tuple[str, str], torch.Tensor]] = [{} for _ in range(td.batch_size[0])]
    for key in POLICY_ROW_KEYS:
        rows = td.get(key, None, as_list=True)
        for row, value in zip(fields, rows if rows is not None else (), strict=False):
            if isinstance(value, torch.Tensor):
                row[key] = value
    return fields


def responses_from_tensordict(td: TensorDictBase, tokenizer: Any = None, text_first: bool = False) -> list[Response]:
    """The answer of each row of a policy's output or a step's action data, as a :class:`Response`.

    The text comes from the conversation (``("history", "full")``'s last message, ``("history", "response")``, a
    bare ``History``), the sampled text (``("text", "response")``, ``"text_response"``), or, when neither is there,
    the sampled ids decoded with ``tokenizer``. The sampled ids and log-probs (``("tokens", "response")``,
    ``("log_probs", "response")``, padding removed) ride along, so a tokens-mode env keeps them exactly; a message
    marked incomplete reads as cut by the token limit (``finish_reason="length"``), unless the data says why each
    answer ended (``"finish_reason"``, what a wrapper on an engine writes). ``text_first`` (a policy's fresh output)
    reads the sampled text before the conversation.
    """
    ids = _sampled_rows(td, ("tokens", "response"))
    log_probs = _sampled_rows(td, ("log_probs", "response"))
    answers = _answer_texts(td, text_first)
    if answers is None:
        if ids is None:
            raise KeyError(
                "no answer found; expected ('history', 'full'), ('history', 'response'), a History under 'history', "
                "('text', 'response'), ('text', 'full') or ('tokens', 'response'); got keys "
                f"{sorted(str(k) for k in td.keys(True))}"
            )
        if tokenizer is None:
            raise ValueError("the answers are token ids only (('tokens', 'response')): decoding them needs a tokenizer")
        answers = ([tokenizer.decode(row.tolist(), skip_special_tokens=False) for row in ids], [True] * len(ids))
    texts, complete = answers
    reasons = td.get("finish_reason", None) if "finish_reason" in td.keys() else None
    reasons = _text_rows(reasons) if reasons is not None else [None if whole else "length" for whole in complete]
    out = []
    for i, (text, reason) in enumerate(zip(texts, reasons, strict=True)):
        row_ids = ids[i].to(torch.long) if ids is not None else None
        row_lps = log_probs[i] if log_probs is not None else None
        if row_ids is not None and row_lps is not None and row_lps.shape != row_ids.shape:
            row_lps = None
        out.append(Response(text, token_ids=row_ids, log_probs=row_lps, finish_reason=reason))
    return out


def actions_from_tensordict(td: TensorDictBase, tokenizer: Any = None) -> list[Response]:
    """The answer of each slot in a step TensorDict (:func:`responses_from_tensordict`, named as the env's)."""
    try:
        return responses_from_tensordict(td, tokenizer)
    except KeyError as err:
        raise KeyError(f"ChatEnv.step: {err.args[0]}") from None
    except ValueError as err:
        raise ValueError(f"ChatEnv.step: {err}") from None


def output_to_tensordict(
    slots: Sequence[SlotState],
    prompts: SlotPrompts,
    input_mode: str,
    *,
    step: bool = False,
    reward: tuple[int, ...] | None = None,
    truncated: bool = False,
) -> TensorDict:
    """The env's ``slots`` as TorchRL's ChatEnv TensorDict (see the module docstring), their prompts rendered in
    ``prompts``. A reset's carries ``done``/``terminated`` and the prompt of the env's ``input_mode`` (``"all"``:
    every mode's prompt the env has); a ``step``'s adds what the transforms wrote for ``"next"``
    (:func:`stack_next_fields`), ``reward`` of one row's shape ``reward`` when given (the env has a reward source)
    and ``truncated`` when asked (the env can cut an episode short): TorchRL's bare ``ChatEnv`` writes neither."""
    from llmrl_core.modules.policies.outputs import ChatHistory, Text, Tokens

    size = len(slots)
    fields: dict[str, Any] = {
        "done": torch.tensor([s.done for s in slots], dtype=torch.bool).reshape(size, 1),
        "terminated": torch.tensor([s.terminated for s in slots], dtype=torch.bool).reshape(size, 1),
    }
    if truncated:
        fields["truncated"] = torch.tensor([s.truncated for s in slots], dtype=torch.bool).reshape(size, 1)
    every = input_mode == "all"
    if every or input_mode == "history":  # as TorchRL: one prompt entry, the one of the env's input mode
        conversations = [s.history for s in slots]
        fields["history"] = ChatHistory(prompt=History.from_conversations(conversations), batch_size=(size,))
    if prompts.text is not None and (every or input_mode == "text"):
        fields["text"] = Text(prompt=list(prompts.text), batch_size=(size,))
    if prompts.tokens is not None and (every or input_mode == "tokens"):  # ragged ids: one Tokens per slot, lazily
        fields["tokens"] = lazy_stack([Tokens(prompt=ids, padded=False, batch_size=()) for ids in prompts.tokens])
    if reward is not None:
        fields["reward"] = torch.tensor([s.reward for s in slots], dtype=torch.float32).reshape(size, *reward)
    if step:
        fields.update(stack_next_fields([s.next_fields for s in slots]))
    return TensorDict(fields, batch_size=(size,))


def slots_view(slots: Sequence[SlotState], prompts: SlotPrompts) -> TensorDict:
    """The answer of llmrl's list calls (``reset(prompts)``, ``reset_slots``, ``step(answers)``): TorchRL's layout
    of every slot (every prompt entry the env has: ``("history", "prompt")`` always, ``("text", "prompt")`` in text
    and tokens modes, ``("tokens", "prompt")`` in tokens mode; ``reward``, ``done``, ``terminated``, ``truncated``
    ``(B, 1)``; what the transforms wrote for the step), the prompt rows' fields (``query``, ``answer``, ...) and
    llmrl's per-row entries: the slot's ``turn`` and ``sample_index`` (``(B,)`` longs), its ``prompt_id`` and
    ``group_id``, the step's ``reward_components`` and the episode's ``info`` (dicts). A prompt row's field named
    like one of these entries is not repeated at the top level (``env.slots[i].data`` keeps every field)."""
    td = output_to_tensordict(slots, prompts, "all", step=True, reward=(1,), truncated=True)
    td.set("turn", torch.tensor([s.turn for s in slots], dtype=torch.long))
    td.set("sample_index", torch.tensor([s.sample_index for s in slots], dtype=torch.long))
    for name in ("prompt_id", "group_id"):
        td.set(name, NonTensorStack(*[NonTensorData(getattr(s, name)) for s in slots]))
    td.set("reward_components", NonTensorStack(*[NonTensorData(dict(s.reward_components)) for s in slots]))
    td.set("info", NonTensorStack(*[NonTensorData(s.info) for s in slots]))
    return add_row_fields(td, [s.data for s in slots], "text" if "text" in td.keys() else "history")


def active_rows(td: TensorDictBase) -> list[int]:
    """The rows of a list call's answer (or any TensorDict with ``done``) whose episode still needs an action."""
    return [i for i, done in enumerate(td.get("done").reshape(td.batch_size[0], -1).any(-1).tolist()) if not done]


@dataclass
class SlotPrompts:
    """The slots' prompts as the policy reads them: the rendered ``text`` (text and tokens modes) and the exact
    ``tokens`` (tokens mode); None where the env's input mode has none."""

    text: list[str] | None = None
    tokens: list[torch.Tensor] | None = None


def stack_next_fields(rows: Sequence[Mapping[Any, Any]]) -> dict[Any, Any]:
    """What the transforms wrote for the step's ``"next"`` data (e.g. ``IfEvalScorer``'s score), one entry per key
    stacked over the slots; a slot without the entry (it was done before the step) gets a zeroed copy of another
    slot's. Entries that are neither tensors nor tensor collections stay out (they live in ``slot.info``)."""
    keys = {key for row in rows for key in row}
    stacked: dict[Any, Any] = {}
    for key in sorted(keys, key=str):
        values = [row.get(key) for row in rows]
        template = next(value for value in values if value is not None)
        if not (isinstance(template, torch.Tensor) or is_tensor_collection(template)):
            continue
        filled = [value if value is not None else template.clone().zero_() for value in values]
        ragged = isinstance(template, torch.Tensor) and len({tuple(value.shape) for value in filled}) > 1
        # ragged tensors as a nested tensor, as TorchRL's KL transforms write theirs
        stacked[key] = torch.nested.nested_tensor(filled, layout=torch.strided) if ragged else lazy_stack(filled)
    return stacked


def step_row_fields(tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> list[dict[str, Any]]:
    """Each row's prompt fields in a step: the action data's, then the ``"next"`` data's (which win)."""
    fields = row_field_lists(tensordict) if tensordict.batch_dims == 1 else {}
    fields.update(row_field_lists(next_tensordict))
    return [{name: values[i] for name, values in fields.items()} for i in range(next_tensordict.batch_size[0])]


def add_per_row(existing: torch.Tensor, value: torch.Tensor, owner: str, name: str) -> torch.Tensor:
    """``existing`` (one value per row, any trailing shape) plus ``value`` ``(B, 1, 1)``, in ``value``'s shape: a
    reward transform adding its ``name`` entry to one already in the step data."""
    if existing.numel() != value.numel():
        raise ValueError(
            f"{owner}: the step data's {name!r} has shape {tuple(existing.shape)}, not one value per row; "
            f"{owner} adds its {name!r} of shape {tuple(value.shape)} to it"
        )
    return existing.reshape(value.shape).to(value.dtype) + value


def step_flattened(transform: Any, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> bool:
    """A reward transform's ``_step`` on a step with more than one batch dimension (a collector's ``(envs, steps)``
    stack): runs ``transform._step`` on the flat views (so the rows are written in place) and answers True; False
    when the data has one batch dimension already; a step without one is refused, naming the transform."""
    if next_tensordict.batch_dims == 1:
        return False
    if next_tensordict.batch_dims == 0:
        raise ValueError(f"{type(transform).__name__}: the step data has no batch dimension")
    with tensordict.view(-1) as flat, next_tensordict.view(-1) as next_flat:
        transform._step(flat, next_flat)
    return True


def end_rows(next_tensordict: TensorDictBase, ended: Sequence[bool]) -> None:
    """Set ``done`` and ``terminated`` in the rows ``ended`` marks (a reward transform that saw the answer)."""
    size = next_tensordict.batch_size[0]
    marked = torch.tensor(list(ended), dtype=torch.bool, device=next_tensordict.device).reshape(size, 1)
    for key in ("done", "terminated"):
        flags = next_tensordict.get(key, None)
        if isinstance(flags, torch.Tensor):
            next_tensordict.set(key, flags | marked.expand_as(flags))


def add_row_fields(td: TensorDictBase, rows: Sequence[Mapping[str, Any]], input_mode: str) -> TensorDictBase:
    """Write the prompt rows' fields (``query``, ``answer``, ...) into ``td``, one entry per row (a stack, as TorchRL
    writes them), except a field named like a layout entry, which the layout holds; a ``text`` field is the rows'
    in history mode (TorchRL's IFEval rows carry their prompt so), the layout's in text and tokens modes. A field
    some rows lack is None in those rows."""
    reserved = set(_LAYOUT_KEYS) - ({"text"} if input_mode == "history" else set())
    names = dict.fromkeys(name for row in rows for name in row)  # every row's fields, in first-seen order
    for name in names:
        if name not in reserved and name not in td.keys():
            td.set(name, [row.get(name) for row in rows])
    return td


@dataclass
class Turn:
    """One slot's answer in a list-call step: the slot, how many messages its conversation had once the answer was
    appended (tools may add more after), the answer, and the tokens-mode prompt text and ids it answered."""

    slot: SlotState
    messages_with_answer: int
    response: Response
    prompt_text: str | None
    prompt_ids: torch.Tensor | None = None


def turns_to_tensordict(turns: Sequence[Turn]) -> TensorDict:
    """The action data of a step made by a list call, in TorchRL's layout (see
    :func:`llmrl_core.envs.td_list_calls.run_td_step`)."""
    from llmrl_core.modules.policies.outputs import ChatHistory, LogProbs, Text

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
        with_prompt = all(turn.prompt_ids is not None for turn in turns)
        fields["tokens"] = lazy_stack([_turn_tokens(turn, with_prompt) for turn in turns])
    if all(turn.response.log_probs is not None for turn in turns):
        fields["log_probs"] = lazy_stack(
            [LogProbs(response=turn.response.log_probs, padded=False, batch_size=()) for turn in turns]
        )
    return TensorDict(fields, batch_size=(size,))


def _turn_tokens(turn: Turn, with_prompt: bool) -> Any:
    """One turn's ``Tokens``: the answer's ids, and with ``with_prompt`` the ids it followed and the two joined."""
    from llmrl_core.modules.policies.outputs import Tokens

    response = turn.response.token_ids.to(torch.long)
    if not with_prompt:
        return Tokens(response=response, padded=False, batch_size=())
    return Tokens(
        prompt=turn.prompt_ids,
        response=response,
        full=torch.cat([turn.prompt_ids, response]),
        padded=False,
        batch_size=(),
    )


def reward_rows(td: TensorDictBase, transform: Any, missing: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """The ``reward`` entry of a step's ``"next"`` data, one tensor (a copy) per slot; ``missing`` when the data has
    none (an env without a reward source, before any transform rewarded), else an error naming ``transform``."""
    reward = td.get("reward", None)
    if reward is None and missing is not None:
        return missing
    if reward is None:
        after = f" after {type(transform).__name__}._step" if transform is not None else ""
        raise KeyError(f"ChatEnv.step: the step data has no 'reward'{after}; keys {sorted(map(str, td.keys()))}")
    # copies: a transform may change the entry in place (``reward.zero_()``, as TorchRL's do)
    if isinstance(reward, torch.Tensor) and not reward.is_nested:
        return list(reward.detach().to(torch.float32, copy=True).unbind(0))
    return [torch.as_tensor(row).detach().to(torch.float32, copy=True) for row in reward.unbind(0)]


def reward_change(before: torch.Tensor, after: torch.Tensor) -> float:
    """How much a transform changed one slot's reward. A one-value reward widened to one value per token (TorchRL's
    KL transforms: each token carries the answer's reward minus its KL) changed it by the sum of the per-token
    differences; otherwise the reward counts as its sum (a per-token ``(T, 1)`` reward is the sum of its tokens)."""
    if before.numel() == 1 and after.numel() > 1:
        return float((after - before.reshape(())).sum())
    return float(after.sum() - before.sum())


def entry_is_leaf(kind: type) -> bool:
    """Where the keys of a step's data stop: at tensors, non-tensor data and tensorclasses (a transform's typed
    entry, e.g. IFEval's ``IFEvalScoreData``, stays one entry with its class)."""
    return not is_tensor_collection(kind) or is_tensorclass(kind) or issubclass(kind, NonTensorData | NonTensorStack)


def entry_keys(td: TensorDictBase) -> list[NestedKey]:
    """The keys of ``td``'s entries down to :func:`entry_is_leaf` (a top-level entry by its name, a nested one by
    its tuple): a tensorclass is one entry, not the fields inside it."""
    keys: list[NestedKey] = []
    for key, value in td.items():
        if is_tensor_collection(value) and not entry_is_leaf(type(value)):
            keys.extend((key, *(sub if isinstance(sub, tuple) else (sub,))) for sub in entry_keys(value))
        else:
            keys.append(key)
    return keys


def entry_rows(td: TensorDictBase, key: NestedKey) -> list[Any]:
    """One value per row of ``td``'s entry ``key``: a tensor per row (ragged rows of a lazy stack or a nested
    tensor come back at their own lengths), a tensorclass's rows as that class, the plain value of a non-tensor
    entry."""
    whole = td.get(key)
    if is_tensorclass(whole) and not isinstance(whole, NonTensorData | NonTensorStack):
        return list(whole.unbind(0))
    value = td.get(key, as_list=True)
    if isinstance(value, torch.Tensor):
        return [row.detach() for row in value.unbind(0)]
    if isinstance(value, list):
        return [row.detach() if isinstance(row, torch.Tensor) else plain_value(row) for row in value]
    return [plain_value(row) for row in value.unbind(0)]
