"""Small Gymnasium-style text games shipped with llmrl, to train and test multi-turn policies without MLGym.

A game here follows the text flavour of Gymnasium's interface and nothing more (no ``gymnasium`` import):
``reset(seed=None, options=None) -> (observation: str, info: dict)`` and
``step(action: str) -> (observation: str, reward: float, terminated: bool, truncated: bool, info: dict)``.
:class:`~llmrl_core.envs.gym_wrapper.MLGymWrapper` turns any such object into a batched
:class:`~llmrl_core.envs.chat_env.ChatEnv`; :func:`make_guess_number_env` does that for :class:`GuessNumberEnv`
(the ``guess_number`` env of the run configs).
"""

from __future__ import annotations

import functools
import inspect
import random
import re
from typing import Any

from llmrl_core.envs.chat_env import InputMode
from llmrl_core.envs.gym_wrapper import MLGymWrapper

_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_INTEGER = re.compile(r"[-+]?\d+")


def parse_guess(text: str) -> int | None:
    """The integer a reply guesses: the last integer inside the last ``<answer>…</answer>`` block, or — when
    the reply has no such block — the last integer anywhere in it; None when there is none."""
    blocks = _ANSWER_BLOCK.findall(text)
    scope = blocks[-1] if blocks else text
    numbers = _INTEGER.findall(scope)
    return int(numbers[-1]) if numbers else None


class GuessNumberEnv:
    """Guess a secret integer in ``[low, high]`` with "higher" / "lower" hints, in at most ``max_guesses`` tries.

    * ``reset(seed)`` draws the secret from ``random.Random(seed)`` (the same seed, the same secret; without a
      seed the env's own generator continues) and returns the instructions. ``options={"secret": n}`` fixes it.
    * ``step(action)`` reads the guess with :func:`parse_guess` and answers "Correct!" (reward 1.0,
      terminated), "Higher." or "Lower." (reward 0.0). A reply without a number gets an explanation and
      reward 0.0. Every reply uses one try, readable or not; after ``max_guesses`` tries the episode is
      truncated.
    * ``info``: ``guess`` (None when unreadable), ``guesses_used``, ``guesses_left``, ``solved`` and, once the
      episode is over, ``secret``.
    """

    def __init__(self, low: int = 1, high: int = 20, max_guesses: int = 5) -> None:
        if low > high:
            raise ValueError(f"GuessNumberEnv: low ({low}) must not exceed high ({high})")
        if max_guesses < 1:
            raise ValueError(f"GuessNumberEnv: max_guesses must be >= 1, got {max_guesses}")
        self.low = int(low)
        self.high = int(high)
        self.max_guesses = int(max_guesses)
        self.secret: int | None = None
        self.guesses_used = 0
        self.over = True
        self.closed = False
        self._rng: random.Random | None = None

    def instructions(self) -> str:
        """The text the player sees at the start of an episode."""
        return (
            f"I am thinking of a whole number from {self.low} to {self.high}. Try to guess it. "
            "Reply with your guess inside <answer> and </answer>. After each guess I will tell you whether "
            f"my number is higher or lower. You have {self.max_guesses} guesses."
        )

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start a new game; returns ``(instructions, info)``."""
        if seed is not None or self._rng is None:
            self._rng = random.Random(seed)
        secret = (options or {}).get("secret")
        if secret is None:
            secret = self._rng.randint(self.low, self.high)
        elif not self.low <= int(secret) <= self.high:
            raise ValueError(f"GuessNumberEnv: secret {secret} is outside [{self.low}, {self.high}]")
        self.secret = int(secret)
        self.guesses_used = 0
        self.over = False
        return self.instructions(), {"guesses_left": self.max_guesses}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one reply; returns ``(observation, reward, terminated, truncated, info)``."""
        if self.over or self.secret is None:
            raise RuntimeError("GuessNumberEnv.step() called on a finished game: call reset() first")
        self.guesses_used += 1
        left = self.max_guesses - self.guesses_used
        guess = parse_guess(action)
        solved = guess == self.secret
        if guess is None:
            reply = (
                f"I could not find a number in your reply. Put one whole number from {self.low} to {self.high} "
                "inside <answer> and </answer>."
            )
        elif solved:
            reply = f"Correct! My number was {self.secret}."
        elif guess < self.secret:
            reply = f"Higher. My number is greater than {guess}."
        else:
            reply = f"Lower. My number is less than {guess}."
        truncated = not solved and left <= 0
        if truncated:
            reply += f" No guesses left: my number was {self.secret}."
        elif not solved:
            reply += f" {left} guess{'es' if left != 1 else ''} left."
        self.over = solved or truncated
        info: dict[str, Any] = {"guess": guess, "guesses_used": self.guesses_used, "guesses_left": left}
        info["solved"] = solved
        if self.over:
            info["secret"] = self.secret
        return reply, 1.0 if solved else 0.0, solved, truncated, info

    def close(self) -> None:
        """Nothing to release; marks the env closed."""
        self.closed = True

    def __repr__(self) -> str:
        return f"GuessNumberEnv(low={self.low}, high={self.high}, max_guesses={self.max_guesses})"


def make_guess_number_env(
    tokenizer: Any = None,
    *,
    input_mode: InputMode = "history",
    max_turns: int | None = None,
    batch_size: int = 1,
    repeats: int = 1,
    seed: int | None = 0,
    system_prompt: str | None = None,
    **options: Any,
) -> MLGymWrapper:
    """:class:`GuessNumberEnv` games as a ChatEnv: ``batch_size`` games per reset, ``repeats`` slots per game
    (a GRPO group plays one secret), seeded from ``seed``. ``options`` named like :class:`GuessNumberEnv`'s
    parameters (``low``, ``high``, ``max_guesses``) configure the game; the others go to
    :class:`~llmrl_core.envs.gym_wrapper.MLGymWrapper` (e.g. ``chat_template_name``)."""
    game_parameters = inspect.signature(GuessNumberEnv).parameters
    game_options = {k: v for k, v in options.items() if k in game_parameters}
    wrapper_options = {k: v for k, v in options.items() if k not in game_parameters}
    GuessNumberEnv(**game_options)  # check the values now rather than at the first reset
    return MLGymWrapper(
        functools.partial(GuessNumberEnv, **game_options),
        tokenizer=tokenizer,
        input_mode=input_mode,
        system_prompt=system_prompt,
        max_turns=max_turns,
        batch_size=batch_size,
        repeats=repeats,
        seed=seed,
        **wrapper_options,
    )
