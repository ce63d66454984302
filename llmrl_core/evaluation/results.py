"""What an evaluation produces: per-sample outcomes, per-question groups, per-mode metrics, JSON round trip.

An :class:`EvaluationResult` holds one :class:`ModeResult` per decoding mode (``"greedy"``: one
temperature-0 sample per question; ``"sampled"``: ``n`` samples per question at the sampling temperature).
Every metric is a mean over questions with its standard error (see :mod:`llmrl_core.evaluation.statistics`);
the per-question values stay available (:meth:`ModeResult.per_question`) for paired comparisons between
policy versions scored on the same questions.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmrl_core.evaluation.statistics import Estimate, mean_stderr, pass_at_k, pass_at_k_estimate

PER_QUESTION_METRICS = ("accuracy", "tag_rate", "mean_reward", "mean_length", "truncated_rate")


@dataclass
class SampleOutcome:
    """One scored response: its text, the parsed answer, correctness, answer-tag presence, reward, length."""

    text: str
    answer: str
    correct: bool
    has_answer: bool
    reward: float
    num_tokens: int
    finish_reason: str | None
    extra: dict[str, float] = field(default_factory=dict)  # task metrics beyond accuracy (e.g. IFEval's four)


@dataclass
class QuestionOutcome:
    """All samples of one question (``index`` is its position in the evaluated rows, ``gold`` its answer)."""

    index: int
    gold: str
    samples: list[SampleOutcome]

    def value(self, metric: str) -> float:
        """This question's value of a per-question metric (a mean over its samples)."""
        if not self.samples:
            raise ValueError(f"question {self.index} has no samples")
        if metric == "accuracy":
            values = [float(s.correct) for s in self.samples]
        elif metric == "tag_rate":
            values = [float(s.has_answer) for s in self.samples]
        elif metric == "mean_reward":
            values = [s.reward for s in self.samples]
        elif metric == "mean_length":
            values = [float(s.num_tokens) for s in self.samples]
        elif metric == "truncated_rate":
            values = [float(s.finish_reason == "length") for s in self.samples]
        elif all(metric in s.extra for s in self.samples):
            values = [float(s.extra[metric]) for s in self.samples]
        else:
            raise ValueError(f"unknown metric {metric!r}; expected one of {PER_QUESTION_METRICS} or a task metric")
        return math.fsum(values) / len(values)

    @property
    def num_correct(self) -> int:
        """How many samples are correct."""
        return sum(s.correct for s in self.samples)


@dataclass
class ModeResult:
    """One decoding mode's outcomes over all questions: ``n_samples`` per question at ``temperature``."""

    mode: str
    n_samples: int
    temperature: float
    questions: list[QuestionOutcome]

    def per_question(self, metric: str) -> list[float]:
        """One value per question: a per-question metric, or ``pass@k`` / ``pass_at_k`` (unbiased estimator)."""
        k = _pass_k(metric)
        if k is not None:
            self._check_k(k)
            return [pass_at_k(self.n_samples, q.num_correct, k) for q in self.questions]
        return [q.value(metric) for q in self.questions]

    def estimate(self, metric: str) -> Estimate:
        """The metric's mean over questions with its standard error."""
        k = _pass_k(metric)
        if k is not None:
            self._check_k(k)
            return pass_at_k_estimate([q.num_correct for q in self.questions], self.n_samples, k)
        return mean_stderr(self.per_question(metric))

    def metrics(self, k_values: Sequence[int] = ()) -> dict[str, float]:
        """Flat metrics: each per-question metric and ``pass_at_k`` for each usable ``k``, each with ``_se``."""
        out: dict[str, float] = {"num_questions": float(len(self.questions)), "n_samples": float(self.n_samples)}
        for metric in PER_QUESTION_METRICS:
            out.update(self.estimate(metric).as_dict(metric))
        extras = [set(s.extra) for q in self.questions for s in q.samples]
        common = set.intersection(*extras) if extras else set()
        for metric in sorted(common):
            out.update(self.estimate(metric).as_dict(metric))
        if {"tool_calls", "tool_errors"} <= common:  # a ratio over all calls (no standard error: calls cluster)
            calls = math.fsum(s.extra["tool_calls"] for q in self.questions for s in q.samples)
            errors = math.fsum(s.extra["tool_errors"] for q in self.questions for s in q.samples)
            out["tool_success_rate"] = 1.0 - errors / calls if calls else math.nan
        for k in sorted(set(k_values)):
            if k <= self.n_samples:
                out.update(self.estimate(f"pass_at_{k}").as_dict(f"pass_at_{k}"))
        return out

    def _check_k(self, k: int) -> None:
        if not 1 <= k <= self.n_samples:
            raise ValueError(f"{self.mode}: pass@{k} needs 1 <= k <= n_samples ({self.n_samples})")


@dataclass
class EvaluationResult:
    """An evaluation of one policy: its decoding modes, the ``k`` values asked for, and free-form settings."""

    modes: dict[str, ModeResult]
    k_values: list[int]
    settings: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, float]:
        """``{"<mode>/<metric>": value}`` over all modes (pass@k only where ``k <= n_samples``)."""
        return {
            f"{name}/{key}": value
            for name, mode in self.modes.items()
            for key, value in mode.metrics(self.k_values).items()
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (see :meth:`from_dict`)."""
        return {
            "k_values": list(self.k_values),
            "settings": dict(self.settings),
            "summary": self.summary(),
            "modes": {name: dataclasses.asdict(mode) for name, mode in self.modes.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "evaluation result") -> EvaluationResult:
        """Rebuild a result written by :meth:`to_dict`; a malformed one names ``source`` and the field."""
        try:
            modes = {
                name: ModeResult(
                    mode=m["mode"],
                    n_samples=int(m["n_samples"]),
                    temperature=float(m["temperature"]),
                    questions=[
                        QuestionOutcome(int(q["index"]), str(q["gold"]), [SampleOutcome(**s) for s in q["samples"]])
                        for q in m["questions"]
                    ],
                )
                for name, m in data["modes"].items()
            }
            return cls(
                modes=modes, k_values=[int(k) for k in data["k_values"]], settings=dict(data.get("settings", {}))
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{source}: malformed evaluation result ({type(err).__name__}: {err})") from err


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temp file and a rename (no partial file after a crash)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        temp.write_text(text, encoding="utf-8")
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return path


def save_result(result: EvaluationResult, path: str | os.PathLike[str]) -> Path:
    """Write ``result`` as JSON, atomically."""
    return write_text_atomic(path, json.dumps(result.to_dict(), indent=1, allow_nan=True))


def load_result(path: str | os.PathLike[str]) -> EvaluationResult:
    """Read a result written by :func:`save_result` (errors name the file)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from err
    return EvaluationResult.from_dict(data, source=str(path))


def _pass_k(metric: str) -> int | None:
    for prefix in ("pass@", "pass_at_"):
        if metric.startswith(prefix):
            try:
                return int(metric[len(prefix) :])
            except ValueError as err:
                raise ValueError(f"bad pass@k metric name {metric!r}") from err
    return None
