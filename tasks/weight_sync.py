"""How a published version reaches the rollout engines of a GRPO run (``rollout.weight_sync``).

* ``checkpoint``: every engine loads the version's checkpoint (a local file, or an object through the checkpoint
  store on a remote ``runs_dir``). Works everywhere; costs a write and a read of the weights per version.
* ``nccl``: one CUDA broadcast from the trainer (rank 0) to every engine worker, over a stateless NCCL group that
  spans the Dask workers (vLLM's ``PyNcclCommunicator``, the same parts as ``vLLMUpdater(mode="nccl")`` uses in
  one process). The checkpoint is still written, so a resume and the lineage are unchanged; only the engines'
  read is replaced. Engines that must sample an *older* version (asynchronous runs, a resume) still load its
  checkpoint (:class:`tasks.rollout_ahead.RolloutAhead`).
* ``auto``: ``nccl`` when the trainer and every engine run on CUDA, else ``checkpoint``.

The group is opened once per flow run, after the actors are resident: the trainer picks a free port on its own
host (the Dask worker's address, so engines on other machines reach it), each engine joins with rank offset
``1 + the ranks before it`` (an engine brings one rank per GPU of its tensor-parallel group), and the trainer
hosts rank 0. Every step runs as concurrent actor calls (a rendezvous and a broadcast block until all ranks are
in), so the flow sends the engines' calls first and then the trainer's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from llmrl_core.pipeline.grpo_config import GRPOConfig


class NcclWeightSync:
    """An open NCCL weight group between the trainer actor and the engine actors; :meth:`push` sends a version."""

    def __init__(self, trainer: Any, engines: Sequence[Any], trainer_address: str) -> None:
        self.trainer = trainer
        self.engines = list(engines)
        self.host = urlsplit(trainer_address).hostname or trainer_address
        self.world_size = 0

    def open(self) -> NcclWeightSync:
        """Form the group (trainer rank 0, then each engine's ranks); returns self."""
        sizes = [int(f.result()) for f in [e.weight_group_size() for e in self.engines]]
        self.world_size = 1 + sum(sizes)
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        port = int(self.trainer.weight_group_port().result())
        joining = [
            e.join_weight_group(self.host, port, offset, self.world_size)
            for e, offset in zip(self.engines, offsets, strict=True)
        ]
        self.trainer.open_weight_group(self.host, port, self.world_size).result()
        for future in joining:
            future.result()
        return self

    def push(self, version: int) -> list[int]:
        """Broadcast the trainer's current weights into every engine as ``version``; returns the engines'
        versions (all ``version``, else a ``RuntimeError``)."""
        metadata = self.trainer.weights_metadata().result()
        receiving = [e.receive_weights(metadata, version) for e in self.engines]
        self.trainer.broadcast_weights(metadata).result()
        loaded = [int(f.result()) for f in receiving]
        if any(v != version for v in loaded):
            raise RuntimeError(f"engines report versions {loaded} after the NCCL broadcast of version {version}")
        return loaded


def weight_sync_for(
    cfg: GRPOConfig, hardware: dict[str, str], trainer: Any, engines: Sequence[Any], trainer_address: str
) -> NcclWeightSync | None:
    """The NCCL group the run's settings and devices call for (opened), or None for checkpoint loads.

    ``hardware``: the engines' and the trainer's ``describe()`` (``rollout_device``, ``trainer_device``).
    ``rollout.weight_sync: nccl`` where the trainer or the engines are not on CUDA is a ``ValueError`` naming it.
    """
    mode = cfg.rollout.weight_sync
    on_cuda = hardware.get("rollout_device") == "cuda" and str(hardware.get("trainer_device", "")).startswith("cuda")
    if mode == "nccl" and not on_cuda:
        raise ValueError(
            "rollout.weight_sync=nccl needs the trainer and every engine on CUDA (engines on "
            f"{hardware.get('rollout_device')}, trainer on {hardware.get('trainer_device')}); use auto or checkpoint"
        )
    if mode == "checkpoint" or not engines or not on_cuda:
        return None
    return NcclWeightSync(trainer, engines, trainer_address).open()
