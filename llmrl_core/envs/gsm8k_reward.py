"""``GSM8KRewardParser``: TorchRL's current GSM8K reward scheme as a TensorDict env transform.

* The answer is the content of the first ``<answer>...</answer>`` in the policy's last message (stripped);
  ``<think>...</think>`` likewise gives the reasoning. The end-of-turn / EOS marker is removed first.
* The gold answer is the text after ``####`` in the row's ``answer`` field (the whole field if it has none).
* Both are normalised: whitespace stripped; ``,``, ``$`` and ``%`` removed; a trailing ``.`` removed; and,
  for decimals, trailing zeros removed (``"120.00"`` -> ``"120"``).
* Reward: ``correct_reward`` (1.0) if equal, ``format_reward`` (0.1) if an answer tag with non-empty content
  is present but wrong, 0.0 without one.
* A step's ``"next"`` data gets, per row, as TorchRL's parser writes them (each ``(B, 1, 1)``): ``reward`` (added to
  a reward already there), ``reward_answer`` (1.0 if an answer was given), ``reward_think`` (1.0 if a non-empty think
  block), ``reward_right`` (the reward) and ``success`` (bool); ``done`` / ``terminated`` are set once an answer is
  given (``set_done_if_answer``). On llmrl's list calls the parts become the slots' ``reward_components`` and
  ``success`` their ``info["success"]`` (:mod:`llmrl_core.envs.td_list_calls`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from llmrl_core.data.tensor_specs import Composite, Unbounded
from llmrl_core.envs.tensordict_io import (
    add_per_row,
    end_rows,
    responses_from_tensordict,
    step_flattened,
    step_row_fields,
)
from llmrl_core.envs.transforms.td_base import Transform

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


class GSM8KRewardParser(Transform):
    """Scores the policy's answer against the row's gold ``answer`` (TorchRL's GSM8K reward scheme, as its
    TensorDict ``Transform``: ``_step`` writes the reward and its parts into the step's ``"next"`` data).

    The arguments follow TorchRL's order. ``in_keys`` is ``[response_key, answer_key]`` as in TorchRL (once the
    parser is appended to an env and none were given: ``[(<input_mode>, "full"), "answer"]``): the response is
    always the policy's last message of the step's action data (the conversation's last message, the sampled text,
    or the sampled ids decoded with ``tokenizer``), so any TorchRL response key rooted at ``history``, ``text``,
    ``tokens`` or ``text_response`` is accepted; a string second key names the row field holding the gold answer
    (it overrides ``answer_key``). ``out_keys`` must be None or TorchRL's default list. ``input_mode`` is checked
    and stored; the message text is scored in every mode. ``answer_key`` (llmrl only) names the gold answer field.
    Subclasses change the check (:meth:`is_correct`) or the scoring of a row (:meth:`score_row`).
    """

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
            self.in_keys = in_keys
        if out_keys is not None and tuple(out_keys) != _DEFAULT_OUT_KEYS:
            raise ValueError(
                f"{type(self).__name__}: out_keys={list(out_keys)!r} is not supported; the outputs are fixed to "
                f"{list(_DEFAULT_OUT_KEYS)}"
            )
        if input_mode is not None and input_mode not in _INPUT_MODES:
            raise ValueError(
                f"{type(self).__name__}: input_mode must be None or one of {_INPUT_MODES}, got {input_mode!r}"
            )
        self.tokenizer = tokenizer
        self.out_keys = list(_DEFAULT_OUT_KEYS)
        self._input_mode = input_mode
        self.eos_token = eos_token if eos_token is not None else getattr(tokenizer, "eos_token", None)
        self.set_done_if_answer = set_done_if_answer
        self.format_reward = float(format_reward)
        self.correct_reward = float(correct_reward)
        self.answer_key = answer_key

    @property
    def input_mode(self) -> str | None:
        """The mode given, else the env's once appended (None before)."""
        if self._input_mode is not None:
            return self._input_mode
        env = self.parent
        return getattr(getattr(env, "base_env", env), "input_mode", None) if env is not None else None

    def set_container(self, container: Any) -> None:
        """Attach to an env; without ``in_keys`` given, they become TorchRL's for the env's mode."""
        super().set_container(container)
        if not self.in_keys and self.input_mode is not None:
            self.in_keys = [(self.input_mode, "full"), self.answer_key]

    # --- scoring (also used directly: the evaluators, rescoring) ---------------------------------
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

    # --- the env hooks ---------------------------------------------------------------------------
    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        """Score each row's answer (the action data ``tensordict``) against its row's gold answer; write the
        outputs into ``next_tensordict`` (see the module docstring)."""
        if step_flattened(self, tensordict, next_tensordict):
            return next_tensordict
        texts = [r.text for r in responses_from_tensordict(tensordict, self.tokenizer)]
        rows = self._rows(tensordict, next_tensordict)
        scores = [self.score_row(text, row) for text, row in zip(texts, rows, strict=True)]
        device = next_tensordict.device

        def column(name: str, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor([[[score[name]]] for score in scores], dtype=dtype, device=device)

        for name in ("reward_answer", "reward_think", "reward_right", "reward"):
            value = column(name, torch.float32)
            existing = next_tensordict.get(name, None)
            added = value if existing is None else add_per_row(existing, value, type(self).__name__, name)
            next_tensordict.set(name, added)
        success = column("success", torch.bool)
        existing = next_tensordict.get("success", None)
        next_tensordict.set("success", success if existing is None else success | existing.reshape(success.shape))
        if self.set_done_if_answer:
            end_rows(next_tensordict, [score["reward_answer"] > 0 for score in scores])
        return next_tensordict

    def _rows(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> list[dict[str, Any]]:
        """Each row's fields (the ``"next"`` data's, then the action data's), checked for the gold answer."""
        rows = step_row_fields(tensordict, next_tensordict)
        if rows and self.answer_key not in rows[0]:
            raise ValueError(
                f"{type(self).__name__}: the prompt row has no {self.answer_key!r} field (the gold answer), so the "
                f"step data has none (fields: {sorted(rows[0])})"
            )
        return rows

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        """``reward``, ``reward_answer``, ``reward_think``, ``reward_right`` (float) and ``success`` (bool), each of
        shape ``batch + (1, 1)``."""
        shape = (*reward_spec.shape, 1, 1)
        for name in ("reward_answer", "reward_think", "reward_right", "reward"):
            reward_spec[name] = Unbounded(shape=shape, device=reward_spec.device)
        reward_spec["success"] = Unbounded(shape=shape, device=reward_spec.device, dtype=torch.bool)
        return reward_spec

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(answer_key={self.answer_key!r}, format_reward={self.format_reward}, "
            f"correct_reward={self.correct_reward})"
        )
