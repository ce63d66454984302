"""Estimators for evaluation metrics: pass@k and means with standard errors clustered by question.

Design choices:

* **pass@k** uses the unbiased estimator of Chen et al. (2021): with ``n`` samples of which ``c`` are
  correct, ``pass@k = 1 - C(n-c, k) / C(n, k)``, the probability that a random ``k``-subset of the ``n``
  samples holds at least one correct one. It is computed with exact integer binomials (``math.comb``), so
  it has no cancellation problems for any ``n``.
* **Standard errors are over questions.** Samples of one question are correlated (same difficulty), so the
  unit of the estimate is the question: each question contributes one value (its fraction of correct
  samples, its pass@k estimate, its mean reward) and the metric is the mean of those values with standard
  error ``s / sqrt(Q)``, ``s`` the sample standard deviation (``ddof=1``) over the ``Q`` questions. With one
  sample per question (greedy) this is the usual ``sqrt(p (1 - p) / (Q - 1))`` of a proportion.
* **Comparisons are paired.** Two policies scored on the same questions are compared with the mean and
  standard error of the per-question differences, which removes the between-question variance both share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Estimate:
    """A mean over ``count`` units (questions) with its standard error (NaN when ``count < 2``)."""

    mean: float
    stderr: float
    count: int

    def as_dict(self, prefix: str) -> dict[str, float]:
        """``{prefix: mean, prefix + "_se": stderr}`` for flat metric tables."""
        return {prefix: self.mean, f"{prefix}_se": self.stderr}

    def __str__(self) -> str:
        return f"{self.mean:.3f} ± {self.stderr:.3f}"


def mean_stderr(values: Sequence[float]) -> Estimate:
    """Mean of ``values`` and its standard error ``std(values, ddof=1) / sqrt(len(values))``."""
    count = len(values)
    if count == 0:
        raise ValueError("mean_stderr needs at least one value")
    mean = math.fsum(values) / count
    if count < 2:
        return Estimate(mean, math.nan, count)
    variance = math.fsum((v - mean) ** 2 for v in values) / (count - 1)
    return Estimate(mean, math.sqrt(variance / count), count)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one question: ``1 - C(n - c, k) / C(n, k)`` (``n`` samples, ``c`` correct)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k_estimate(correct_counts: Sequence[int], n: int, k: int) -> Estimate:
    """pass@k over questions (each with ``n`` samples, ``correct_counts[i]`` correct) with its standard error."""
    return mean_stderr([pass_at_k(n, c, k) for c in correct_counts])


def paired_difference(treatment: Sequence[float], baseline: Sequence[float]) -> Estimate:
    """Mean and standard error of ``treatment[i] - baseline[i]`` over questions scored by both."""
    if len(treatment) != len(baseline):
        raise ValueError(f"paired_difference: {len(treatment)} values vs {len(baseline)} (need the same questions)")
    return mean_stderr([t - b for t, b in zip(treatment, baseline, strict=True)])
