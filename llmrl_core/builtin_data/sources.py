"""Prompt sources by name: the shipped GSM8K splits, generated arithmetic, or a local file.

``resolve_source("gsm8k:train")`` is the shipped file's path; ``resolve_source("arithmetic:test?n=200")``
is a list of rows (see :mod:`llmrl_core.builtin_data.arithmetic`); ``reasoning_gym:train`` / ``reasoning_gym:test``
are the rows of the reasoning-gym dataset named in the run's ``env.args`` (passed as ``env_options``, see
:mod:`llmrl_core.builtin_data.reasoning_gym_data`); ``countdown:train`` / ``countdown:test`` are made Countdown
problems (:mod:`llmrl_core.builtin_data.countdown_data`); any other string must be an existing ``.jsonl`` / ``.parquet``
path with ``question`` and ``answer`` fields. ``verifiers:train`` / ``verifiers:eval`` are the datasets of the verifiers
environment named in the run's ``env.verifiers`` (see :mod:`llmrl_core.builtin_data.verifiers_data`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llmrl_core.builtin_data import gsm8k_path, load_gsm8k
from llmrl_core.builtin_data.arithmetic import arithmetic_rows
from llmrl_core.builtin_data.countdown_data import countdown_rows, is_countdown_source
from llmrl_core.builtin_data.reasoning_gym_data import is_reasoning_gym_source, reasoning_gym_rows
from llmrl_core.builtin_data.verifiers_data import is_verifiers_source, verifiers_rows


def resolve_source(source: str, env_options: Mapping[str, Any] | None = None) -> str | Sequence[dict[str, Any]]:
    """A path (GSM8K split or a user file) or generated rows, for a ``DataLoadingPrimer`` or an env.

    ``env_options``: the run's ``env.args`` (the reasoning-gym dataset behind ``reasoning_gym:`` sources)."""
    if is_reasoning_gym_source(source):
        return reasoning_gym_rows(source, env_options)
    if is_verifiers_source(source):
        return verifiers_rows(source, env_options)
    if is_countdown_source(source):
        return countdown_rows(source, env_options)
    if source.startswith("gsm8k:"):
        return str(gsm8k_path(source.split(":", 1)[1]))
    if source.startswith("arithmetic:"):
        return arithmetic_rows(source)
    if source in ("guess_number:train", "guess_number:test"):  # one row per game: its seed (held-out seeds for test)
        first = 0 if source.endswith(":train") else 1_000_000
        return [{"question": "guess the number", "answer": "", "seed": first + i} for i in range(10_000)]
    if source in ("ifeval", "ifeval:train", "ifeval:test"):  # the 541 shipped prompts (one split)
        from llmrl_core.builtin_data.ifeval_data import ifeval_path

        return str(ifeval_path())
    if not Path(source).exists():
        raise FileNotFoundError(
            f"source {source!r}: no such file (use gsm8k:train, gsm8k:test, arithmetic:train, arithmetic:test, "
            "ifeval, guess_number:train, reasoning_gym:train, reasoning_gym:test, countdown:train, countdown:test or "
            "a .jsonl/.parquet path with "
            "question/answer fields)"
        )
    return source


def load_source_rows(
    source: str, limit: int | None = None, env_options: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The first ``limit`` rows of ``source`` as ``{"question", "answer", ...}`` dicts (for evaluation)."""
    if source.startswith("gsm8k:"):
        return load_gsm8k(source.split(":", 1)[1], limit=limit)
    if is_reasoning_gym_source(source):
        return list(reasoning_gym_rows(source, env_options, n=limit))
    if is_verifiers_source(source):
        return verifiers_rows(source, env_options, n=limit)
    if is_countdown_source(source):
        return countdown_rows(source, env_options, n=limit)
    resolved = resolve_source(source)
    if isinstance(resolved, list):
        rows = resolved
    else:
        import datasets

        kind = "parquet" if resolved.endswith(".parquet") else "json"
        table = datasets.load_dataset(kind, data_files=resolved, split="train")
        missing = {"question", "answer"} - set(table.column_names)
        if missing:
            raise ValueError(f"{resolved}: missing field(s) {sorted(missing)} (have {table.column_names})")
        rows = [{"question": str(r["question"]), "answer": str(r["answer"])} for r in table]
    return rows[:limit] if limit is not None else rows
