"""Arithmetic problems generated on demand, with a fixed held-out split.

A problem is ``a <op> b`` with both operands drawn from ``[low, high]``; rows look like GSM8K rows
(``{"question": "What is 64 + 87?", "answer": "#### 151"}``), so the GSM8K env and reward parser score them.

The split is by problem, not by row: ``crc32("a op b") % 10 == 0`` puts a problem in ``test`` (about 10%),
every other problem is in ``train``. A held-out problem is therefore never a training prompt, whatever the
seed or the number of rows drawn. Rows come in a seeded order, each problem at most once.

Source strings (``data.source`` / ``task.eval_source``): ``arithmetic:train`` or ``arithmetic:test``, with
optional settings after ``?``: ``arithmetic:test?ops=+-&low=10&high=99&n=200&seed=0``.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

ARITHMETIC_SPLITS = ("train", "test")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass(frozen=True)
class ArithmeticSpec:
    """Which problems: operators, operand range, split, row count (``None``: all of the split), order seed."""

    split: str = "train"
    ops: str = "+"
    low: int = 10
    high: int = 99
    n: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.split not in ARITHMETIC_SPLITS:
            raise ValueError(f"arithmetic split must be one of {ARITHMETIC_SPLITS}, got {self.split!r}")
        unknown = set(self.ops) - set(_OPS)
        if not self.ops or unknown:
            raise ValueError(f"arithmetic ops must be a non-empty string of {''.join(_OPS)}, got {self.ops!r}")
        if not 0 <= self.low <= self.high:
            raise ValueError(f"arithmetic operands need 0 <= low <= high, got low={self.low} high={self.high}")
        if self.n is not None and self.n < 1:
            raise ValueError(f"arithmetic n must be >= 1, got {self.n}")


def parse_arithmetic_source(source: str) -> ArithmeticSpec:
    """``arithmetic:<split>[?key=value&...]`` -> :class:`ArithmeticSpec` (clear error on a bad key or value)."""
    if not source.startswith("arithmetic:"):
        raise ValueError(f"not an arithmetic source: {source!r}")
    body = source.split(":", 1)[1]
    split, _, query = body.partition("?")
    fields: dict[str, object] = {"split": split}
    # split by hand: URL query parsing would read the "+" of ops=+- as a space
    for part in filter(None, query.split("&")):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"{source!r}: expected key=value, got {part!r}")
        if key == "ops":
            fields[key] = value
        elif key in ("low", "high", "n", "seed"):
            try:
                fields[key] = int(value)
            except ValueError:
                raise ValueError(f"{source!r}: {key} must be an integer, got {value!r}") from None
        else:
            raise ValueError(f"{source!r}: unknown setting {key!r} (ops, low, high, n, seed)")
    return ArithmeticSpec(**fields)  # type: ignore[arg-type]


def problem_split(a: int, op: str, b: int) -> str:
    """``test`` for about one problem in ten (a fixed hash of the problem text), else ``train``."""
    return "test" if zlib.crc32(f"{a} {op} {b}".encode()) % 10 == 0 else "train"


def arithmetic_rows(spec: ArithmeticSpec | str) -> list[dict[str, str]]:
    """The rows of ``spec`` (a spec or a source string) in seeded order, each problem once."""
    if isinstance(spec, str):
        spec = parse_arithmetic_source(spec)
    problems = [
        (a, op, b)
        for op in spec.ops
        for a in range(spec.low, spec.high + 1)
        for b in range(spec.low, spec.high + 1)
        if problem_split(a, op, b) == spec.split
    ]
    if not problems:
        raise ValueError(f"arithmetic {spec}: the split has no problems (widen low..high)")
    random.Random(spec.seed).shuffle(problems)
    if spec.n is not None:
        if spec.n > len(problems):
            raise ValueError(f"arithmetic {spec}: asked for {spec.n} rows, the split has {len(problems)} problems")
        problems = problems[: spec.n]
    return [{"question": f"What is {a} {op} {b}?", "answer": f"#### {_OPS[op](a, b)}"} for a, op, b in problems]
