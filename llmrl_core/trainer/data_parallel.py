"""Data-parallel train step: the :class:`~llmrl_core.trainer.train_step.Trainer` step over ``world_size`` processes.

Every rank holds a full replica of the model and of the optimizer (plain data parallelism; the parameters are
broadcast from rank 0 once, and identical updates keep the replicas identical). One step:

1. The global batch is split deterministically into one shard per rank (:func:`shard_samples`: greedy balance of
   the tokens the model reads, so ranks finish their forward/backward passes at about the same time). Every
   rank may be given the whole batch and take its own shard, or be given its shard only (``local=True``).
2. Each rank plans its shard's packed micro-batches under the same ``token_budget`` as a single process would
   and counts the objective's ``accumulation_units`` (trained tokens for ``token_mean``, sequences for
   ``prompt_mean``/``sequence_sum``/SFT ``mean``).
3. **Normalisation.** The local unit counts are SUM-all-reduced into the global normaliser ``U``. Each
   micro-batch loss ``L_b`` (a mean over its own ``u_b`` units) is backpropagated with the weight ``u_b / U``,
   the same weight the single-process step gives it. The single-process gradient is
   ``sum_b (u_b / U) grad L_b`` over all micro-batches, which splits into per-rank partial sums, so a
   SUM-all-reduce of the ranks' gradients gives exactly that gradient (up to floating-point summation
   order). Objectives whose loss is a plain sum (``accumulation_units`` is ``None``, e.g. SFT ``sum``) use
   weight 1, and the SUM-all-reduce again gives the global sum. Averaging gradients (what
   ``DistributedDataParallel`` does, dividing by ``world_size``) or averaging the ranks' own batch means
   would instead weight every rank equally whatever its share of the units: wrong for unequal shards.
4. The gradients are all-reduced explicitly, once per step after the last micro-batch, flattened into a few
   buckets per dtype/device. We do this rather than wrap the model in ``DistributedDataParallel`` because
   (a) ranks run different numbers of micro-batches (ragged shards, a rank may even have no sample), while
   DDP expects every rank to run matching backward passes and would need ``no_sync`` bookkeeping; (b) DDP
   averages, which we would have to undo; (c) the objective and the weight export address the bare
   Hugging Face model (``model.config``, parameter names), which a DDP wrapper hides. The cost is no overlap of
   communication with the backward pass, small against the per-step forward/backward of RL batches. A
   parameter left without gradient on every rank stays without one (AdamW skips it, as in one process).
5. Gradient clipping and the AdamW step then run unchanged on every rank (:meth:`Trainer.optimizer_step`): the
   all-reduced gradients and hence the global norm are identical everywhere. Metrics are merged across ranks
   (:class:`~llmrl_core.trainer.train_step.StepTotals`), so every rank reports the global batch's metrics.

With no initialised process group (or a group of one), :class:`DataParallelTrainer` runs the plain
single-process step. Backends: ``gloo`` on CPU, ``nccl`` on CUDA (one GPU per rank).

How a flow would use it (not wired yet; it needs one trainer worker per GPU): every trainer worker calls
:func:`init_process_group` with its rank (``env://`` with ``MASTER_ADDR``/``MASTER_PORT`` of worker 0), builds
its :class:`Trainer` as today and wraps it, ``dp = DataParallelTrainer(trainer)``; each iteration the flow
sends every worker the same batch (or, with :func:`shard_samples`, each worker its shard and ``local=True``)
and calls ``dp.train_step(samples)`` on all of them at once; rank 0 alone pushes weights to the samplers
and writes checkpoints (``trainer.state_dict_for_inference()`` is the same on every rank).
:func:`run_data_parallel` launches such ranks as local processes (tests, a single multi-GPU machine).
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from llmrl_core.ports import free_port
from llmrl_core.trainer.batch import TrainSample
from llmrl_core.trainer.train_step import StepTotals, Trainer

_BUCKET_ELEMENTS = 1 << 24  # gradient elements per all-reduce call (64 MiB of fp32)


def shard_samples(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Split sample indices into ``world_size`` shards of about equal token totals (deterministic).

    Greedy longest-first: each sample (longest first, ties in input order) goes to the shard with the fewest
    tokens so far (ties: the lowest rank). Indices inside a shard are sorted. With fewer samples than ranks,
    some shards are empty.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    shards: list[list[int]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        shards[rank].append(i)
        loads[rank] += lengths[i]
    return [sorted(s) for s in shards]


def _world(group: Any) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _comm_device(group: Any, fallback: torch.device) -> torch.device:
    """Where small control tensors live for collectives: CUDA for nccl, CPU otherwise."""
    return fallback if dist.get_backend(group) == "nccl" else torch.device("cpu")


class DataParallelTrainer:
    """Runs a :class:`Trainer`'s step data-parallel over a ``torch.distributed`` process group.

    See the module docstring for the scheme (shards, unit-count normalisation, SUM-all-reduce of gradients).

    Args:
        trainer: this rank's trainer (same model architecture, objective and config on every rank).
        group: the process group (default: the world group); with none initialised, or one rank, every call is
            the single-process one.
        sync_parameters: broadcast rank 0's trainable parameters to the other ranks now, so that all replicas
            start identical (the optimizer state is fresh on every rank, hence identical too).
    """

    def __init__(self, trainer: Trainer, group: Any = None, sync_parameters: bool = True):
        self.trainer = trainer
        self.group = group
        self.rank, self.world_size = _world(group)
        if self.world_size > 1 and sync_parameters:
            with torch.no_grad():
                for p in trainer.params:
                    dist.broadcast(p.data, src=0 if group is None else dist.get_global_rank(group, 0), group=group)

    @property
    def distributed(self) -> bool:
        """True when steps are spread over more than one rank."""
        return self.world_size > 1

    def local_samples(self, samples: Sequence[TrainSample]) -> list[TrainSample]:
        """This rank's shard of the global batch ``samples`` (:func:`shard_samples` on the sample lengths)."""
        if not self.distributed:
            return list(samples)
        shard = shard_samples([s.length for s in samples], self.world_size)[self.rank]
        return [samples[i] for i in shard]

    def backward(
        self,
        samples: Sequence[TrainSample],
        *,
        local: bool = False,
        zero_gradient_rows: Sequence[TrainSample] = (),
    ) -> dict[str, float]:
        """Gradients of the objective over the global batch, identical on every rank; no optimizer step.

        ``samples`` is the global batch (each rank takes its shard), or with ``local=True`` this rank's shard
        (the shards of all ranks together forming the batch). ``zero_gradient_rows`` (the global batch's rows
        left out, counted in the normaliser: :meth:`Trainer.backward`) are the same on every rank. Returns the
        global batch's metrics.
        """
        if not self.distributed:
            return self.trainer.backward(samples, zero_gradient_rows=zero_gradient_rows)
        return self._run(samples, local=local, with_grad=True, zero_gradient_rows=zero_gradient_rows)

    @torch.no_grad()
    def evaluate(self, samples: Sequence[TrainSample], *, local: bool = False) -> dict[str, float]:
        """The global metrics :meth:`backward` would report, without gradients."""
        if not self.distributed:
            return self.trainer.evaluate(samples)
        return self._run(samples, local=local, with_grad=False)

    def train_step(
        self,
        samples: Sequence[TrainSample],
        *,
        local: bool = False,
        zero_gradient_rows: Sequence[TrainSample] = (),
    ) -> dict[str, float]:
        """One optimizer step on the global batch, on every rank (collective: all ranks must call it)."""
        start = time.perf_counter()
        metrics = self.backward(samples, local=local, zero_gradient_rows=zero_gradient_rows)
        return self.trainer.optimizer_step(metrics, start)

    def _run(
        self,
        samples: Sequence[TrainSample],
        *,
        local: bool,
        with_grad: bool,
        zero_gradient_rows: Sequence[TrainSample] = (),
    ) -> dict[str, float]:
        trainer = self.trainer
        mine = list(samples) if local else self.local_samples(samples)
        batches = trainer.micro_batches(mine) if mine else []
        units = trainer.batch_units(batches)
        device = _comm_device(self.group, trainer.device)
        counts = torch.tensor(
            [sum(u for u in units if u is not None), float(len(mine))], dtype=torch.float64, device=device
        )
        dist.all_reduce(counts, group=self.group)
        total_units, total_samples = (float(x) for x in counts.cpu())
        total_units += trainer.unit_count(zero_gradient_rows)  # the same rows on every rank: added once
        if total_samples == 0:
            raise ValueError("train_step needs at least one sample (every rank's shard is empty)")
        totals = trainer.accumulate(batches, units, with_grad=with_grad, total_units=total_units)
        if with_grad:
            self.all_reduce_gradients()
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, totals, group=self.group)
        return StepTotals.merge(parts).metrics()

    def all_reduce_gradients(self) -> None:
        """SUM-all-reduce the trainable parameters' gradients (in place, flattened into buckets).

        A parameter with no gradient on some rank counts as a zero gradient there; one with no gradient on any
        rank keeps ``grad = None``.
        """
        params = self.trainer.params
        device = _comm_device(self.group, self.trainer.device)
        has_grad = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
        dist.all_reduce(has_grad, group=self.group)
        reduced = []
        for p, flag in zip(params, has_grad.tolist(), strict=True):
            if flag:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                reduced.append(p.grad)
        for bucket in _buckets(reduced):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat, group=self.group)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()


