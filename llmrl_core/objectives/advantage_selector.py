"""``MCAdvantageSelector``: which ``group_size`` trajectories of an over-sampled group are kept (TorchRL 0.14.1's
name, arguments and strategies, written from scratch).

``MCAdvantage(candidate_group_size=N > grpo_size)`` collects up to ``N`` candidate trajectories for one group and
asks the selector for ``grpo_size`` of them, by their scalar returns:

* ``"first"``: the first ``group_size`` candidates (what a group without over-sampling trains on);
* ``"uniform"``: candidates spread evenly over the returns' order (lowest to highest; one candidate: the median);
* ``"balanced"`` (default): with ``keep_return_bounds=(low, high)``, the subset whose mean return lies inside the
  open interval and closest to its middle, ties going to the wider spread of returns, then to the first such subset
  in lexicographic order. Every subset is tried while there are at most ``max_combinations`` of them; beyond that
  the uniform pick is improved greedily (the selected candidate furthest from the interval is swapped for the
  best unselected one, one at a time) until the mean enters the interval. Without bounds it is the uniform pick.

A selection whose mean return falls outside ``keep_return_bounds`` is ``None``: the group has no useful subset yet.
"""

from __future__ import annotations

from itertools import combinations
from math import comb
from typing import Any, Literal

Strategy = Literal["first", "uniform", "balanced"]


class MCAdvantageSelector:
    """Select ``group_size`` candidates of an over-sampled Monte-Carlo group by return (see the module docstring).

    ``in_keys``: the candidate entries read; the built-in strategies read one scalar per candidate at the first key
    (``"return"``: ``MCAdvantage`` passes each candidate's return there). Subclass and override :meth:`select` for
    another rule.
    """

    def __init__(
        self,
        strategy: Strategy = "balanced",
        *,
        max_combinations: int = 100_000,
        in_keys: list[Any] | None = None,
    ) -> None:
        if strategy not in ("first", "uniform", "balanced"):
            raise ValueError(f"strategy must be one of 'first', 'uniform' or 'balanced', got {strategy!r}.")
        if max_combinations < 1:
            raise ValueError(f"max_combinations must be strictly positive, got {max_combinations}.")
        if in_keys is not None and not in_keys:
            raise ValueError("in_keys must contain at least one key.")
        self.strategy = strategy
        self.max_combinations = int(max_combinations)
        self.in_keys = list(in_keys) if in_keys is not None else ["return"]

    def select(
        self,
        candidates: Any,
        *,
        group_size: int,
        keep_return_bounds: tuple[float, float] | None = None,
    ) -> list[int] | None:
        """The indices of the selected candidates (in the order they are kept), or ``None`` when no subset has its
        mean return inside ``keep_return_bounds``. ``candidates``: a TensorDict with one entry per candidate."""
        values = self.candidate_values(candidates)
        if len(values) < group_size:
            raise ValueError(f"Need at least {group_size} candidates, got {len(values)}.")
        if len(values) == group_size or self.strategy == "first":
            picked = list(range(group_size))
        elif self.strategy == "uniform" or keep_return_bounds is None:
            picked = spread_over_order(values, group_size)
        else:
            return self._balanced(values, group_size, keep_return_bounds)
        return picked if mean_inside(values, picked, keep_return_bounds) else None

    def candidate_values(self, candidates: Any) -> list[float]:
        """One float per candidate, read at the first of ``in_keys``."""
        key = self.in_keys[0]
        values = candidates.get(key)
        if values.numel() != candidates.numel():
            raise ValueError(
                "The built-in MCAdvantageSelector strategies expect one scalar value per candidate under "
                f"{key!r}, got values.shape={values.shape} for candidates.batch_size={candidates.batch_size}."
            )
        return [float(v) for v in values.detach().reshape(-1).cpu()]

    def _balanced(self, values: list[float], size: int, bounds: tuple[float, float]) -> list[int] | None:
        if comb(len(values), size) <= self.max_combinations:
            return _best_subset(values, size, bounds)
        return _greedy_subset(values, size, bounds)


def mean_inside(values: list[float], picked: list[int], bounds: tuple[float, float] | None) -> bool:
    """Whether the picked candidates' mean return is strictly inside ``bounds`` (always, without bounds)."""
    if bounds is None:
        return True
    mean = sum(values[i] for i in picked) / len(picked)
    return bounds[0] < mean < bounds[1]


def spread_over_order(values: list[float], size: int) -> list[int]:
    """``size`` candidates evenly spaced over the order of their returns, lowest first."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    if size == 1:
        return [order[len(order) // 2]]
    last = len(order) - 1
    return [order[round(k * last / (size - 1))] for k in range(size)]


def _best_subset(values: list[float], size: int, bounds: tuple[float, float]) -> list[int] | None:
    """Every subset: the one whose mean is inside ``bounds`` and nearest the middle, the wider spread on a tie."""
    middle = (bounds[0] + bounds[1]) / 2
    best: tuple[float, float] | None = None
    chosen: tuple[int, ...] | None = None
    for subset in combinations(range(len(values)), size):
        picked = [values[i] for i in subset]
        mean = sum(picked) / size
        if not bounds[0] < mean < bounds[1]:
            continue
        rank = (abs(mean - middle), min(picked) - max(picked))
        if best is None or rank < best:
            best, chosen = rank, subset
    return list(chosen) if chosen is not None else None


def _greedy_subset(values: list[float], size: int, bounds: tuple[float, float]) -> list[int] | None:
    """The uniform pick, then one swap at a time toward the interval until the mean is inside it."""
    picked = spread_over_order(values, size)
    if mean_inside(values, picked, bounds):
        return picked
    mean = sum(values[i] for i in picked) / size
    too_low = mean <= bounds[0]
    # Too low: bring in the highest unselected returns in place of the lowest selected ones (and conversely).
    ascending = sorted(range(len(values)), key=lambda i: values[i])
    incoming = ascending[::-1] if too_low else ascending
    outgoing = sorted(picked, key=lambda i: values[i], reverse=not too_low)
    for new in incoming:
        if new in picked:
            continue
        if not outgoing:
            break
        old = outgoing.pop(0)
        picked[picked.index(old)] = new
        if mean_inside(values, picked, bounds):
            return picked
    return None


__all__ = ["MCAdvantageSelector", "mean_inside", "spread_over_order"]
