"""How a published version reaches the rollout engines of a GRPO run (``rollout.weight_sync``).

Every version goes through one sender, TorchRL's ``vLLMUpdater`` (:class:`EngineActorsUpdater`, its subclass for
engines that are Dask actors), by one of these schemes:

* ``checkpoint``: every engine loads the version's checkpoint (a local file, or an object through the checkpoint
  store on a remote ``runs_dir``). Works everywhere; costs a write and a read of the weights per version.
* ``nccl``: one CUDA broadcast from the trainer (rank 0) to every engine worker, over a stateless NCCL group that
  spans the Dask workers (vLLM's ``PyNcclCommunicator``, the same parts as ``vLLMUpdater(mode="nccl")`` uses in
  one process). The checkpoint is still written, so a resume and the lineage are unchanged; only the engines'
  read is replaced. Engines that must sample an *older* version (asynchronous runs, a resume) still load its
  checkpoint (:class:`tasks.rollout_ahead.RolloutAhead`).
* ``gloo``: the same broadcast over a gloo group (:class:`~llmrl_core.weight_sync.process_group.GlooCommunicator`),
  for a CPU trainer and CPU vLLM engines (on other Dask workers or machines): the engines take the tensors from the
  trainer's memory instead of a file. Opt-in (``auto`` keeps the shared-memory file / checkpoint on CPU).
* ``cuda_ipc``: for engines on the trainer's own GPU (the one-GPU machine, where NCCL cannot run): the trainer shares
  a copy of its weights as CUDA IPC handles (``torch.multiprocessing``'s reduction of each tensor) and every engine
  opens them in place on the same GPU and loads them, so no byte leaves the GPU (:class:`CudaIpcWeightSync`). The
  checkpoint is still written, as with ``nccl``. Opt-in (vLLM and Transformers engines) until it has run on a GPU:
  ``auto`` keeps the shared-memory file there.
* ``auto``: by topology (:func:`choose_weight_route`, logged with its reason): ``nccl`` when the trainer and
  every engine run on CUDA on distinct GPUs (one host or several); ``checkpoint`` (the shared-memory file beside
  the trainer, or the checkpoint) on CPU, for mixed CPU/GPU engines, and when an engine shares a GPU with the
  trainer (the one-GPU machine): NCCL refuses two ranks on one device ("Duplicate GPU detected"), so asking for
  ``nccl`` there is refused before any engine starts. Transformers engines join no broadcast group: the
  checkpoint, or ``cuda_ipc`` when asked for and each runs on the trainer's GPU.

The group is opened once per flow run, after the actors are resident: the trainer picks a free port on its own
host (the Dask worker's address, so engines on other machines reach it), each engine joins with rank offset
``1 + the ranks before it`` (an engine brings one rank per GPU of its tensor-parallel group), and the trainer
hosts rank 0. Every step runs as concurrent actor calls (a rendezvous and a broadcast block until all ranks are
in), so the flow sends the engines' calls first and then the trainer's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from llmrl_core.weight_sync.updater import vLLMUpdater
from runtime.actor_calls import wait_calls


def _all_at(loaded: Sequence[Any], version: int, how: str) -> list[int]:
    """The engines' reported versions, checked: all ``version`` (else a ``RuntimeError`` naming ``how``)."""
    versions = [int(v) for v in loaded]
    if any(v != version for v in versions):
        raise RuntimeError(f"engines report versions {versions} after {how} of version {version}")
    return versions


class CheckpointLoads:
    """The checkpoint scheme: every engine reads the version's weights file that the trainer staged (its checkpoint,
    the shared-memory file beside the trainer, or an object of a remote ``runs_dir`` read through the checkpoint
    store on the engine's worker: :meth:`runtime.rollout_actor.RolloutWorker.load`)."""

    name = "checkpoint"
    description = "checkpoint load"

    def __init__(self, engines: Sequence[Any], stage: str = "weight publishing") -> None:
        self.engines = list(engines)
        self.stage = stage

    def push(self, version: int, checkpoint: str | None = None) -> list[int]:
        """Have every engine load ``checkpoint`` as ``version``; returns their versions."""
        if checkpoint is None:
            raise ValueError(f"version {version}: the checkpoint scheme needs the staged weights file")
        loaded = wait_calls([(e, e.load(str(checkpoint), version)) for e in self.engines], self.stage, version)
        return _all_at(loaded, version, "loading the checkpoint")


