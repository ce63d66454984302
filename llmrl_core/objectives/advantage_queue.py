"""``MCAdvantage`` as a replay-buffer write transform (TorchRL's ``inv``): finished trajectories wait, per group,
until their group is complete; then the group's advantages are written and the whole group is returned.

Each write (``MCAdvantage.inv(td)``) holds finished trajectories: one ``(T,)`` trajectory, several on one time axis
(split after each done step), or a batch ``(B, T)`` (more dimensions are flattened into the batch). A trajectory
belongs to the group named at its first step's ``prompt_key`` (a string, or a tensor grouped by value) and joins
that group's queue. A write returns the groups it completed, concatenated on the time axis in the order they
completed (``None`` when none did):

* ``trajectory_return=None``: a group completes at ``grpo_size`` trajectories; every step's reward is normalised
  over all steps of the group (the advantage has the reward's shape).
* ``trajectory_return="sum" | "mean" | "max"``: from ``candidate_selection_min_size`` queued candidates on, each new
  one asks ``candidate_selector`` (:class:`~llmrl_core.objectives.advantage_selector.MCAdvantageSelector`) for
  ``grpo_size`` trajectories whose mean return is inside ``keep_return_bounds``; the selected ones (in the
  selector's order) get their normalised return on every step. A group with no such subset once
  ``candidate_group_size`` candidates came is dropped.

Counters (``get_stats()``) say what the writes did: trajectories and steps seen, the returns' sum and how many were
positive, groups written, dropped and rescued (a selection other than the first ``grpo_size`` candidates found
one), candidates selected and left out, and what is still queued.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

from llmrl_core.objectives.group_relative import RETURN_REDUCERS, group_advantages

STAT_NAMES = (
    "completed_trajectories",
    "completed_decisions",
    "trajectory_return_sum",
    "trajectory_return_max",
    "successful_trajectories",
    "completed_groups",
    "written_groups",
    "dropped_groups",
    "rescued_groups",
    "selected_trajectories",
    "unselected_trajectories",
)


class GroupQueueWriter:
    """The replay-buffer side of :class:`~llmrl_core.objectives.advantage.MCAdvantage` (see the module docstring);
    it reads the transform's settings (``grpo_size``, keys, ``trajectory_return``, bounds, candidate sizes,
    selector, ``method``, ``eps``)."""

    grpo_size: int | None
    prompt_key: Any
    done_key: Any
    trajectory_return: str | None
    keep_return_bounds: tuple[float, float] | None
    candidate_group_size: int
    candidate_selection_min_size: int
    candidate_selector: Any
    method: str
    eps: float
    verbose: bool
    _rewards_td_key: Any
    _advantage_td_key: Any

    def _init_queues(self) -> None:
        self.queues: dict[Hashable, list[Any]] = {}
        self.reset_stats()

    def reset_stats(self) -> None:
        """Set every counter back to zero (the queued trajectories stay)."""
        for name in STAT_NAMES:
            setattr(self, name, 0)
        self.trajectory_return_sum = 0.0
        self.trajectory_return_max = float("-inf")

    def clear_queues(self) -> None:
        """Forget the incomplete groups."""
        self.queues.clear()

    @property
    def queued_groups(self) -> int:
        """Incomplete groups held."""
        return len(self.queues)

    @property
    def queued_trajectories(self) -> int:
        """Trajectories of incomplete groups held."""
        return sum(len(q) for q in self.queues.values())

    @property
    def max_queued_trajectories_per_group(self) -> int:
        """The most trajectories held for one group."""
        return max((len(q) for q in self.queues.values()), default=0)

    def get_stats(self) -> dict[str, float | int]:
        """The counters and what is queued, as a plain dict."""
        return {name: getattr(self, name) for name in STAT_NAMES} | {
            "queued_groups": self.queued_groups,
            "queued_trajectories": self.queued_trajectories,
            "max_queued_trajectories_per_group": self.max_queued_trajectories_per_group,
        }

    def forward(self, tensordict: Any) -> Any:
        """Reading from the buffer changes nothing."""
        return tensordict

    def inv(self, tensordict: Any) -> Any:
        """Queue the finished trajectories of one write; return the groups they completed (or ``None``)."""
        if self.grpo_size is None:
            raise ValueError("MCAdvantage.inv (a replay-buffer write) needs grpo_size: the number of trajectories a "
                             "group waits for")  # fmt: skip
        if tensordict.ndim > 2:
            tensordict = tensordict.reshape(-1, tensordict.shape[-1])
        trajectories = tensordict.unbind(0) if tensordict.ndim == 2 else _split_at_done(tensordict, self.done_key)
        done = [out for t in trajectories if (out := self._add(t)) is not None]
        return _cat(done) if done else None

    def _add(self, trajectory: Any) -> Any:
        if not bool(trajectory[-1].get(self.done_key).all()):
            raise RuntimeError("Expected the trajectory to be done.")
        group = _group_of(trajectory[0][self.prompt_key])
        self.completed_trajectories += 1
        self.completed_decisions += trajectory.numel()
        if self.trajectory_return is not None:
            value = float(trajectory.get(self._rewards_td_key).sum())
            self.trajectory_return_sum += value
            self.trajectory_return_max = max(self.trajectory_return_max, value)
            self.successful_trajectories += int(value > 0.0)
        queue = self.queues.setdefault(group, [])
        queue.append(trajectory)
        if self.trajectory_return is None:
            if len(queue) < self.grpo_size:
                return None
            del self.queues[group]
            self.completed_groups += 1
            self.written_groups += 1
            return self._per_step_advantages(queue)
        if len(queue) < self.candidate_selection_min_size:
            return None
        out = self._selected_group(queue)
        if out is not None or len(queue) == self.candidate_group_size:
            del self.queues[group]
            self.completed_groups += 1
            self.written_groups += out is not None
            self.dropped_groups += out is None
        return out

    def _per_step_advantages(self, queue: list[Any]) -> Any:
        group = _cat(queue)
        rewards = group.get(self._rewards_td_key).float()
        advantages = group_advantages(rewards.reshape(-1), self.method, self.eps)
        group.set(self._advantage_td_key, advantages.reshape(rewards.shape))
        return group

    def _selected_group(self, queue: list[Any]) -> Any:
        from tensordict import TensorDict

        from llmrl_core.objectives.advantage_selector import mean_inside

        rewards = [t.get(self._rewards_td_key).float() for t in queue]
        reduce = RETURN_REDUCERS[self.trajectory_return]  # type: ignore[index]
        returns = torch.stack([reduce(r) for r in rewards])
        candidates = TensorDict({"return": returns}, batch_size=[len(queue)])
        picked = self.candidate_selector.select(
            candidates, group_size=self.grpo_size, keep_return_bounds=self.keep_return_bounds
        )
        if picked is None:
            return None
        if len(queue) > self.grpo_size:
            values = [float(v) for v in returns]
            self.rescued_groups += not mean_inside(values, list(range(self.grpo_size)), self.keep_return_bounds)
            self.unselected_trajectories += len(queue) - self.grpo_size
        self.selected_trajectories += len(picked)
        kept = returns[picked]
        if not mean_inside([float(v) for v in kept], list(range(len(picked))), self.keep_return_bounds):
            return None  # a custom selector's pick outside the bounds: no signal
        advantages = group_advantages(kept, self.method, self.eps)
        out = []
        for index, advantage in zip(picked, advantages, strict=True):
            trajectory = queue[index]
            trajectory.set(self._advantage_td_key, advantage.expand(rewards[index].shape).clone())
            out.append(trajectory)
        return _cat(out)


def _group_of(value: Any) -> Hashable:
    """A group id: a string as it is, a tensor by value."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else tuple(value.reshape(-1).tolist())
    if isinstance(value, str):
        return value
    raise TypeError(f"Expected a string or tensor as group identifier, got {type(value)=}")


def _split_at_done(tensordict: Any, done_key: Any) -> list[Any]:
    """The trajectories of one time axis, each ending at a done step."""
    done = tensordict.get(done_key).reshape(tensordict.shape[0], -1).any(-1)
    ends = (torch.nonzero(done).reshape(-1) + 1).tolist()
    if len(ends) <= 1:
        return [tensordict]
    lengths = [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    if ends[-1] < tensordict.shape[0]:
        lengths.append(tensordict.shape[0] - ends[-1])  # steps after the last done: refused as unfinished
    return list(tensordict.split(lengths))


def _cat(trajectories: list[Any]) -> Any:
    """Trajectories on one time axis (a lazy stack of their steps where their entries' shapes differ)."""
    from tensordict import lazy_stack

    try:
        return torch.cat([t.contiguous() for t in trajectories], 0)
    except RuntimeError:
        return lazy_stack([step for t in trajectories for step in t.unbind(0)], 0)


__all__ = ["GroupQueueWriter", "STAT_NAMES"]
