"""Datasets shipped inside the package, so the default demo runs from a clone alone.

GSM8K (MIT license, see ``gsm8k/LICENSE`` and ``gsm8k/SOURCE.txt``): ``train`` and ``test`` splits,
each row ``{"question": str, "answer": str}`` with the gold number after ``####``.
"""

from __future__ import annotations

from pathlib import Path

from llmrl_core.jsonl import iter_jsonl

_ROOT = Path(__file__).resolve().parent
GSM8K_SPLITS = ("train", "test")


def gsm8k_path(split: str = "train") -> Path:
    """Path of the shipped GSM8K jsonl file for ``split`` (``train`` or ``test``)."""
    if split not in GSM8K_SPLITS:
        raise ValueError(f"unknown GSM8K split {split!r}; expected one of {GSM8K_SPLITS}")
    return _ROOT / "gsm8k" / f"{split}.jsonl"


def load_gsm8k(split: str = "train", limit: int | None = None) -> list[dict[str, str]]:
    """Read the shipped GSM8K split as a list of ``{"question", "answer"}`` dicts."""
    path = gsm8k_path(split)
    rows: list[dict[str, str]] = []
    for where, row in iter_jsonl(path):
        if limit is not None and len(rows) >= limit:
            break
        missing = {"question", "answer"} - set(row)
        if missing:
            raise ValueError(f"{where}: missing field(s) {sorted(missing)}")
        rows.append({"question": row["question"], "answer": row["answer"]})
    return rows


def gsm8k_gold(answer: str) -> str:
    """The gold final answer of a GSM8K solution: the text after the last ``####``."""
    if "####" not in answer:
        raise ValueError(f"GSM8K answer has no '####' marker: {answer[-80:]!r}")
    return answer.rsplit("####", 1)[1].strip()
