"""Where the stages run: a Dask cluster with rollout workers and one trainer worker (GRPO, collect), or the
trainer worker alone (SFT and offline GRPO, which make no rollouts: ``rollout_workers=0``).

Placement is by Dask resources in both cases: ``ROLLOUT`` workers host the engines, the worker declaring
``TRAINER`` (or ``GPU``) hosts the trainer.

* By default a local cluster (a ``SpecCluster`` of nanny processes on 127.0.0.1) is started for the flow
  run: ``rollout.workers`` workers with ``ROLLOUT=1`` and one trainer worker with ``TRAINER=1``, plus
  ``GPU=1`` when the trainer runs on CUDA (``train.device`` cuda, or auto with a GPU present).
* With ``dask.address`` the flow joins an existing scheduler whose workers declare the same resources,
  e.g. ``dask worker tcp://host:8786 --resources "GPU=1"``; a trainer-only run also accepts a scheduler
  with a single, undeclared worker. Such workers get nothing below: start each with its own
  ``CUDA_VISIBLE_DEVICES`` / ``OMP_NUM_THREADS`` (and ``DASK_DISTRIBUTED__WORKER__DAEMON=False`` for
  ``rollout.tensor_parallel_size > 1``).

The plan of the local cluster (which GPUs and CPU threads each worker gets, checked before any worker starts)
is :mod:`runtime.placement_plan`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llmrl_core.pipeline.grpo_config import GRPOConfig
from runtime.memory_check import check_local_placement
from runtime.placement_plan import (
    THREAD_VARIABLES,
    RunConfig,
    local_worker_resources,
    rollout_count,
    rollout_placement,
    trainer_ranks,
    visible_gpus,
)
from storage.handoff import sweep_orphans

STOP_TIMEOUT_S = 5.0  # a worker's event loop answers a stop within this, unless the worker hangs


@dataclass
class Placement:
    """The client, which worker addresses host the rollout engines and the trainer, and the actors the run
    started on them (:meth:`start_actor`); on a joined cluster, whose workers outlive the run, they are closed
    when the run's cluster context ends (:meth:`close_actors`)."""

    client: Any
    rollout: list[str]
    trainer: str
    actors: list[Any] = field(default_factory=list)
    # the workers of trainer ranks 1.. (``train.data_parallel > 1``); ``trainer`` is rank 0's
    trainer_ranks: list[str] = field(default_factory=list)

    def start_actor(self, cls: type, *args: Any, worker: str, **kwargs: Any) -> Any:
        """Start ``cls(*args, **kwargs)`` as a Dask actor on ``worker``; returns its future (``.result()``: the
        actor). Remembered, so that :meth:`close_actors` can free what it holds when the run ends."""
        future = self.client.submit(cls, *args, actor=True, workers=[worker], pure=False, **kwargs)
        self.actors.append(future)
        return future

    def close_actors(self, timeout_s: float = 20.0) -> None:
        """Call ``stop()`` (at once, on the worker's event loop) and then ``close()`` (after any call in flight) on
        every started actor that has them, before the run's client lets Dask drop them.

        Dask drops an actor without telling it; an in-process vLLM engine dropped that way is never freed
        (:func:`~llmrl_core.modules.backends.vllm.engine.shutdown_llm`), so a joined cluster's rollout worker grew by
        an engine per run. A failing or hung close is logged, not raised: the run's result stands.
        """
        actors = [f.result() for f in self.actors if f.status == "finished"]  # else nothing resident to close
        self.actors.clear()
        # first tell them to stop: a rollout still in flight (the run is stopping) then writes nothing
        _call_each(actors, "stop", STOP_TIMEOUT_S)
        _call_each(actors, "close", timeout_s)

    @property
    def engines_beside_trainer(self) -> bool:
        """Every rollout worker has the trainer worker's host in its address (so files the trainer leaves in
        shared memory reach them); False when there are no rollout workers."""
        host = urlsplit(self.trainer).hostname
        return bool(self.rollout) and all(urlsplit(a).hostname == host for a in self.rollout)