class BroadcastWeightSync:
    """An open weight group (NCCL on CUDA, gloo on CPU) between the trainer actor and the engine actors; :meth:`push`
    sends a version."""

    def __init__(self, trainer: Any, engines: Sequence[Any], trainer_address: str, kind: str = "nccl") -> None:
        self.trainer = trainer
        self.engines = list(engines)
        self.host = urlsplit(trainer_address).hostname or trainer_address
        self.kind = kind
        self.name = kind
        self.world_size = 0

    @property
    def description(self) -> str:
        """How the weights travel, for the run's log."""
        return f"{'NCCL' if self.kind == 'nccl' else 'gloo'} broadcast ({self.world_size} ranks)"

    def open(self) -> BroadcastWeightSync:
        """Form the group (trainer rank 0, then each engine's ranks); returns self. Every wait names a worker that
        dies or hangs meanwhile (:func:`~runtime.actor_calls.wait_calls`)."""
        stage = "weight group"
        sizes = [int(s) for s in wait_calls([(e, e.weight_group_size()) for e in self.engines], stage)]
        self.world_size = 1 + sum(sizes)
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        (port,) = wait_calls([(self.trainer, self.trainer.weight_group_port())], stage)
        joining = [
            (e, e.join_weight_group(self.host, int(port), offset, self.world_size))
            for e, offset in zip(self.engines, offsets, strict=True)
        ]
        hosting = (self.trainer, self.trainer.open_weight_group(self.host, int(port), self.world_size))
        wait_calls([hosting, *joining], stage)
        return self

    def push(self, version: int, checkpoint: str | None = None) -> list[int]:
        """Broadcast the trainer's current weights into every engine as ``version`` (``checkpoint``, the staged file,
        is not read); returns the engines' versions (all ``version``, else a ``RuntimeError``)."""
        stage = "weight publishing"
        (metadata,) = wait_calls([(self.trainer, self.trainer.weights_metadata())], stage, version)
        receiving = [(e, e.receive_weights(metadata, version)) for e in self.engines]
        sending = (self.trainer, self.trainer.broadcast_weights(metadata))
        how = f"the {'NCCL' if self.kind == 'nccl' else 'gloo'} broadcast"
        return _all_at(wait_calls([sending, *receiving], stage, version)[1:], version, how)


class CudaIpcWeightSync:
    """Engines on the trainer's GPU take each version from the trainer's memory through CUDA IPC handles
    (``rollout.weight_sync=cuda_ipc``): :meth:`push` asks the trainer for handles to a copy of its weights
    (:meth:`runtime.trainer_actor.TrainerWorker.share_weights_cuda`), every engine opens them on the same GPU and loads
    them (:meth:`runtime.rollout_actor.RolloutWorker.load_shared_cuda`), then the trainer lets its copy go."""

    name = "cuda_ipc"

    def __init__(self, trainer: Any, engines: Sequence[Any]) -> None:
        self.trainer = trainer
        self.engines = list(engines)

    @property
    def description(self) -> str:
        """How the weights travel, for the run's log."""
        return f"CUDA IPC ({len(self.engines)} engine(s) on the trainer's GPU)"

    def push(self, version: int, checkpoint: str | None = None) -> list[int]:
        """Hand the trainer's current weights to every engine as ``version`` (``checkpoint`` is not read); returns
        the engines' versions (all ``version``, else a ``RuntimeError``)."""
        stage = "weight publishing"
        (handles,) = wait_calls([(self.trainer, self.trainer.share_weights_cuda())], stage, version)
        try:
            loads = [(engine, engine.load_shared_cuda(handles, version)) for engine in self.engines]
            loaded = wait_calls(loads, stage, version)
        finally:
            wait_calls([(self.trainer, self.trainer.release_shared_cuda())], stage, version)
        return _all_at(loaded, version, "the CUDA IPC hand-over")


