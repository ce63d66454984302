"""Prompt rows of the Countdown numbers game (``env.name=countdown``), made by
:class:`~llmrl_core.envs.countdown.CountdownProblems`: ``countdown:train`` and ``countdown:test``.

The problem sizes are the run's ``env.args`` (``num_count``, ``max_number``, ``max_target``; CountdownEnv's defaults
otherwise). Splits come from disjoint seeds (train ``seed``, test ``seed + TEST_SEED_OFFSET``) and no test problem
is also a train problem (the same numbers and target). A row is ``{"question", "answer"}``: the question is the
problem's text, the answer ``"target=T, numbers=a,b,..."`` (what :class:`CountdownRewardParser` reads).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from itertools import islice
from typing import Any

from llmrl_core.envs.countdown import CountdownProblems

SOURCE_PREFIX = "countdown:"
SPLIT_SIZES = {"train": 10_000, "test": 1_000}
TEST_SEED_OFFSET = 1_000_003
OPTIONS = ("num_count", "max_number", "max_target", "seed")


def is_countdown_source(source: str) -> bool:
    """Whether ``source`` names the Countdown rows."""
    return source.startswith(SOURCE_PREFIX)


def countdown_options(options: Mapping[str, Any] | None, setting: str = "env.args") -> dict[str, int]:
    """The problem settings of a run's ``env.args`` (unknown keys and non-positive sizes raise, naming the key;
    ``chat_template_name`` is allowed and left out)."""
    options = dict(options or {})
    valid = [*OPTIONS, "chat_template_name"]  # the env's rendering option (a built-in env's), not the problems'
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"{setting}: unknown key(s) {unknown} for countdown; valid: {valid}")
    options.pop("chat_template_name", None)
    for key, value in options.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if key == "seed" else 1):
            raise ValueError(f"{setting}.{key}: expected a {'non-negative' if key == 'seed' else 'positive'} int")
    return options


@lru_cache(maxsize=8)
def _split(split: str, num_count: int, max_number: int, max_target: int, seed: int) -> tuple[tuple[str, str], ...]:
    def rows(offset: int, size: int) -> list[dict[str, str]]:
        return list(islice(CountdownProblems(num_count, max_number, max_target, seed + offset), size))

    train = rows(0, SPLIT_SIZES["train"])
    if split == "train":
        return tuple((r["query"], r["answer"]) for r in train)
    seen = {r["answer"] for r in train}
    test = [r for r in rows(TEST_SEED_OFFSET, 3 * SPLIT_SIZES["test"]) if r["answer"] not in seen]
    return tuple((r["query"], r["answer"]) for r in test[: SPLIT_SIZES["test"]])


def countdown_rows(source: str, env_options: Mapping[str, Any] | None = None, n: int | None = None) -> list[dict]:
    """The first ``n`` rows (all by default) of ``countdown:train`` or ``countdown:test``."""
    split = source.removeprefix(SOURCE_PREFIX)
    if split not in SPLIT_SIZES:
        raise ValueError(f"source {source!r}: expected countdown:train or countdown:test")
    options = countdown_options(env_options)
    sizes = {"num_count": 4, "max_number": 100, "max_target": 1000, "seed": 0, **options}
    made = _split(split, sizes["num_count"], sizes["max_number"], sizes["max_target"], sizes["seed"])
    return [{"question": q, "answer": a} for q, a in made[:n]]