def _call_each(actors: list[Any], method: str, timeout_s: float) -> None:
    """Call ``method`` on every actor whose class has it, then wait for each up to ``timeout_s``; a failure or a
    timeout is logged, not raised (teardown: the run's result stands)."""
    calls = [(a, getattr(a, method)()) for a in actors if callable(getattr(a._cls, method, None))]
    for actor, call in calls:
        try:
            call.result(timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - teardown: report and go on
            _logger().warning("could not %s %s on %s: %s", method, actor._cls.__name__, actor._address, exc)


def place_workers(workers: dict[str, dict], n_rollout: int, n_trainers: int = 1) -> tuple[list[str], list[str]]:
    """Choose rollout workers and ``n_trainers`` trainer workers (rank 0 first) from ``scheduler_info()["workers"]``
    by their declared resources. Trainer workers named ``trainer``, ``trainer-1``, ... (the local cluster's) take
    the ranks their names say; others go by address."""
    if n_rollout == 0 and n_trainers == 1:
        return [], [trainer_worker(workers)]
    addresses = sorted(workers)
    if len(addresses) < n_trainers + min(n_rollout, 1):
        raise RuntimeError(
            f"need at least {n_trainers + min(n_rollout, 1)} Dask workers ({n_trainers} trainer rank(s), "
            f"train.data_parallel={n_trainers}{', + rollout' if n_rollout else ''}), found {len(addresses)}"
        )
    declared = [a for a in addresses if {"GPU", "TRAINER"} & set(workers[a].get("resources", {}))]
    named = {f"trainer-{rank}" if rank else "trainer": rank for rank in range(len(declared))}
    trainers = sorted(declared, key=lambda a: (named.get(str(workers[a].get("name")), len(declared)), a))
    trainers = trainers[:n_trainers]
    rollout = [a for a in addresses if "ROLLOUT" in workers[a].get("resources", {}) and a not in trainers]
    if len(trainers) < n_trainers or (n_rollout and not rollout):
        raise RuntimeError(
            "the Dask workers must declare resources: ROLLOUT for engine workers and TRAINER or GPU for the "
            f"trainer{f' ({n_trainers} workers: train.data_parallel={n_trainers})' if n_trainers > 1 else ''}; "
            f"found {[(a, workers[a].get('resources', {})) for a in addresses]}"
        )
    return rollout[:n_rollout], trainers


def wait_for_placement(
    client: Any, n_rollout: int, timeout_s: float, poll_s: float = 2.0, n_trainers: int = 1
) -> tuple[list[str], list[str]]:
    """:func:`place_workers` on a joined cluster, once it has ``n_rollout`` rollout workers and a trainer: workers
    starting beside the flow, or a lost worker's replacement after a restart, get up to ``timeout_s`` (the run's
    ``dask.join_wait_s``) to join
    (one log line while waiting). Then the placement error says what is still missing."""
    import time

    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        workers = client.scheduler_info()["workers"]
        try:
            rollout, trainers = place_workers(workers, n_rollout, n_trainers)
            if len(rollout) >= n_rollout:
                return rollout, trainers
            missing = (
                f"rollout.workers={n_rollout} but the cluster has {len(rollout)} worker(s) declaring ROLLOUT "
                f"(besides the trainer): start more, or set rollout.workers={len(rollout)}"
            )
        except RuntimeError as err:
            missing = str(err)
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"after waiting {timeout_s:.0f} s (dask.join_wait_s) for the cluster's workers: {missing}"
            ) from None
        if not said:
            _logger().info("waiting up to %.0f s for the cluster's workers (%s)", timeout_s, missing)
            said = True
        time.sleep(poll_s)


def trainer_worker(workers: dict[str, dict]) -> str:
    """The trainer of a run without rollouts: the worker declaring ``TRAINER`` or ``GPU``, else the only one."""
    declared = sorted(a for a, w in workers.items() if {"GPU", "TRAINER"} & set(w.get("resources", {})))
    if declared:
        return declared[0]
    if len(workers) == 1:
        return next(iter(workers))
    raise RuntimeError(
        "several Dask workers and none declares a TRAINER or GPU resource; start the trainer worker with "
        f"--resources 'TRAINER=1' (found {sorted(workers)})"
    )