class EngineActorsUpdater(vLLMUpdater):
    """TorchRL's :class:`~llmrl_core.weight_sync.updater.vLLMUpdater` for engines that are Dask actors (the flows'
    rollout workers): the one sender of every version the flows publish or load. :meth:`push_version` sets the
    version and calls ``push_weights``; the weights travel by the route's scheme (:class:`CheckpointLoads`,
    :class:`BroadcastWeightSync` for NCCL and gloo, :class:`CudaIpcWeightSync`), and each engine resets its own
    prefix cache when it loads (its in-process updater does)."""

    def __init__(self, engines: Sequence[Any], scheme: Any = None, stage: str = "weight publishing") -> None:
        super().__init__()
        self.engines = list(engines)
        self.scheme = scheme if scheme is not None else CheckpointLoads(engines, stage)
        self.mode = self.scheme.name
        self.loaded: list[int] = []

    @property
    def description(self) -> str:
        """How the weights travel, for the run's log."""
        return str(self.scheme.description)

    def push_version(self, version: int, checkpoint: str) -> list[int]:
        """Carry ``version`` into every engine (``checkpoint``: the weights file the trainer staged for it, which the
        checkpoint scheme loads); returns the engines' versions."""
        self.version = version - 1
        self.push_weights(checkpoint)
        return self.loaded

    def _send(self, weights: Any) -> None:
        self.loaded = self.scheme.push(self.version + 1, weights)


@dataclass(frozen=True)
class Endpoint:
    """Where one side of the weight route runs: its host, device kind and the GPUs it holds (ids as the host names
    them: CUDA UUIDs, or ``CUDA_VISIBLE_DEVICES`` entries)."""

    host: str
    device: str  # "cuda" | "cpu"
    gpus: tuple[str, ...] = ()
    backend: str = "vllm"  # an engine's rollout.backend: only vLLM engines join an NCCL group


@dataclass(frozen=True)
class WeightRoute:
    """The chosen route (``nccl``, ``gloo``, ``cuda_ipc`` or ``checkpoint``) and why."""

    name: str
    reason: str


def choose_weight_route(mode: str, trainer: Endpoint, engines: Sequence[Endpoint]) -> WeightRoute:
    """The route ``rollout.weight_sync`` = ``mode`` takes between ``trainer`` and ``engines`` (see the module
    docstring). ``nccl`` where it cannot work is a ``ValueError`` naming the reason and the setting."""
    if mode not in ("auto", "nccl", "gloo", "cuda_ipc", "checkpoint"):
        raise ValueError(f"rollout.weight_sync must be auto, nccl, gloo, cuda_ipc or checkpoint, got {mode!r}")
    if mode == "checkpoint":
        return WeightRoute("checkpoint", "rollout.weight_sync=checkpoint")
    if not engines:
        return WeightRoute("checkpoint", "no rollout engine")
    if mode == "cuda_ipc":
        return _cuda_ipc_route(trainer, engines)
    others = sorted({e.backend for e in engines if e.backend != "vllm"})
    if others:
        reason = f"rollout.backend={others[0]} engines"
        if mode in ("nccl", "gloo"):
            raise ValueError(
                f"rollout.weight_sync={mode}: {reason} join no broadcast group (NCCL and gloo need vllm); use auto, "
                "cuda_ipc or checkpoint"
            )
        if _off_trainers_gpu(trainer, engines) is None:  # CUDA IPC would do: opt-in until it has run on a GPU
            reason += " load each version from its checkpoint (rollout.weight_sync=cuda_ipc hands it over on the GPU)"
            return WeightRoute("checkpoint", reason)
        return WeightRoute("checkpoint", f"{reason} load each version from its checkpoint (NCCL needs vllm)")
    devices = {e.device for e in engines}
    if mode == "gloo":
        if trainer.device != "cpu" or devices != {"cpu"}:
            where = f"engines on {'/'.join(sorted(devices))}, trainer on {trainer.device}"
            raise ValueError(f"rollout.weight_sync=gloo carries weights between CPU workers only ({where}); use auto")
        return WeightRoute("gloo", "rollout.weight_sync=gloo: one gloo broadcast from the trainer to every CPU engine")
    if trainer.device != "cuda" or devices != {"cuda"}:
        where = f"engines on {'/'.join(sorted(devices))}, trainer on {trainer.device}"
        if mode == "nccl":
            raise ValueError(
                f"rollout.weight_sync=nccl needs the trainer and every engine on CUDA ({where}); use auto or checkpoint"
            )
        return WeightRoute("checkpoint", f"no NCCL without CUDA on every side ({where})")
    shared = sorted({g for e in engines if e.host == trainer.host for g in set(e.gpus) & set(trainer.gpus)})
    if shared:
        reason = (
            f"an engine shares GPU {', '.join(shared)} with the trainer on {trainer.host}: NCCL refuses two "
            "ranks on one device"
        )
        if mode == "nccl":
            raise ValueError(
                f"rollout.weight_sync=nccl: {reason}; use auto or checkpoint (or give the engines other GPUs)"
            )
        return WeightRoute("checkpoint", reason)
    hosts = {trainer.host, *(e.host for e in engines)}
    span = "one host" if len(hosts) == 1 else f"{len(hosts)} hosts"
    return WeightRoute("nccl", f"trainer and engines on distinct GPUs ({span})")


