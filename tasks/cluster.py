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

GPUs of the local cluster (:func:`gpu_assignment`, a pure function of the config and the GPUs the flow
host sees): each worker gets its own ``CUDA_VISIBLE_DEVICES``, set through the Nanny's ``env`` so it is in
the worker process's environment before anything in it starts CUDA.

* The trainer (when it runs on CUDA) gets one GPU of its own and each rollout engine
  ``rollout.tensor_parallel_size`` GPUs of its own: trainer ``0``, engine ``i`` the next block
  (3 engines at tp 2 on 8 GPUs: trainer 0, engines 1,2 / 3,4 / 5,6; GPU 7 unused).
* Fewer GPUs than that: GPUs are **shared**, with one log line per shared GPU. The engines go round-robin
  over blocks of ``tensor_parallel_size`` GPUs (an engine's shards are always distinct GPUs), either of all
  GPUs or of all but the trainer's GPU 0: whichever puts fewer engines on one GPU, the trainer keeping a
  GPU of its own at a tie (2 engines, 2 GPUs: one engine per GPU, the trainer with engine 0). A trainer
  without a GPU of its own goes to the least-loaded one (one GPU: everything on GPU 0, as before). vLLM reserves
  ``rollout.gpu_memory_utilization`` of a GPU's memory per engine (unset: the engine default 0.4), so the
  engines sharing a GPU must add up to at most 1 (else a ``ValueError`` names the setting; leave room for
  a trainer there too).
* ``rollout.tensor_parallel_size`` above the number of GPUs is a ``ValueError``, as is any value above 1
  without GPUs (CPU engines run in-process: scale them with ``rollout.workers``). Tensor parallelism
  makes vLLM start a worker process per GPU, so the local workers are then started non-daemonic
  (``distributed.worker.daemon: False``; daemonic processes may not have children).
* No GPUs: ``CUDA_VISIBLE_DEVICES`` is left alone. A CPU trainer (``train.device: cpu``) on a GPU host is
  given none (``""``).

CPU threads: Dask starts every worker with ``OMP_NUM_THREADS=MKL_NUM_THREADS=OPENBLAS_NUM_THREADS=1``
(``distributed.nanny.pre-spawn-environ``), which made the in-process CPU engine run single-threaded (80
instead of 135 tokens/s on 2 cores). The local workers get their own counts, in the Nanny's ``env`` and in
the environment they are spawned with (torch sizes its thread pool from it when first imported, which can be
before the Nanny's ``env`` is applied: :func:`_nanny_class`): a CPU rollout worker gets ``rollout.threads``
(0: the flow host's available cores / ``rollout.workers``), a CPU trainer ``train.threads`` (0: all available
cores; the trainer runs between rollouts). Workers on GPUs keep Dask's 1. Threads that fill every core slow
down badly when other work runs on the same cores (measured: 2 threads on 2 busy cores, 20-70 tokens/s against
~130 with 1): on a shared machine, or with ``rollout.max_staleness > 0`` (rollouts overlap training), split the
cores with ``rollout.threads`` / ``train.threads``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.pipeline.offline_config import OfflineConfig
from llmrl_core.pipeline.sft_config import SFTConfig
from llmrl_core.policies.vllm_engine import EngineConfig
from storage.handoff import sweep_orphans

RunConfig = GRPOConfig | SFTConfig | OfflineConfig  # the configs with ``dask`` and ``train.device`` sections


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
        (:func:`~llmrl_core.policies.vllm_engine.shutdown_llm`), so a joined cluster's rollout worker grew by
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


def place_workers(workers: dict[str, dict], n_rollout: int) -> tuple[list[str], str]:
    """Choose rollout and trainer workers from ``scheduler_info()["workers"]`` by their declared resources."""
    if n_rollout == 0:
        return [], trainer_worker(workers)
    addresses = sorted(workers)
    if len(addresses) < 2:
        raise RuntimeError(f"need at least 2 Dask workers (rollout + trainer), found {len(addresses)}")
    trainers = [a for a in addresses if {"GPU", "TRAINER"} & set(workers[a].get("resources", {}))]
    rollout = [a for a in addresses if "ROLLOUT" in workers[a].get("resources", {}) and a not in trainers[:1]]
    if not trainers or not rollout:
        raise RuntimeError(
            "the Dask workers must declare resources: ROLLOUT for engine workers and TRAINER or GPU for the "
            f"trainer; found {[(a, workers[a].get('resources', {})) for a in addresses]}"
        )
    return rollout[:n_rollout], trainers[0]


def wait_for_placement(client: Any, n_rollout: int, timeout_s: float, poll_s: float = 2.0) -> tuple[list[str], str]:
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
            rollout, trainer = place_workers(workers, n_rollout)
            if len(rollout) >= n_rollout:
                return rollout, trainer
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


def trainer_on_gpu(cfg: RunConfig) -> bool:
    """Whether the trainer will run on CUDA (``train.device`` cuda, or auto with a visible GPU)."""
    if cfg.train.device == "cuda":
        return True
    if cfg.train.device != "auto":
        return False
    import torch

    return torch.cuda.is_available()


def rollout_count(cfg: RunConfig, rollout_workers: int | None) -> int:
    """How many rollout workers the run uses: ``rollout_workers`` when given, else ``cfg.rollout.workers``."""
    if rollout_workers is not None:
        return rollout_workers
    if not isinstance(cfg, GRPOConfig):
        raise TypeError(f"{type(cfg).__name__} has no rollout section: pass rollout_workers (0 for a trainer only)")
    return cfg.rollout.workers


def local_worker_resources(cfg: RunConfig, rollout_workers: int | None = None) -> dict[str, dict[str, float]]:
    """Worker name -> Dask resources of the local cluster: the rollout workers, then the trainer."""
    n_rollout = rollout_count(cfg, rollout_workers)
    specs: dict[str, dict[str, float]] = {f"rollout-{i}": {"ROLLOUT": 1} for i in range(n_rollout)}
    specs["trainer"] = {"TRAINER": 1, **({"GPU": 1} if trainer_on_gpu(cfg) else {})}
    return specs


@dataclass
class GpuAssignment:
    """``CUDA_VISIBLE_DEVICES`` per local worker name (absent: left alone; ``""``: no GPU) and log lines."""

    visible: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _rollout_placement(cfg: RunConfig) -> tuple[int, float | None, int]:
    """``(tensor_parallel_size, gpu_memory_utilization, threads)`` of the rollout engines (defaults without a
    rollout section)."""
    if isinstance(cfg, GRPOConfig):
        r = cfg.rollout
        return r.tensor_parallel_size, r.gpu_memory_utilization, r.threads
    return 1, None, 0


def gpu_assignment(cfg: RunConfig, gpus: int | Sequence[str], rollout_workers: int | None = None) -> GpuAssignment:
    """Which GPUs each local worker sees (the rules are in the module docstring).

    ``gpus``: the GPUs the flow host sees, as a count (ids ``0..n-1``) or as ``CUDA_VISIBLE_DEVICES`` entries
    (the host's own list, so a host restricted to GPUs ``2,3`` hands out ``2`` and ``3``). Workers are named as
    in :func:`local_worker_resources`. Pure: no CUDA call, no environment read.
    """
    ids = [str(i) for i in range(gpus)] if isinstance(gpus, int) else [str(g) for g in gpus]
    n_rollout = rollout_count(cfg, rollout_workers)
    tp, utilization, _ = _rollout_placement(cfg)
    sleep_level = cfg.rollout.sleep_level if isinstance(cfg, GRPOConfig) else 0
    if not ids:
        if sleep_level and n_rollout:
            raise ValueError(
                f"rollout.sleep_level={sleep_level} lets a CUDA engine give its GPU memory to the trainer, and this "
                "host has no GPU (CPU engines have no sleep mode): set rollout.sleep_level=0"
            )
        if tp > 1 and n_rollout:
            raise ValueError(
                f"rollout.tensor_parallel_size={tp} needs {tp} CUDA GPUs per engine and this host has none: CPU "
                "engines run in-process (set rollout.tensor_parallel_size=1 and scale with rollout.workers)"
            )
        return GpuAssignment()
    if tp > len(ids) and n_rollout:
        raise ValueError(
            f"rollout.tensor_parallel_size={tp} needs {tp} distinct GPUs per engine and this host has {len(ids)} "
            f"({','.join(ids)}); lower rollout.tensor_parallel_size"
        )
    trainer_gpu = cfg.train.device in ("cuda", "auto")  # auto: on CUDA, since this host has GPUs
    out = GpuAssignment()
    need = int(trainer_gpu) + n_rollout * tp
    if need <= len(ids):  # dedicated: trainer first, then one block per engine
        first = int(trainer_gpu)
        engines = [ids[first + i * tp : first + (i + 1) * tp] for i in range(n_rollout)]
        trainer = ids[:1] if trainer_gpu else []
        if need < len(ids):
            out.notes.append(f"GPUs {','.join(ids[need:])} are not used by this run (it needs {need})")
    else:  # shared: the layout with the fewest engines on one GPU; at a tie the trainer keeps a GPU of its own

        def engines_on(gpus: list[str]) -> list[list[str]]:
            pool = [gpus[i : i + tp] for i in range(0, len(gpus) - tp + 1, tp)]
            return [pool[i % len(pool)] for i in range(n_rollout)]

        layouts = [engines_on(ids[1:])] if trainer_gpu and len(ids) - 1 >= tp else []  # trainer alone on ids[0]
        layouts.append(engines_on(ids))
        engines = min(layouts, key=lambda lay: max((sum(g in b for b in lay) for g in ids), default=0))
        own = trainer_gpu and engines is layouts[0] and len(layouts) == 2
        load = {g: sum(g in block for block in engines) for g in ids}
        trainer = ids[:1] if own else ([min(ids, key=lambda g: load[g])] if trainer_gpu else [])
    for i, block in enumerate(engines):
        out.visible[f"rollout-{i}"] = ",".join(block)
    out.visible["trainer"] = ",".join(trainer)  # "" for a CPU trainer: it starts no CUDA context
    fraction = utilization if utilization is not None else EngineConfig.gpu_memory_utilization
    for gpu in ids:
        users = [name for name, block in out.visible.items() if gpu in block.split(",")]
        engines_here = [u for u in users if u.startswith("rollout-")]
        if len(users) < 2:
            continue
        if getattr(getattr(cfg, "rollout", None), "backend", "vllm") == "transformers":  # no reservation up front
            out.notes.append(
                f"GPU {gpu} is shared by {', '.join(users)} ({len(ids)} GPUs for {need} needed): the transformers "
                "engines hold their weights and each batch's KV cache, nothing reserved (llmrl plan: what fits)"
            )
            continue
        total = fraction * len(engines_here)
        setting = "rollout.gpu_memory_utilization" + ("" if utilization is not None else " (unset: engine default)")
        sleeping = sleep_level and "trainer" in users
        out.notes.append(
            f"GPU {gpu} is shared by {', '.join(users)} ({len(ids)} GPUs for {need} needed): "
            f"{len(engines_here)} engine(s) x {setting} {fraction:g} = {total:g} of its memory"
            + (f"; the engines sleep while the trainer trains (rollout.sleep_level={sleep_level})" if sleeping else "")
        )
        if total > 1 + 1e-9:
            raise ValueError(
                f"rollout.gpu_memory_utilization={fraction:g} x {len(engines_here)} engines sharing GPU {gpu} exceeds "
                f"its memory; set rollout.gpu_memory_utilization <= {int(100 / len(engines_here)) / 100:g} "
                f"(less to leave room for the trainer), or use fewer rollout.workers"
            )
    trainer_gpus = set(filter(None, out.visible.get("trainer", "").split(",")))
    beside = [n for n, block in out.visible.items() if n != "trainer" and trainer_gpus & set(block.split(","))]
    if sleep_level and n_rollout and not beside:
        out.notes.append(
            f"rollout.sleep_level={sleep_level}: no engine shares a GPU with the trainer, so sleeping only adds a "
            "wake to every version (set rollout.sleep_level=0)"
        )
    return out


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def worker_threads(
    cfg: RunConfig, gpus: GpuAssignment, cores: int, rollout_workers: int | None = None
) -> dict[str, int]:
    """CPU threads per local worker that runs on CPU (workers with a GPU are absent: they keep Dask's 1).

    Unset counts (0) default to the cores split among the CPU engines, and all cores for the trainer, which runs
    between rollouts. In an asynchronous run (``rollout.max_staleness > 0``) rollouts overlap training, so the
    cores are split among the CPU engines and a CPU trainer instead (measured on 2 cores, 2 engines: x0.88 of
    the synchronous throughput with the trainer on both cores, x1.31 with one thread each; bench/README.md)."""
    n_rollout = rollout_count(cfg, rollout_workers)
    _, _, rollout_threads = _rollout_placement(cfg)
    cpu_engines = [f"rollout-{i}" for i in range(n_rollout) if not gpus.visible.get(f"rollout-{i}")]
    cpu_trainer = not gpus.visible.get("trainer")
    overlap = isinstance(cfg, GRPOConfig) and cfg.rollout.max_staleness > 0 and cpu_engines and cpu_trainer
    sharers = len(cpu_engines) + (1 if overlap else 0)
    engine_threads = rollout_threads or max(1, cores // max(1, sharers))
    threads = dict.fromkeys(cpu_engines, engine_threads)
    if cpu_trainer:
        threads["trainer"] = cfg.train.threads or (
            max(1, cores - engine_threads * len(cpu_engines)) if overlap else cores
        )
    return threads


def worker_environments(
    cfg: RunConfig, gpus: int | Sequence[str], cores: int, rollout_workers: int | None = None
) -> tuple[dict[str, dict[str, str]], GpuAssignment]:
    """The Nanny ``env`` of every local worker (GPU ids and CPU threads) and the GPU assignment behind it."""
    assignment = gpu_assignment(cfg, gpus, rollout_workers)
    names = local_worker_names(cfg, rollout_workers)
    threads = worker_threads(cfg, assignment, cores, rollout_workers)
    envs: dict[str, dict[str, str]] = {name: {} for name in names}
    for name, visible in assignment.visible.items():
        envs[name]["CUDA_VISIBLE_DEVICES"] = visible
    for name, count in threads.items():
        envs[name].update(dict.fromkeys(THREAD_VARIABLES, str(count)))
    return envs, assignment


def local_worker_names(cfg: RunConfig, rollout_workers: int | None = None) -> list[str]:
    """The local workers' names: ``rollout-0`` .. ``rollout-{n-1}``, then ``trainer``."""
    return [f"rollout-{i}" for i in range(rollout_count(cfg, rollout_workers))] + ["trainer"]


def visible_gpus() -> list[str]:
    """The CUDA GPUs the flow host sees, as ``CUDA_VISIBLE_DEVICES`` entries for the workers."""
    import torch

    count = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None and listed.strip():
        return [g.strip() for g in listed.split(",") if g.strip()][:count]
    return [str(i) for i in range(count)]


_NANNY: type | None = None


def _nanny_class() -> type:
    """A ``Nanny`` whose worker process is spawned with the thread variables of its ``env`` already set.

    The Nanny applies ``env`` inside the new process, before the worker starts, and that is early enough for
    ``CUDA_VISIBLE_DEVICES`` (read when CUDA starts). Not for the thread counts: a worker process imports the
    flow's ``__main__`` module first, and torch imported there sizes its thread pool from the environment the
    process was spawned with (Dask's ``OMP_NUM_THREADS=1``). So the thread variables also go into the
    Nanny's ``pre_spawn_env``, which it exports in this process right before each spawn (Dask does the same
    with its own ``pre-spawn-environ``; the flow host's torch already has its threads).
    """
    global _NANNY
    if _NANNY is None:
        from distributed import Nanny

        class ThreadsNanny(Nanny):
            def __init__(self, *args: Any, env: dict[str, str] | None = None, **kwargs: Any) -> None:
                super().__init__(*args, env=env, **kwargs)
                self.pre_spawn_env.update({k: v for k, v in (env or {}).items() if k in THREAD_VARIABLES})

        _NANNY = ThreadsNanny
    return _NANNY


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


def check_local_placement(
    cfg: RunConfig, rollout_workers: int | None = None, warn: bool = True
) -> tuple[dict[str, dict[str, str]], GpuAssignment]:
    """The local cluster's plan for ``cfg`` (each worker's environment and GPUs), refused with a ``ValueError`` naming
    the setting where it cannot work: GPUs and threads (:func:`gpu_assignment`), and for a GRPO run the weight
    route and the memory plan. ``llmrl run`` calls it before anything starts (a one-line error); the flow again
    before its workers start. ``warn``: log the memory plan's warnings (the flow does; the CLI's early check not)."""
    from tasks.memory_check import check_run_memory
    from tasks.weight_sync import check_local_route

    envs, gpus = worker_environments(cfg, visible_gpus(), available_cores(), rollout_count(cfg, rollout_workers))
    if isinstance(cfg, GRPOConfig):  # a weight route or a memory plan that cannot work: refused before any worker
        check_local_route(cfg.rollout.weight_sync, gpus.visible, [n for n in envs if n != "trainer"])
        check_run_memory(cfg, warn=warn)
    return envs, gpus


@contextmanager
def dask_cluster(cfg: RunConfig, scratch: Path, rollout_workers: int | None = None) -> Iterator[Placement]:
    """Open the cluster for one flow run and close what this function started when it ends.

    ``rollout_workers``: how many engine workers (default ``cfg.rollout.workers``; 0: the trainer alone).
    """
    from dask.distributed import Client, Scheduler, SpecCluster

    from tasks.console import library_logs, logs_dir, verbose, worker_log_options
    from tasks.worker_exit import BoundedExit

    n_rollout = rollout_count(cfg, rollout_workers)
    if cfg.dask.address:
        with Client(cfg.dask.address) as client:
            rollout, trainer = wait_for_placement(client, n_rollout, cfg.dask.join_wait_s)
            place = Placement(client, rollout, trainer)
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
    tensor_parallel = _rollout_placement(cfg)[0] > 1 and n_rollout > 0
    with ExitStack() as stack:
        stack.enter_context(library_logs(scratch.parent))
        # last on the way out, once the workers are gone: the shared-memory weights their trainer left behind
        # (storage/handoff.py; a trainer process ends with its worker, without a chance to remove them itself)
        stack.callback(sweep_orphans)
        if tensor_parallel:  # vLLM starts a process per GPU: a daemonic Dask worker may not have children
            import dask

            stack.enter_context(dask.config.set({"distributed.worker.daemon": False}))
        cluster = stack.enter_context(SpecCluster(workers=workers, scheduler=scheduler, name="llmrl-grpo"))
        client = stack.enter_context(Client(cluster))
        client.wait_for_workers(len(workers), timeout=120)
        client.register_plugin(BoundedExit())  # the workers end when closed, not 4 s later by the Nanny's kill
        rollout, trainer = place_workers(client.scheduler_info()["workers"], n_rollout)
        yield Placement(client, rollout, trainer)