_NANNY: type | None = None


def _nanny_class() -> type:
    """A ``Nanny`` whose worker process is spawned with the thread variables of its ``env`` already set.

    The Nanny applies ``env`` inside the new process, before the worker starts, and that is early enough for
    ``CUDA_VISIBLE_DEVICES`` (read when CUDA starts). Not for the thread counts: a worker process imports the
    flow's ``__main__`` module first, and torch imported there sizes its thread pool from the environment the
    process was spawned with (Dask's ``OMP_NUM_THREADS=1``). So the thread variables also go into the
    Nanny's ``pre_spawn_env``, which it exports in this process right before each spawn (Dask does the same
    with its own ``pre-spawn-environ``; the flow host's torch already has its threads). That export is process-wide
    and the workers spawn concurrently, so :func:`dask_cluster` also has each started worker set torch's count from
    its own environment.
    """
    global _NANNY
    if _NANNY is None:
        from distributed import Nanny

        class ThreadsNanny(Nanny):
            def __init__(self, *args: Any, env: dict[str, str] | None = None, **kwargs: Any) -> None:
                # the whole environment of this process now, as a spawned worker would inherit it: a worker forked
                # from the fork server (:func:`_fork_from_a_warm_server`) starts from that server's older one
                asked = env or {}
                super().__init__(*args, env={**os.environ, **asked}, **kwargs)
                # only the thread counts asked for this worker override Dask's pre-spawn defaults (one thread each)
                self.pre_spawn_env.update({k: v for k, v in asked.items() if k in THREAD_VARIABLES})

        _NANNY = ThreadsNanny
    return _NANNY


def _fork_from_a_warm_server(cfg: RunConfig, n_rollout: int) -> AbstractContextManager[Any]:
    """Start the local workers by forking a fork server that has already imported what they import (torch,
    transformers, vLLM when the run uses it, and the actors' modules) instead of spawning fresh interpreters.

    A spawned worker spends ~10 s importing vLLM and torch; a forked one starts with them. The server is started by
    the first flow run of this process and kept for its life, so later runs in the same process (a Python session,
    the test suite) start their workers in under a second; the first run imports once instead of once per worker.
    Only on a host without CUDA GPUs: CUDA must not be touched before a fork, and vLLM picks its platform at import
    (a server that imported it for a GPU host would hand a CPU-only worker the wrong one). Elsewhere, where Python
    has no fork server, and where the user chose Dask's ``distributed.worker.multiprocessing-method`` themselves
    (anything but its default ``spawn``), workers start as Dask would start them.
    """
    import multiprocessing

    import dask

    if "forkserver" not in multiprocessing.get_all_start_methods() or visible_gpus():
        return nullcontext()
    if dask.config.get("distributed.worker.multiprocessing-method", "spawn") != "spawn":
        return nullcontext()  # the user's own choice
    from distributed.utils import get_mp_context

    modules = ["distributed", "torch", "transformers", "runtime.trainer_actor"]
    if n_rollout:
        vllm_engine = isinstance(cfg, GRPOConfig) and cfg.rollout.backend == "vllm"
        modules += ["vllm.entrypoints.llm", "runtime.rollout_actor"] if vllm_engine else ["runtime.rollout_actor"]
    # read by each Nanny when it is constructed, so the setting must be in force while the cluster starts its workers
    # (and when a worker is restarted): the caller holds it for the cluster's life
    setting = dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    # Dask's first call sets its own preload list (its optional packages); this one replaces it. Either only counts
    # until the server has started: a later run in this process forks from the server as the first run left it.
    get_mp_context().set_forkserver_preload(modules)
    return setting


def _torch_threads_from_env() -> int | None:
    """On a worker: size torch's thread pool from the worker's own ``OMP_NUM_THREADS`` (when set)."""
    count = os.environ.get("OMP_NUM_THREADS")
    if not count:
        return None
    import torch

    torch.set_num_threads(int(count))
    return torch.get_num_threads()