def _buckets(grads: Sequence[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """Gradients grouped by (device, dtype), in parameter order, about ``_BUCKET_ELEMENTS`` per bucket."""
    by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        by_kind.setdefault((g.device, g.dtype), []).append(g)
    for same in by_kind.values():
        bucket: list[torch.Tensor] = []
        size = 0
        for g in same:
            if bucket and size + g.numel() > _BUCKET_ELEMENTS:
                yield bucket
                bucket, size = [], 0
            bucket.append(g)
            size += g.numel()
        if bucket:
            yield bucket


# ------------------------------------------------------------------------------------------------ launching


def _loopback_interface() -> str | None:
    for _, name in socket.if_nameindex():
        if name.startswith("lo"):
            return name
    return None


def default_backend() -> str:
    """``nccl`` when CUDA (and NCCL) is available, else ``gloo``."""
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def init_process_group(
    rank: int,
    world_size: int,
    backend: str | None = None,
    timeout_s: float = 600.0,
    init_method: str = "env://",
) -> None:
    """Join the default process group through ``init_method``: ``env://`` (``MASTER_ADDR``/``MASTER_PORT`` set by
    the caller) or ``tcp://host:port`` (rank 0's host and a port free there; the flows' trainer ranks on Dask workers,
    whose environment is shared by everything on the worker).

    With ``nccl``, selects CUDA device ``rank % device_count`` first (the default device of this rank's model).
    """
    backend = backend or default_backend()
    device_id = None
    if backend == "nccl":
        device_id = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device_id)
    dist.init_process_group(
        backend=backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device_id,
    )


def _rank_main(
    rank: int,
    fn: Callable[..., Any],
    args: tuple,
    world_size: int,
    backend: str,
    port: int,
    results: str,
    timeout_s: float,
) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
        loopback = _loopback_interface()  # keep gloo's peer connections on loopback, whatever the host name is
        if loopback:
            os.environ["GLOO_SOCKET_IFNAME"] = loopback
    init_process_group(rank, world_size, backend, timeout_s)
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, Path(results) / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_data_parallel(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    backend: str | None = None,
    timeout_s: float = 600.0,
    start_method: str = "spawn",
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes joined in one process group.

    The processes are started with ``spawn`` (``fn`` and ``args`` must be picklable: a module-level function),
    rendezvous on a free port of 127.0.0.1 (gloo's connections stay on the loopback interface) and use
    ``backend`` (default :func:`default_backend`). Returns the ranks' return values in rank order (passed
    back with ``torch.save``, so tensors are fine); an exception in any rank is raised here.

    ``start_method="forkserver"`` imports ``fn``'s module once in the fork server, and the ranks are forked
    from it with their imports done (much faster start-up than ``spawn`` when that module imports
    transformers); the server never runs torch compute, so the forks are safe, unlike plain ``fork``.
    """
    import multiprocessing

    import torch.multiprocessing as mp

    if start_method not in ("spawn", "forkserver"):
        raise ValueError(f"start_method must be 'spawn' or 'forkserver', got {start_method!r}")
    if start_method == "forkserver" and fn.__module__ != "__main__":
        multiprocessing.get_context("forkserver").set_forkserver_preload([fn.__module__])
    backend = backend or default_backend()
    with tempfile.TemporaryDirectory(prefix="llmrl-dp-") as results:
        port = free_port()
        mp.start_processes(
            _rank_main,
            args=(fn, args, world_size, backend, port, results, timeout_s),
            nprocs=world_size,
            join=True,
            start_method=start_method,
        )
        return [torch.load(Path(results) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
