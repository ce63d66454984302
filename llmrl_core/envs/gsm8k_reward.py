"""``GSM8KRewardParser``: TorchRL's current GSM8K reward scheme as an env transform.

* The answer is the content of the first ``<answer>...</answer>`` in the policy's last message (stripped);
  ``<think>...</think>`` likewise gives the reasoning. The end-of-turn / EOS marker is removed first.
* The gold answer is the text after ``####`` in the row's ``answer`` field (the whole field if it has none).
* Both are normalised: whitespace stripped; ``,``, ``$`` and ``%`` removed; a trailing ``.`` removed; and,
  for decimals, trailing zeros removed (``"120.00"`` -> ``"120"``).
* Reward: ``correct_reward`` (1.0) if equal, ``format_reward`` (0.1) if an answer tag with non-empty content
  is present but wrong, 0.0 without one.
* Outputs per slot: ``reward_components`` = ``reward_answer`` (1.0 if an answer was given), ``reward_think``
  (1.0 if a non-empty think block), ``reward_right`` (the reward); ``info["success"]`` (bool). The episode
  terminates once an answer is given (``set_done_if_answer``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from llmrl_core.envs.transforms.base import SlotTransform
from llmrl_core.envs.types import SlotState

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def normalize_answer(answer: str) -> str:
    """Normalise a numeric answer for comparison (see the module docstring)."""
    answer = answer.strip()
    for char in ",$%":
        answer = answer.replace(char, "")
    answer = answer.rstrip(".")
    if "." in answer:
        answer = answer.rstrip("0").rstrip(".")
    return answer


def extract_tags(text: str) -> tuple[str, str]:
    """``(think, answer)``: stripped contents of the first think and answer blocks ("" when absent)."""
    think = _THINK.search(text)
    answer = _ANSWER.search(text)
    return (think.group(1).strip() if think else "", answer.group(1).strip() if answer else "")


def gold_answer(answer_field: str) -> str:
    """The gold final answer: the text after the last ``####``, or the whole field when there is none."""
    return answer_field.rsplit("####", 1)[1] if "####" in answer_field else answer_field


_RESPONSE_ROOTS = ("history", "text", "tokens", "text_response")
_DEFAULT_OUT_KEYS = ("reward_answer", "reward_think", "reward_right", "reward", "success")
_INPUT_MODES = ("history", "text", "tokens")


def _key_root(key: Any) -> Any:
    """The first element of a (possibly nested) TorchRL key."""
    return key[0] if isinstance(key, tuple) and key else key


