r"""MATH (competition mathematics): ``MATHRewardParser`` and ``MATHEnv`` (TorchRL's
``torchrl.envs.llm.reward.math`` / ``torchrl.envs.llm.datasets.math`` under llmrl's names).

* Rows have ``problem`` and ``solution`` fields (the Hugging Face MATH datasets'); the env asks the problem and
  keeps the solution as the row's ``answer``. MATH is not shipped with llmrl and nothing is downloaded here:
  TorchRL's default ``dataset`` id loads only from a local copy or the ``datasets`` cache; any jsonl/parquet path,
  folder, ``datasets.Dataset`` or list of rows works.
* Reward (GSM8K's scheme, :class:`~llmrl_core.envs.gsm8k_reward.GSM8KRewardParser`, with another check): the
  reference is the content of the solution's last ``\boxed{...}`` (nested braces counted; the whole solution when
  it has none); the ``<answer>`` content matches it when ``math-verify`` (installed separately) finds them
  equivalent, else when both are equal after :func:`normalize_math`. As TorchRL 0.14.1 does.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from llmrl_core.envs.chat_env import InputMode
from llmrl_core.envs.dataset_chat_env import DatasetChatEnv
from llmrl_core.envs.gsm8k_reward import GSM8KRewardParser

MATH_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a math problem, "
    "and the Assistant solves it.\n"
    "The assistant first thinks about the reasoning process in the mind and "
    "then provides the user with the answer.\n"
    "The reasoning process and answer are enclosed within <think></think> and "
    "<answer></answer> tags, respectively, i.e.,\n"
    "<think>reasoning process here</think> <answer>answer here</answer>.\n"
    "The answer should be a mathematical expression (use LaTeX if needed)."
)
MATH_HUB_ID = "DigitalLearningGmbH/MATH-lighteval"
_BOXED = "\\boxed{"
_DROPPED = (" ", ",", "$", "\\left", "\\right", "\\!", "\\,", "\\;", "\\:")


def normalize_math(text: str) -> str:
    """``text`` without spaces, commas, ``$``, ``\\left``/``\\right`` and LaTeX spacing commands."""
    text = text.strip()
    for dropped in _DROPPED:
        text = text.replace(dropped, "")
    return text


def extract_boxed(text: str) -> str:
    """The stripped content of the last ``\\boxed{...}`` in ``text`` (to its matching brace, or to the end when
    unclosed); the stripped ``text`` when there is none."""
    start = text.rfind(_BOXED)
    if start == -1:
        return text.strip()
    start += len(_BOXED)
    depth, end = 1, start
    while end < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        end += 1
    return text[start : end - 1].strip()


def answers_match(predicted: str, reference: str) -> bool:
    """Whether two answers are the same: ``math-verify``'s symbolic check when it is installed and parses both,
    else equality after :func:`normalize_math`."""
    if importlib.util.find_spec("math_verify") is not None:
        from math_verify import parse, verify

        try:
            return bool(verify(parse(predicted), parse(reference)))
        except Exception:  # math-verify raises many types on LaTeX it cannot read: compare the text instead
            pass
    return normalize_math(predicted) == normalize_math(reference)


class MATHRewardParser(GSM8KRewardParser):
    """Scores the ``<answer>`` against the boxed answer of the row's ``answer`` (the solution); TorchRL's arguments,
    order and outputs (see the module docstring and :class:`~llmrl_core.envs.gsm8k_reward.GSM8KRewardParser`)."""

    def is_correct(self, answer: str, answer_field: str) -> bool:
        """Whether ``answer`` matches the boxed answer of the solution ``answer_field``."""
        return self.answers_match(answer, self.extract_boxed(answer_field))

    answers_match = staticmethod(answers_match)
    extract_boxed = staticmethod(extract_boxed)


class MATHEnv(DatasetChatEnv):
    """MATH as a chat environment: ``problem`` asked under TorchRL's system prompt, ``solution`` kept as the row's
    ``answer``, one turn, rewards from :class:`MATHRewardParser`. TorchRL's arguments and defaults; a
    ``collate_fn`` replaces the field renaming, as in TorchRL. ``dataset`` is a path, a ``datasets.Dataset``, rows,
    or a dataset id found locally (the module docstring). llmrl's own: ``batch_size``, ``system_prompt``,
    ``format_reward``, ``correct_reward``."""

    SYSTEM_PROMPT = MATH_SYSTEM_PROMPT

    def __init__(
        self,
        *,
        dataset: Any = MATH_HUB_ID,
        shuffle: bool = True,
        num_envs: int = 1,
        repeats: int | None = None,
        batch_size_dl: int = 1,
        seed: int | None = None,
        group_repeats: bool = False,
        tokenizer: Any = None,
        device: torch.device | str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        apply_template: bool | None = False,
        compute_reward: bool = True,
        collate_fn: Callable[[Any], Any] | None = None,
        max_steps: int = 1,
        input_mode: InputMode = "history",
        ray_backend: bool = False,
        dataloader_actor_name: str | None = None,
        batch_size: int | None = None,
        system_prompt: str | None = None,
        format_reward: float = 0.1,
        correct_reward: float = 1.0,
    ) -> None:
        try:
            super().__init__(
                dataset,
                shuffle=shuffle,
                num_envs=num_envs,
                repeats=repeats,
                batch_size_dl=batch_size_dl,
                seed=seed,
                group_repeats=group_repeats,
                tokenizer=tokenizer,
                device=device,
                template_kwargs=template_kwargs,
                apply_template=apply_template,
                collate_fn=collate_fn,
                input_mode=input_mode,
                ray_backend=ray_backend,
                dataloader_actor_name=dataloader_actor_name,
                system_prompt=self.SYSTEM_PROMPT if system_prompt is None else system_prompt,
                batch_size=batch_size,
                rename=None if collate_fn is not None else {"problem": "query", "solution": "answer"},
                max_turns=max_steps,
            )
        except (ConnectionError, FileNotFoundError, OSError) as err:
            if not isinstance(dataset, str):
                raise
            raise FileNotFoundError(
                f"MATHEnv: dataset {dataset!r} is neither a local file or folder nor in the datasets cache, and "
                "llmrl downloads nothing: pass a jsonl/parquet path, a folder, a datasets.Dataset or rows with "
                f"'problem' and 'solution' fields ({type(err).__name__}: {err})"
            ) from err
        if compute_reward:
            self.append_transform(
                MATHRewardParser(tokenizer=tokenizer, format_reward=format_reward, correct_reward=correct_reward)
            )
