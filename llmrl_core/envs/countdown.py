"""Countdown, the numbers game: ``CountdownProblems``, ``CountdownRewardParser`` and ``CountdownEnv`` (TorchRL's
``torchrl.envs.llm.datasets.countdown`` / ``torchrl.envs.llm.reward.countdown`` under llmrl's names).

* Problems are made, not read: each draws ``num_count`` numbers in ``[1, max_number]`` and a target reachable
  from them (the numbers in a shuffled order, folded with a random ``+``, ``-`` or ``*`` each; the absolute
  value; the numbers' sum when that is 0 or above ``max_target``). With the same ``seed``, the same problems as
  TorchRL 0.14.1's generator, in the same order (``tests/goldens/torchrl/countdown.json``). A row is
  ``{"query": ..., "answer": "target=T, numbers=a,b,c,d"}``.
* Reward (GSM8K's scheme, :class:`~llmrl_core.envs.gsm8k_reward.GSM8KRewardParser`, with another check):
  ``correct_reward`` when the ``<answer>`` expression uses only the given numbers, each at most as often as
  given, and equals the target; ``format_reward`` for a wrong tagged answer; 0 without one.
* The expression is model-written text: it is parsed, never run. Only numbers, ``+ - * /``, unary signs and
  parentheses are evaluated (Python's ``ast``); anything else is wrong. TorchRL calls ``eval`` on it after a
  character check, which lets ``**`` and ``//`` through (``9**9**9**9`` would not finish); here both are wrong
  answers, as the prompt asks for ``+, -, *, /`` only.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch

from llmrl_core.envs.chat_env import InputMode
from llmrl_core.envs.dataset_chat_env import DatasetChatEnv
from llmrl_core.envs.gsm8k_reward import GSM8KRewardParser

COUNTDOWN_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user gives a set of "
    "numbers and a target. The Assistant must find an arithmetic expression "
    "using each given number at most once that equals the target.\n"
    "The reasoning process and answer are enclosed within <think></think> "
    "and <answer></answer> tags, respectively.\n"
    "The answer should contain ONLY the arithmetic expression (e.g. "
    "(25 + 3) * 4)."
)
_FOLDS: tuple[Callable[[int, int], int], ...] = (operator.add, operator.sub, operator.mul)
_EXPRESSION_CHARS = re.compile(r"[\d\s+\-*/().]+")
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CountdownProblems:
    """An endless, seeded stream of Countdown problems (an iterator of rows; see the module docstring)."""

    def __init__(self, num_count: int = 4, max_number: int = 100, max_target: int = 1000, seed: int | None = None):
        for name, value in (("num_count", num_count), ("max_number", max_number), ("max_target", max_target)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"CountdownProblems: {name} must be a positive int, got {value!r}")
        self.num_count = num_count
        self.max_number = max_number
        self.max_target = max_target
        self.rng = random.Random(seed)

    def __iter__(self) -> Iterator[dict[str, str]]:
        return self

    def __next__(self) -> dict[str, str]:
        numbers = [self.rng.randint(1, self.max_number) for _ in range(self.num_count)]
        target = self.reachable_target(numbers)
        return {
            "query": (
                f"Using the numbers {numbers}, create an arithmetic expression that equals {target}. "
                "You may use each number at most once. Only use +, -, *, / and parentheses."
            ),
            "answer": f"target={target}, numbers={','.join(map(str, numbers))}",
        }

    def reachable_target(self, numbers: list[int]) -> int:
        """A target the numbers reach: folded in a shuffled order with random ``+ - *`` (module docstring)."""
        order = list(numbers)
        self.rng.shuffle(order)
        value = order[0]
        for number in order[1:]:
            value = self.rng.choice(_FOLDS)(value, number)
        value = abs(value)
        return sum(numbers) if value == 0 or value > self.max_target else value


def evaluate_arithmetic(expression: str) -> float | None:
    """The value of ``expression`` built from numbers, ``+ - * /``, unary signs and parentheses; None for anything
    else (a name, a call, ``**``, ``//``, a syntax error) and for a division by zero. Nothing is executed."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        raise ValueError(f"not allowed in a Countdown expression: {ast.dump(node)[:60]}")

    try:
        return value(tree.body)
    except (ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None


def parse_ground_truth(answer: str) -> tuple[int, list[int]]:
    """``(target, numbers)`` from a row's ``answer`` field, ``"target=T, numbers=a,b,..."``."""
    target = re.search(r"target\s*=\s*(\d+)", answer)
    numbers = re.search(r"numbers\s*=\s*([\d,\s]+)", answer)
    if target is None or numbers is None:
        raise ValueError(f"a Countdown answer field reads 'target=T, numbers=a,b,...', got {answer!r}")
    return int(target.group(1)), [int(n) for n in numbers.group(1).split(",") if n.strip()]


class CountdownRewardParser(GSM8KRewardParser):
    """Scores the ``<answer>`` expression against the row's target and numbers (TorchRL's arguments, order and
    outputs: ``reward``, ``reward_answer``, ``reward_think``, ``reward_right``, ``success``; see the module
    docstring and :class:`~llmrl_core.envs.gsm8k_reward.GSM8KRewardParser` for keys and modes)."""

    def is_correct(self, answer: str, answer_field: str) -> bool:
        """Whether the expression ``answer`` solves the problem in ``answer_field``."""
        target, numbers = parse_ground_truth(answer_field)
        return self.validate_expression(answer, target, numbers)

    @staticmethod
    def validate_expression(expression: str, target: int, numbers: list[int]) -> bool:
        """Whether ``expression`` equals ``target`` using only ``numbers``, each at most as often as given (every
        run of digits counts as a number used, as in TorchRL)."""
        if not _EXPRESSION_CHARS.fullmatch(expression):
            return False
        used = Counter(int(n) for n in re.findall(r"\d+", expression))
        if used - Counter(numbers):
            return False
        result = evaluate_arithmetic(expression)
        return result is not None and abs(result - target) < 1e-9

    _parse_ground_truth = staticmethod(parse_ground_truth)  # TorchRL's name for it


class CountdownEnv(DatasetChatEnv):
    """The Countdown game as a chat environment: procedural problems (:class:`CountdownProblems`, no dataset),
    TorchRL's system prompt, one turn, rewards from :class:`CountdownRewardParser`. TorchRL's arguments and
    defaults; ``shuffle`` is accepted and has no effect (the problems are random already). ``seed=None`` draws
    different problems each time; pass an int to reproduce them (a restored ``state_dict`` then continues the
    same stream). llmrl's own: ``batch_size`` (prompts per reset), ``system_prompt``, ``format_reward``,
    ``correct_reward`` and ``chat_template_name``. ``env.name=countdown`` trains it in the flows
    (:mod:`llmrl_core.builtin_data.countdown_data` makes the rows)."""

    SYSTEM_PROMPT = COUNTDOWN_SYSTEM_PROMPT

    def __init__(
        self,
        *,
        num_count: int = 4,
        max_number: int = 100,
        max_target: int = 1000,
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
        batch_size: int | None = None,
        system_prompt: str | None = None,
        format_reward: float = 0.1,
        correct_reward: float = 1.0,
        chat_template_name: str | None = None,
    ) -> None:
        del shuffle  # a stream has its own order
        self.problems = CountdownProblems(num_count, max_number, max_target, seed)
        super().__init__(
            self.problems,
            shuffle=False,
            num_envs=num_envs,
            repeats=repeats,
            batch_size_dl=batch_size_dl,
            seed=0 if seed is None else seed,
            group_repeats=group_repeats,
            tokenizer=tokenizer,
            device=device,
            template_kwargs=template_kwargs,
            apply_template=apply_template,
            collate_fn=collate_fn,
            input_mode=input_mode,
            system_prompt=self.SYSTEM_PROMPT if system_prompt is None else system_prompt,
            batch_size=batch_size,
            max_turns=max_steps,
            chat_template_name=chat_template_name,
        )
        if compute_reward:
            self.append_transform(
                CountdownRewardParser(tokenizer=tokenizer, format_reward=format_reward, correct_reward=correct_reward)
            )
