"""The local cluster's plan for a run, a pure function of the config and the host: which GPUs and CPU threads each
worker gets, and the checks that refuse a plan that cannot work before any worker starts (``llmrl run`` and the
flows call :func:`runtime.memory_check.check_local_placement`; :func:`runtime.cluster.dask_cluster` starts the workers
it plans).

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
(``distributed.nanny.pre-spawn-environ``), which made the in-process CPU engine run single-threaded (80 instead of
135 tokens/s on 2 cores). The local workers get their own counts, in the Nanny's ``env`` and in the environment
they are spawned with (torch sizes its thread pool from it when first imported, which can be before the Nanny's
``env`` is applied: :func:`runtime.cluster._nanny_class`): a CPU rollout worker gets ``rollout.threads`` (0: the flow
host's available cores / ``rollout.workers``), a CPU trainer ``train.threads`` (0: all available cores; the trainer
runs between rollouts). Workers on GPUs keep Dask's 1. Threads that fill every core slow down badly when other work
runs on the same cores (measured: 2 threads on 2 busy cores, 20-70 tokens/s against ~130 with 1): on a shared
machine, or with ``rollout.max_staleness > 0`` (rollouts overlap training), split the cores with
``rollout.threads`` / ``train.threads``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmrl_core.modules.backends.types import EngineConfig
from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.pipeline.offline_config import OfflineConfig
from llmrl_core.pipeline.sft_config import SFTConfig

RunConfig = GRPOConfig | SFTConfig | OfflineConfig  # the configs with ``dask`` and ``train.device`` sections


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


def trainer_ranks(cfg: RunConfig) -> int:
    """How many trainer ranks the run trains with (``train.data_parallel``; 1 for configs without it)."""
    return int(getattr(cfg.train, "data_parallel", 1))


def trainer_names(cfg: RunConfig) -> list[str]:
    """The local trainer workers' names, rank 0 first: ``trainer``, then ``trainer-1`` .. ``trainer-{n-1}``."""
    return ["trainer"] + [f"trainer-{rank}" for rank in range(1, trainer_ranks(cfg))]


def local_worker_resources(cfg: RunConfig, rollout_workers: int | None = None) -> dict[str, dict[str, float]]:
    """Worker name -> Dask resources of the local cluster: the rollout workers, then the trainer ranks."""
    n_rollout = rollout_count(cfg, rollout_workers)
    specs: dict[str, dict[str, float]] = {f"rollout-{i}": {"ROLLOUT": 1} for i in range(n_rollout)}
    for name in trainer_names(cfg):
        specs[name] = {"TRAINER": 1, **({"GPU": 1} if trainer_on_gpu(cfg) else {})}
    return specs


@dataclass
class GpuAssignment:
    """``CUDA_VISIBLE_DEVICES`` per local worker name (absent: left alone; ``""``: no GPU) and log lines."""

    visible: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def rollout_placement(cfg: RunConfig) -> tuple[int, float | None, int]:
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
    tp, utilization, _ = rollout_placement(cfg)
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
    ranks = trainer_names(cfg)
    if trainer_gpu and len(ranks) > 1:
        return _data_parallel_gpus(ranks, ids, n_rollout, tp)
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


def _data_parallel_gpus(ranks: list[str], ids: list[str], n_rollout: int, tp: int) -> GpuAssignment:
    """GPUs for ``train.data_parallel > 1`` on CUDA: every trainer rank and every engine a GPU (block) of its own
    (NCCL refuses two ranks on one device, and a rank's memory plan is a whole trainer's)."""
    need = len(ranks) + n_rollout * tp
    if need > len(ids):
        raise ValueError(
            f"train.data_parallel={len(ranks)} puts each trainer rank on a GPU of its own, beside {n_rollout} "
            f"engine(s) x rollout.tensor_parallel_size={tp}: {need} GPUs needed, this host has {len(ids)}; lower "
            "train.data_parallel or rollout.workers (or train.device=cpu)"
        )
    out = GpuAssignment()
    for rank, name in enumerate(ranks):
        out.visible[name] = ids[rank]
    first = len(ranks)
    for i in range(n_rollout):
        out.visible[f"rollout-{i}"] = ",".join(ids[first + i * tp : first + (i + 1) * tp])
    if need < len(ids):
        out.notes.append(f"GPUs {','.join(ids[need:])} are not used by this run (it needs {need})")
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
    _, _, rollout_threads = rollout_placement(cfg)
    cpu_engines = [f"rollout-{i}" for i in range(n_rollout) if not gpus.visible.get(f"rollout-{i}")]
    cpu_trainer = not gpus.visible.get("trainer")
    overlap = isinstance(cfg, GRPOConfig) and cfg.rollout.max_staleness > 0 and cpu_engines and cpu_trainer
    sharers = len(cpu_engines) + (1 if overlap else 0)
    engine_threads = rollout_threads or max(1, cores // max(1, sharers))
    threads = dict.fromkeys(cpu_engines, engine_threads)
    if cpu_trainer:
        trainer_cores = max(1, cores - engine_threads * len(cpu_engines)) if overlap else cores
        ranks = trainer_names(cfg)  # data-parallel ranks train at once: they split the trainer's cores
        for name in ranks:
            threads[name] = cfg.train.threads or max(1, trainer_cores // len(ranks))
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
    """The local workers' names: ``rollout-0`` .. ``rollout-{n-1}``, then the trainer ranks (:func:`trainer_names`)."""
    return [f"rollout-{i}" for i in range(rollout_count(cfg, rollout_workers))] + trainer_names(cfg)


def visible_gpus() -> list[str]:
    """The CUDA GPUs the flow host sees, as ``CUDA_VISIBLE_DEVICES`` entries for the workers."""
    import torch

    count = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None and listed.strip():
        return [g.strip() for g in listed.split(",") if g.strip()][:count]
    return [str(i) for i in range(count)]
