"""``RayMCAdvantage``: TorchRL's actor-hosted ``MCAdvantage``, hosted in a Dask actor.

The grouping queues and counters of an :class:`~llmrl_core.objectives.advantage.MCAdvantage` live in one Dask actor
(:mod:`llmrl_core.dask_hosting`: the current ``distributed`` client's cluster, or a one-worker local cluster owned by
this object), so several writers (processes, collectors) complete one group together: each ``inv(td)`` queues its
finished trajectories there and gets back the groups they completed. ``actor_name`` is the actor's Dask key: a
second ``RayMCAdvantage`` with the same name (in another process too) shares the live actor's queues.

TorchRL's arguments are taken as they are, except the Ray settings, which have no Dask meaning and are refused
unless None (``ray_init_config``, ``remote_config``): choose the cluster with ``client=`` or ``address=`` (or an
active ``distributed.Client``). ``close()`` (or ``shutdown()``, or a ``with`` block) releases the actor.
"""

from __future__ import annotations

from typing import Any, Literal

from llmrl_core.envs.transforms.hosted import HostedTransform

__all__ = ["RayMCAdvantage"]


class RayMCAdvantage(HostedTransform):
    """An :class:`~llmrl_core.objectives.advantage.MCAdvantage` whose queues live in a Dask actor shared by every
    writer (see the module docstring); ``inv``, ``get_stats``, ``reset_stats``, ``clear_queues`` and the ``queued_*``
    counts run there."""

    _hosted = "llmrl_core.objectives.advantage:MCAdvantage"

    def __init__(
        self,
        grpo_size: int,
        prompt_key: Any = "query",
        rewards_key: Any = ("next", "reward"),
        advantage_key: Any = "advantage",
        done_key: Any = ("next", "done"),
        verbose: bool = False,
        *,
        trajectory_return: Literal["sum", "max", "mean"] | None = None,
        keep_return_bounds: tuple[float, float] | None = None,
        candidate_group_size: int | None = None,
        candidate_selection_min_size: int | None = None,
        candidate_selector: Any = None,
        ray_init_config: dict | None = None,
        remote_config: dict | None = None,
        actor_name: str | None = None,
        client: Any = None,
        address: str | None = None,
    ) -> None:
        kwargs = {
            "grpo_size": grpo_size,
            "prompt_key": prompt_key,
            "rewards_key": rewards_key,
            "advantage_key": advantage_key,
            "done_key": done_key,
            "verbose": verbose,
            "trajectory_return": trajectory_return,
            "keep_return_bounds": keep_return_bounds,
            "candidate_group_size": candidate_group_size,
            "candidate_selection_min_size": candidate_selection_min_size,
            "candidate_selector": candidate_selector,
            "ray_init_config": ray_init_config,
            "remote_config": remote_config,
        }
        super().__init__(
            kwargs,
            num_cpus=1,
            num_gpus=None,
            device=None,
            actor_name=actor_name,
            client=client,
            address=address,
        )

    def get_stats(self) -> dict[str, float | int]:
        """The shared counters and what is queued (``MCAdvantage.get_stats``)."""
        return self._remote("get_stats")

    def reset_stats(self) -> None:
        """Set the shared counters back to zero."""
        self._remote("reset_stats")

    def clear_queues(self) -> None:
        """Forget the incomplete groups of every writer."""
        self._remote("clear_queues")

    @property
    def queued_groups(self) -> int:
        """Incomplete groups held in the actor."""
        return int(self._host.get("queued_groups"))

    @property
    def queued_trajectories(self) -> int:
        """Trajectories of incomplete groups held in the actor."""
        return int(self._host.get("queued_trajectories"))

    @property
    def max_queued_trajectories_per_group(self) -> int:
        """The most trajectories held for one group."""
        return int(self._host.get("max_queued_trajectories_per_group"))