class GSM8KRewardParser(SlotTransform):
    """Scores the policy's answer against the row's gold ``answer`` (TorchRL's GSM8K reward scheme).

    The arguments follow TorchRL's order. ``in_keys`` is ``[response_key, answer_key]`` as in TorchRL: the
    response is always the slot's last policy message here (any TorchRL response key rooted at ``history``,
    ``text``, ``tokens`` or ``text_response`` is accepted), and a string second key names the row field holding
    the gold answer (it overrides ``answer_key``). ``out_keys`` must be None or TorchRL's default list: the
    outputs always go to ``reward_components`` / ``info["success"]``. ``input_mode`` is checked and stored; the
    message text is scored in every mode. ``answer_key`` (llmrl only) names the gold answer field. A TensorDict
    step's ``"next"`` data carries the reward and its parts as TorchRL's does: ``reward``, ``reward_answer``,
    ``reward_think``, ``reward_right`` (float) and ``success`` (bool), each ``(B, 1, 1)``.
    """

    reward_shape = (1, 1)
    reward_fields = (
        ("reward_answer", torch.float32),
        ("reward_think", torch.float32),
        ("reward_right", torch.float32),
        ("success", torch.bool),
    )

    def __init__(
        self,
        tokenizer: Any = None,
        in_keys: Sequence[Any] | None = None,
        out_keys: Sequence[Any] | None = None,
        eos_token: str | None = None,
        set_done_if_answer: bool = True,
        input_mode: str | None = None,
        format_reward: float = 0.1,
        correct_reward: float = 1.0,
        *,
        answer_key: str = "answer",
    ) -> None:
        super().__init__()
        if in_keys is not None:
            in_keys = [in_keys] if isinstance(in_keys, (str, tuple)) else list(in_keys)
            if not 1 <= len(in_keys) <= 2 or _key_root(in_keys[0]) not in _RESPONSE_ROOTS:
                raise ValueError(
                    f"{type(self).__name__}: in_keys={in_keys!r} is not supported; pass None or "
                    f"[response_key, answer_key] with a response key rooted at one of {_RESPONSE_ROOTS}"
                )
            if len(in_keys) == 2:
                if not isinstance(in_keys[1], str):
                    raise ValueError(
                        f"{type(self).__name__}: the answer key must be a row field name, got {in_keys[1]!r}"
                    )
                answer_key = in_keys[1]
        if out_keys is not None and tuple(out_keys) != _DEFAULT_OUT_KEYS:
            raise ValueError(
                f"{type(self).__name__}: out_keys={list(out_keys)!r} is not supported; the outputs are fixed to "
                f"{list(_DEFAULT_OUT_KEYS)} (reward_components and info['success'])"
            )
        if input_mode is not None and input_mode not in _INPUT_MODES:
            raise ValueError(
                f"{type(self).__name__}: input_mode must be None or one of {_INPUT_MODES}, got {input_mode!r}"
            )
        self.tokenizer = tokenizer
        self.in_keys = in_keys
        self.out_keys = list(_DEFAULT_OUT_KEYS)
        self.input_mode = input_mode
        self.eos_token = eos_token if eos_token is not None else getattr(tokenizer, "eos_token", None)
        self.set_done_if_answer = set_done_if_answer
        self.format_reward = float(format_reward)
        self.correct_reward = float(correct_reward)
        self.answer_key = answer_key

    def score(self, response: str, answer_field: str) -> dict[str, float | bool]:
        """The reward outputs for one response text and one gold ``answer`` field."""
        think, answer = extract_tags(self.strip_end(response))
        has_answer = bool(answer)
        correct = has_answer and self.is_correct(answer, answer_field)
        if correct:
            right = self.correct_reward
        elif has_answer:
            right = self.format_reward
        else:
            right = 0.0
        return {
            "reward_answer": float(has_answer),
            "reward_think": float(bool(think)),
            "reward_right": right,
            "reward": right,
            "success": correct,
        }

    def is_correct(self, answer: str, answer_field: str) -> bool:
        """Whether the (non-empty) tagged ``answer`` is right for the row's gold ``answer_field``: here, the numbers
        are equal after normalising; a subclass with another check (:class:`CountdownRewardParser`) overrides it."""
        return normalize_answer(answer) == normalize_answer(gold_answer(answer_field))

    extract_tags = staticmethod(extract_tags)  # TorchRL's parsers offer it as a static method

    def score_row(self, response: str, row: dict[str, Any]) -> dict[str, float | bool]:
        """The reward outputs for one response to a prompt row (here: against the row's gold answer field)."""
        return self.score(response, str(row[self.answer_key]))

    def strip_end(self, response: str) -> str:
        """``response`` without a trailing end-of-turn / EOS marker."""
        for marker in (self.eos_token, "<|im_end|>"):
            if marker and response.endswith(marker):
                response = response[: -len(marker)]
        return response

    def step_slot(self, slot: SlotState) -> None:
        """Score the slot's last policy message, add the reward, terminate when an answer was given."""
        role = self.parent.policy_role if self.parent is not None else "assistant"
        message = slot.last_message(role)
        if message is None:
            raise ValueError(f"slot {slot.index}: no {role!r} message to score")
        if self.answer_key not in slot.data:
            raise ValueError(
                f"slot {slot.index} (prompt {slot.prompt_id!r}): row has no {self.answer_key!r} field "
                f"(fields: {sorted(slot.data)})"
            )
        out = self.score_row(message.text, slot.data)
        slot.add_reward(float(out["reward"]))
        for key in ("reward_answer", "reward_think", "reward_right"):
            slot.reward_components[key] = float(out[key])
            slot.next_fields[key] = torch.tensor([[float(out[key])]])  # TorchRL's step data: (1, 1) per row
        slot.info["success"] = bool(out["success"])
        slot.next_fields["success"] = torch.tensor([[bool(out["success"])]])
        if self.set_done_if_answer and out["reward_answer"] > 0:
            slot.terminate()