def _describe(env: dict[str, str]) -> str:
    """``GPUs 1,2`` / ``no GPU`` and ``N threads`` for one worker's log line."""
    parts = []
    if "CUDA_VISIBLE_DEVICES" in env:
        parts.append(f"GPUs {env['CUDA_VISIBLE_DEVICES']}" if env["CUDA_VISIBLE_DEVICES"] else "no GPU")
    if "OMP_NUM_THREADS" in env:
        parts.append(f"{env['OMP_NUM_THREADS']} threads")
    return ", ".join(parts) or "defaults"


def _logger() -> Any:
    """The Prefect run logger inside a flow run, else the module's logger."""
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # no run context (tests, scripts)
        return logging.getLogger("llmrl.cluster")


@contextmanager
def dask_cluster(cfg: RunConfig, scratch: Path, rollout_workers: int | None = None) -> Iterator[Placement]:
    """Open the cluster for one flow run and close what this function started when it ends.

    ``rollout_workers``: how many engine workers (default ``cfg.rollout.workers``; 0: the trainer alone).
    """
    from dask.distributed import Client, Scheduler, SpecCluster

    from runtime.console import library_logs, logs_dir, verbose, worker_log_options
    from runtime.worker_exit import BoundedExit

    n_rollout = rollout_count(cfg, rollout_workers)
    n_trainers = trainer_ranks(cfg)
    if cfg.dask.address:
        with Client(cfg.dask.address) as client:
            rollout, trainers = wait_for_placement(client, n_rollout, cfg.dask.join_wait_s, n_trainers=n_trainers)
            place = Placement(client, rollout, trainers[0], trainer_ranks=trainers[1:])
            try:
                yield place
            finally:
                place.close_actors()  # the workers outlive the run: free what its actors held
        return
    scratch.mkdir(parents=True, exist_ok=True)
    common = dict(
        nthreads=1,
        host="127.0.0.1",
        # Engines and the trainer are long-lived actors, not Dask data: Dask's memory manager would pause
        # or restart them (losing the resident state) when a training step peaks; let the OS decide.
        memory_limit=0,
        local_directory=cfg.dask.local_directory or str(scratch),
    )
    resources = local_worker_resources(cfg, n_rollout)
    envs, gpus = check_local_placement(cfg, n_rollout)
    log = _logger()
    for note in gpus.notes:
        log.info(note)
    if gpus.visible or any(envs.values()):
        log.info("local Dask workers: " + "; ".join(f"{name} {_describe(env)}" for name, env in envs.items()))
    logs = logs_dir(scratch.parent)
    workers = {}
    for name, res in resources.items():
        log_options, log_env = worker_log_options(logs, name)
        options = {**common, **log_options, "resources": res, "env": {**envs[name], **log_env}}
        workers[name] = {"cls": _nanny_class(), "options": options}
    if not verbose():
        log.info(f"library logs: {logs} (llmrl run ... -v shows them here)")
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": None}}
    tensor_parallel = rollout_placement(cfg)[0] > 1 and n_rollout > 0
    with ExitStack() as stack:
        stack.enter_context(library_logs(scratch.parent))
        # last on the way out, once the workers are gone: the shared-memory weights their trainer left behind
        # (storage/handoff.py; a trainer process ends with its worker, without a chance to remove them itself)
        stack.callback(sweep_orphans)
        if tensor_parallel:  # vLLM starts a process per GPU: a daemonic Dask worker may not have children
            import dask

            stack.enter_context(dask.config.set({"distributed.worker.daemon": False}))
        stack.enter_context(_fork_from_a_warm_server(cfg, n_rollout))
        cluster = stack.enter_context(SpecCluster(workers=workers, scheduler=scheduler, name="llmrl-grpo"))
        client = stack.enter_context(Client(cluster))
        client.wait_for_workers(len(workers), timeout=120)
        client.register_plugin(BoundedExit())  # the workers end when closed, not 4 s later by the Nanny's kill
        # the Nanny's pre-spawn export is process-wide and the workers start concurrently, so a worker's torch may
        # have sized its pool from another worker's count: each worker now takes the count its own env names
        client.run(_torch_threads_from_env)
        rollout, trainers = place_workers(client.scheduler_info()["workers"], n_rollout, n_trainers)
        yield Placement(client, rollout, trainers[0], trainer_ranks=trainers[1:])
