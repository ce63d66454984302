"""Re-scoring stored responses with another reward: a small registry of named rewards for offline training.

A reward here is a callable on one stored row (a mapping with the trajectory fields ``prompt_id``,
``messages``, ``response_tokens``, ``response_mask``, ``reward``) that returns ``{"reward": r, ...parts}``.
:func:`make_rescorer` builds one by name; :func:`register_reward` adds a factory.

- ``stored``: the row's own reward (no re-scoring).
- ``gsm8k``: ``GSM8KRewardParser`` on the last assistant message against the gold answer of the row's prompt.
  Stored rows carry the prompt id, not the answer: the answer is looked up in ``answers`` (the dataset the
  run drew its prompts from, ``gsm8k:train`` by default) by the row's ``id`` field, else its row index -- the
  rule ``DataLoadingPrimer`` used to assign prompt ids. The looked-up question must appear in the row's user
  message, so a wrong dataset fails loudly instead of scoring against the wrong answers.
- ``gsm8k_strict``: as ``gsm8k`` with no format bonus (``format_reward`` 0).
- ``brevity``: ``1 - min(n, max_tokens) / max_tokens`` for ``n`` assistant tokens (shorter is better).
- ``env``: the run's ``env.rewards`` functions (``module:function`` on ``(prompt, completion, row)``, weighted, as
  the GRPO flow pays them): ``prompt`` is the user message the episode answered, ``completion`` its last
  assistant message, ``row`` the dataset row from ``answers`` when given (else the stored row's ids).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from llmrl_core.builtin_data import gsm8k_path
from llmrl_core.data.conversation import Message, episode_prompt
from llmrl_core.envs.data_sources import open_source
from llmrl_core.envs.gsm8k_reward import GSM8KRewardParser

Rescorer = Callable[[Mapping[str, Any]], dict[str, float]]
RescorerFactory = Callable[..., Rescorer]
REWARDS: dict[str, RescorerFactory] = {}


def register_reward(name: str) -> Callable[[RescorerFactory], RescorerFactory]:
    """Decorator: register a factory ``(answers: str, **options) -> Rescorer`` under ``name``."""

    def add(factory: RescorerFactory) -> RescorerFactory:
        REWARDS[name] = factory
        return factory

    return add


def make_rescorer(name: str, answers: str = "gsm8k:train", **options: Any) -> Rescorer:
    """The reward ``name`` with its ``options`` (see the module docstring for the names)."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; known: {sorted(REWARDS)}")
    try:
        return REWARDS[name](answers=answers, **options)
    except TypeError as err:
        raise ValueError(f"reward {name!r}: bad options {sorted(options)} ({err})") from err


def _row_label(row: Mapping[str, Any]) -> str:
    run, version = row.get("run_id", "?"), row.get("policy_version", "?")
    return f"{run}/v{version}/{row.get('group_id', '?')}#{row.get('sample_index', '?')}"


def last_message(row: Mapping[str, Any], role: str) -> str:
    """Content of the last ``role`` message of a stored row (a clear error when there is none)."""
    for message in reversed(row.get("messages") or []):
        if message.get("role") == role:
            return message.get("content") or ""
    raise ValueError(f"trajectory row {_row_label(row)}: field 'messages' has no {role!r} message")


class AnswerTable:
    """Gold answers by prompt id from a question/answer dataset (``gsm8k:SPLIT`` or a .jsonl/.parquet path)."""

    def __init__(self, source: str) -> None:
        path = gsm8k_path(source.split(":", 1)[1]) if source.startswith("gsm8k:") else Path(source)
        rows = open_source(str(path))
        self.name = str(path)
        self.rows: dict[str, dict[str, Any]] = {}
        for index in range(len(rows)):
            row = rows[index]
            for key in ("question", "answer"):
                if key not in row:
                    raise ValueError(f"{self.name}: row {index} has no field {key!r} (fields: {sorted(row)})")
            self.rows[str(row.get("id", index))] = row

    def lookup(self, row: Mapping[str, Any]) -> str:
        """The gold ``answer`` field for a stored row, after checking its question matches the row's user turn."""
        prompt_id = str(row.get("prompt_id"))
        if prompt_id not in self.rows:
            raise ValueError(f"trajectory row {_row_label(row)}: prompt_id {prompt_id!r} is not a row of {self.name}")
        entry = self.rows[prompt_id]
        if str(entry["question"]).strip() not in last_message(row, "user"):
            raise ValueError(
                f"trajectory row {_row_label(row)}: its user message does not contain question {prompt_id} of "
                f"{self.name}; is rescore.answers the dataset this run drew its prompts from?"
            )
        return str(entry["answer"])


@register_reward("stored")
def _stored(answers: str = "") -> Rescorer:
    return lambda row: {"reward": float(row["reward"])}


@register_reward("gsm8k")
def _gsm8k(answers: str = "gsm8k:train", format_reward: float = 0.1, correct_reward: float = 1.0) -> Rescorer:
    table = AnswerTable(answers)
    parser = GSM8KRewardParser(eos_token="<|im_end|>", format_reward=format_reward, correct_reward=correct_reward)

    def score(row: Mapping[str, Any]) -> dict[str, float]:
        out = parser.score(last_message(row, "assistant"), table.lookup(row))
        return {k: float(v) for k, v in out.items()}

    return score


@register_reward("gsm8k_strict")
def _gsm8k_strict(answers: str = "gsm8k:train", correct_reward: float = 1.0) -> Rescorer:
    return _gsm8k(answers, format_reward=0.0, correct_reward=correct_reward)


@register_reward("brevity")
def _brevity(answers: str = "", max_tokens: int = 256) -> Rescorer:
    if max_tokens < 1:
        raise ValueError("brevity: max_tokens must be >= 1")

    def score(row: Mapping[str, Any]) -> dict[str, float]:
        mask = row.get("response_mask") or [True] * len(row["response_tokens"])
        n = sum(bool(m) for m in mask)
        return {"reward": 1.0 - min(n, max_tokens) / max_tokens, "assistant_tokens": float(n)}

    return score


@register_reward("env")
def _env_rewards(answers: str = "", rewards: Sequence[Any] = ()) -> Rescorer:
    from llmrl_core.envs.reward_calls import describe_row, reward_value
    from llmrl_core.pipeline.reward_functions import RewardFunctionConfig, load_reward_functions

    specs = [r if isinstance(r, RewardFunctionConfig) else RewardFunctionConfig(**r) for r in rewards]
    if not specs:
        raise ValueError("reward 'env' needs the env's reward functions (env.rewards is empty)")
    functions = load_reward_functions(specs)
    table = AnswerTable(answers) if answers else None

    def score(row: Mapping[str, Any]) -> dict[str, float]:
        messages = [Message(m["role"], m.get("content") or "") for m in row["messages"]]
        turns = sum(1 for m in messages if m.role == "assistant") if row.get("turn") is None else int(row["turn"]) + 1
        prompt = episode_prompt(messages, "assistant", turns)
        if table is not None:
            table.lookup(row)  # the row's question must be the stored prompt's: a wrong dataset fails here
            data = dict(table.rows[str(row["prompt_id"])])
        else:
            data = {"prompt_id": row.get("prompt_id")}
        out = {"reward": 0.0}
        row_name = describe_row(row.get("prompt_id"), row.get("group_id"), row.get("sample_index"))
        for fn, weight, name, label in functions:
            value = weight * reward_value(fn, label, prompt, last_message(row, "assistant"), data, row_name)
            out[name] = value
            out["reward"] += value
        return out

    return score
