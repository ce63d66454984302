"""``RayLLMCollector``: TorchRL's remote LLM collector, hosted in a Dask actor (llmrl has no Ray).

The constructor takes TorchRL's arguments. An :class:`~llmrl_core.collectors.llm_collector.LLMCollector` is built
with them inside a Dask actor (:mod:`llmrl_core.dask_hosting`: the current ``distributed`` client's cluster, or
a one-worker local cluster owned by the collector); iterating yields the batches it collects there, and
``update_policy_weights_``, ``get_policy_version``/``policy_version``, ``increment_version`` are forwarded.
Everything the remote collector needs travels pickled: pass ``env`` and the policy as factories
(``policy_factory=``) so engines and models are built on the worker.

How the Ray arguments map (see :mod:`llmrl_core.dask_hosting`): ``num_gpus`` > 0 places the actor on a worker
declaring the Dask resource ``GPU``; ``num_cpus`` is recorded (on an owned cluster, the worker's torch threads);
``ray_init_config`` and ``remote_config`` have no Dask meaning and are refused (``ValueError``) unless None.
``sync_iter=False`` asks for the next batch before handing out the current one (the actor collects while the
caller works); the actor runs one call at a time, so a weight update sent meanwhile waits for that batch.

Where the data goes: ``replay_buffer`` (TorchRL's) and ``queue``/``sink`` (``LLMCollector`` arguments) stay in the
caller's process, and every batch the remote collector hands out is delivered to them here (``extend`` /
``put``): a Dask actor gets a pickled copy of its arguments, so a buffer sent to it would fill on the worker. As in
TorchRL, iterating then yields None for each batch delivered to a replay buffer or queue.
Other keyword arguments of llmrl's ``LLMCollector`` (``prompts``, ``total_trajectories``, ``rolling_reset``, ...)
are passed through; ``client=`` / ``address=`` choose the Dask cluster.
"""

from __future__ import annotations

import queue as queue_module
import warnings
from collections.abc import Callable, Iterator
from typing import Any