def _off_trainers_gpu(trainer: Endpoint, engines: Sequence[Endpoint]) -> int | None:
    """The index of the first engine that does not run on one GPU the trainer holds on its host (None: all do)."""
    if trainer.device != "cuda":
        return 0
    for i, e in enumerate(engines):
        if e.device != "cuda" or e.host != trainer.host or len(e.gpus) != 1 or e.gpus[0] not in trainer.gpus:
            return i
    return None


def _cuda_ipc_route(trainer: Endpoint, engines: Sequence[Endpoint]) -> WeightRoute:
    """``rollout.weight_sync=cuda_ipc``: every engine on one GPU that the trainer holds, on its host (else a
    ``ValueError`` naming the engine and the setting)."""
    if trainer.device != "cuda" or any(e.device != "cuda" for e in engines):
        where = f"engines on {'/'.join(sorted({e.device for e in engines}))}, trainer on {trainer.device}"
        raise ValueError(f"rollout.weight_sync=cuda_ipc needs the trainer and every engine on CUDA ({where}); use auto")
    off = _off_trainers_gpu(trainer, engines)
    if off is not None:
        e = engines[off]
        raise ValueError(
            f"rollout.weight_sync=cuda_ipc hands the weights over on the trainer's GPU, and engine {off} runs on GPU "
            f"{','.join(e.gpus) or '?'} of {e.host} (the trainer: {','.join(trainer.gpus) or '?'} of "
            f"{trainer.host}); use auto (NCCL between GPUs) or checkpoint"
        )
    gpus = ",".join(sorted({e.gpus[0] for e in engines}))
    return WeightRoute("cuda_ipc", f"rollout.weight_sync=cuda_ipc: the engines run on the trainer's GPU {gpus}")


def endpoint_of(described: dict[str, Any], prefix: str) -> Endpoint:
    """An :class:`Endpoint` from an actor's ``describe()`` (``<prefix>_device``, ``host``, ``gpus``)."""
    device = str(described.get(f"{prefix}_device", "cpu"))
    gpus = tuple(g for g in str(described.get("gpus", "")).split(",") if g)
    backend = str(described.get(f"{prefix}_backend", "vllm"))
    return Endpoint(str(described.get("host", "")), "cuda" if device.startswith("cuda") else "cpu", gpus, backend)


def updater_for(route: WeightRoute, trainer: Any, engines: Sequence[Any], trainer_address: str) -> EngineActorsUpdater:
    """The run's updater on ``route``'s scheme: checkpoint loads, the NCCL or gloo group (opened now), or the CUDA IPC
    hand-over."""
    if not engines or route.name == "checkpoint":
        return EngineActorsUpdater(engines)
    if route.name == "cuda_ipc":
        return EngineActorsUpdater(engines, CudaIpcWeightSync(trainer, engines))
    return EngineActorsUpdater(engines, BroadcastWeightSync(trainer, engines, trainer_address, route.name).open())


def local_route(
    mode: str, visible: dict[str, str], engines: Sequence[str], trainer: str = "trainer", backend: str = "vllm"
) -> WeightRoute:
    """The route ``rollout.weight_sync`` = ``mode`` will take on a local cluster whose workers see the GPUs
    ``visible`` (``CUDA_VISIBLE_DEVICES`` per worker name, as :func:`runtime.placement_plan.gpu_assignment` gives
    them); a ``ValueError`` where the planned GPUs cannot carry it."""

    def endpoint(name: str) -> Endpoint:
        gpus = tuple(g for g in visible.get(name, "").split(",") if g)
        return Endpoint("localhost", "cuda" if gpus else "cpu", gpus, backend)

    return choose_weight_route(mode, endpoint(trainer), [endpoint(e) for e in engines])


def check_local_route(
    mode: str, visible: dict[str, str], engines: Sequence[str], trainer: str = "trainer", backend: str = "vllm"
) -> None:
    """Before a local cluster starts: refuse ``rollout.weight_sync=nccl`` / ``gloo`` / ``cuda_ipc`` where the planned
    GPUs cannot carry it (:func:`local_route`)."""
    if mode in ("nccl", "gloo", "cuda_ipc") and engines:
        local_route(mode, visible, engines, trainer, backend)