class RayLLMCollector:
    """An :class:`~llmrl_core.collectors.llm_collector.LLMCollector` in a Dask actor, with TorchRL's
    ``RayLLMCollector`` arguments (see the module docstring for what the Ray ones become on Dask).

    Args:
        env: the environment, or a factory building it on the worker.

    Keyword Args:
        policy / policy_factory: the policy, or a factory building it on the worker (exactly one).
        dialog_turns_per_batch, total_dialog_turns, yield_only_last_steps, yield_completed_trajectories,
            postproc, async_envs, reset_at_each_iter, flatten_data, weight_updater, track_policy_version,
            verbose: passed to the remote ``LLMCollector``.
        replay_buffer: filled here, in the caller's process, with each batch (iteration then yields None).
        ray_init_config / remote_config: Ray settings, refused unless None.
        sync_iter: False fetches the next batch while the caller handles the current one.
        num_cpus / num_gpus: Ray's actor resources (``num_gpus`` > 0: a Dask worker with ``GPU`` resources).
        client / address: the Dask cluster (default: the current client, else an owned local cluster).
        **kwargs: further ``LLMCollector`` arguments (``queue`` and ``sink`` are served here, like
            ``replay_buffer``).
    """

    def __init__(
        self,
        env: Any,
        *,
        policy: Callable[..., Any] | None = None,
        policy_factory: Callable[[], Callable[..., Any]] | None = None,
        dialog_turns_per_batch: int,
        total_dialog_turns: int = -1,
        yield_only_last_steps: bool | None = None,
        yield_completed_trajectories: bool | None = None,
        postproc: Callable[[Any], Any] | None = None,
        async_envs: bool | None = None,
        replay_buffer: Any = None,
        reset_at_each_iter: bool = False,
        flatten_data: bool | None = None,
        weight_updater: Any = None,
        ray_init_config: dict[str, Any] | None = None,
        remote_config: dict[str, Any] | None = None,
        track_policy_version: Any = False,
        sync_iter: bool = True,
        verbose: bool = False,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        client: Any = None,
        address: str | None = None,
        **kwargs: Any,
    ) -> None:
        from llmrl_core.dask_hosting import DaskHost, refuse_ray_only

        refuse_ray_only("RayLLMCollector", ray_init_config=ray_init_config, remote_config=remote_config)
        local_queue, sink = kwargs.pop("queue", None), kwargs.pop("sink", None)
        if local_queue is not None and replay_buffer is not None:
            raise RuntimeError("Handling both a buffer and a queue is not possible at the moment.")
        if sink is not None and (local_queue is not None or replay_buffer is not None):
            raise ValueError("sink is llmrl's name for queue/replay_buffer: pass only one of them")
        self.sync_iter = sync_iter
        self.replay_buffer = replay_buffer  # kept here: batches are delivered in this process
        self.queue = local_queue
        self._sink = next((t for t in (replay_buffer, local_queue, sink) if t is not None), None)
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        collector_kwargs = dict(
            env=env,
            policy=policy,
            policy_factory=policy_factory,
            dialog_turns_per_batch=dialog_turns_per_batch,
            total_dialog_turns=total_dialog_turns,
            yield_only_last_steps=yield_only_last_steps,
            yield_completed_trajectories=yield_completed_trajectories,
            postproc=postproc,
            async_envs=async_envs,
            reset_at_each_iter=reset_at_each_iter,
            flatten_data=flatten_data,
            weight_updater=weight_updater,
            track_policy_version=track_policy_version,
            verbose=verbose,
            **kwargs,
        )
        self._host = DaskHost(
            "llmrl_core.collectors.llm_collector:LLMCollector",
            kwargs=collector_kwargs,
            client=client,
            address=address,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            name="RayLLMCollector",
        )

    # --- batches -----------------------------------------------------------------------------------
    def _deliver(self, batch: Any) -> Any:
        """Hand ``batch`` to the replay buffer / queue / sink of this process; what iteration yields: None with a
        replay buffer or a queue (TorchRL: the collector "will not yield tensordicts but populate the buffer
        instead"), else the batch."""
        sink = self._sink
        if sink is None:
            return batch
        if isinstance(sink, queue_module.Queue) or not callable(getattr(sink, "extend", None)):
            sink.put(batch)
        else:
            sink.extend(batch)
        return None if sink is self.replay_buffer or sink is self.queue else batch

    def __iter__(self) -> Iterator[Any]:
        """The remote collector's batches, from a new iteration (as ``iter()`` on a local ``LLMCollector``)."""
        host = self._host
        host.restart_iteration()
        pending = None if self.sync_iter else host.submit_next()
        while True:
            if pending is None:
                has_batch, batch = host.submit_next().result()
            else:
                has_batch, batch = pending.result()
                pending = host.submit_next() if has_batch else None  # collect the next while this one is used
            if not has_batch:
                return
            yield self._deliver(batch)

    def next(self) -> Any:
        """The next batch of the remote collector's running iteration (None when it is exhausted, or when batches
        go to a replay buffer or queue)."""
        has_batch, batch = self._host.submit_next().result()
        return self._deliver(batch) if has_batch else None

    def set_postproc(self, postproc: Callable[[Any], Any]) -> None:
        """Set the remote collector's post-processing of each batch."""
        if self._host.has("set_postproc"):
            self._host.call("set_postproc", postproc)
        else:
            self._host.set("postproc", postproc)

    # --- weights and versions ------------------------------------------------------------------------
    def update_policy_weights_(self, policy_or_weights: Any = None, *, worker_ids: Any = None, **kwargs: Any) -> Any:
        """Push new weights through the remote collector's weight updater (``update_policy_weights_`` there)."""
        if "policy_weights" in kwargs:
            warnings.warn(
                "`policy_weights` is deprecated. Use `policy_or_weights` instead.", DeprecationWarning, stacklevel=2
            )
            policy_or_weights = kwargs.pop("policy_weights")
        return self._host.call("update_policy_weights_", policy_or_weights, worker_ids=worker_ids, **kwargs)

    def get_policy_version(self) -> int | str | None:
        """The remote collector's policy version (None when versions are not tracked)."""
        return self._host.call("get_policy_version")

    @property
    def policy_version(self) -> int | str | None:
        """The remote collector's policy version (None when versions are not tracked)."""
        return self.get_policy_version()

    def increment_version(self) -> Any:
        """Advance the remote collector's policy version."""
        return self._host.call("increment_version")

    @property
    def weight_updater(self) -> Any:
        """The remote collector's weight updater (a pickled copy)."""
        return self._host.get("weight_updater")

    @weight_updater.setter
    def weight_updater(self, weight_updater: Any) -> None:
        self._host.call("set_weight_updater", weight_updater)
        register = getattr(weight_updater, "register_collector", None)
        if callable(register):
            register(self)

    def init_updater(self, *args: Any, **kwargs: Any) -> None:
        """Forwarded to the remote collector's ``init_updater``."""
        self._host.call("init_updater", *args, **kwargs)

    # --- what the remote collector was built with ----------------------------------------------------
    @property
    def total_dialog_turns(self) -> int | None:
        return self._host.get("total_dialog_turns")

    @property
    def dialog_turns_per_batch(self) -> int | None:
        return self._host.get("dialog_turns_per_batch")

    @property
    def init_random_frames(self) -> int:
        """Always 0 (TorchRL's trainers read it)."""
        return 0

    # --- background collection (when the hosted collector has it) ------------------------------------
    def _optional(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if not self._host.has(method):
            raise NotImplementedError(
                f"RayLLMCollector.{method}: llmrl's LLMCollector has no {method}(); iterate the collector instead"
            )
        return self._host.call(method, *args, **kwargs)

    def start(self) -> Any:
        """Start the remote collector's background collection (where the hosted collector offers it)."""
        return self._optional("start")

    def is_running(self) -> bool:
        return bool(self._optional("is_running"))

    def async_shutdown(self, timeout: float | None = None) -> Any:
        return self._optional("async_shutdown", timeout=timeout)

    # --- life ------------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Shut the remote collector down, release its actor, and close a cluster this collector started."""
        host = self._host
        if host.closed:
            return
        try:
            if host.has("shutdown"):
                host.call("shutdown")
        finally:
            host.close()

    close = shutdown

    def where(self) -> dict[str, Any]:
        """``{"worker": address, "pid": process id}`` of the remote collector."""
        return self._host.where()

    def __enter__(self) -> RayLLMCollector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"RayLLMCollector({self._host!r}, sync_iter={self.sync_iter})"
