"""``stateless_init_process_group``: an NCCL communicator between a trainer and vLLM workers.

vLLM's ``StatelessProcessGroup`` is a TCP-store rendezvous that does not touch ``torch.distributed``'s global
state, so a trainer (rank 0) and the workers of any number of engines (ranks 1..N) can form a group of their
own next to the groups vLLM already uses; ``PyNcclCommunicator`` then runs NCCL collectives (``broadcast``)
over it. Every rank calls this function with the same address, port and world size and its own rank; the
calls block until all ranks joined.

Same role and arguments as TorchRL's helper of this name. Differences: vLLM is imported lazily (this module
imports on machines without vLLM or CUDA); the device must be a CUDA device (None: ``cuda:0``), a machine
without CUDA gets a clear error up front instead of a communicator that silently disables itself; where the
installed vLLM has ``unpinned_nccl_env`` the communicator is created inside it (as vLLM's own weight-transfer
helper does) so a peer process need not copy the NCCL settings vLLM pins for its workers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

NCCL_NEEDS_CUDA = "NCCL weight sync needs CUDA"


def _cuda_device(device: torch.device | str | int) -> torch.device:
    if isinstance(device, int):
        return torch.device("cuda", device)
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"{NCCL_NEEDS_CUDA}: device must be a CUDA device, got {device}")
    return device


def _nccl_env() -> AbstractContextManager[Any]:
    try:
        from vllm.utils.nccl import unpinned_nccl_env
    except ImportError:
        return nullcontext()
    return unpinned_nccl_env()


def stateless_init_process_group(
    master_address: str | None,
    master_port: int | str | None,
    rank: int,
    world_size: int,
    device: torch.device | str | int | None = None,
) -> Any:
    """Join (rank 0: host) a stateless process group and return a ``PyNcclCommunicator`` on ``device``.

    Args:
        master_address: the host rank 0 listens on (reachable by every rank); None: 127.0.0.1 (one machine).
        master_port: the TCP port of the rendezvous store; None: a free port of this machine (one machine only:
            the other ranks must be told it).
        rank: this process's rank, ``0 <= rank < world_size`` (the trainer is 0 by convention).
        world_size: number of ranks in the group.
        device: this rank's CUDA device (``torch.device``, ``"cuda:1"`` or an index); None: ``cuda:0``.

    Returns:
        vLLM's ``PyNcclCommunicator``: ``comm.broadcast(tensor, src=0, stream=...)`` etc. With
        ``world_size == 1`` vLLM skips creating the NCCL communicator and its collectives are no-ops.

    Raises:
        RuntimeError: no CUDA on this machine (NCCL needs CUDA); ImportError: vLLM is not installed;
        ValueError: bad rank / world size / non-CUDA device.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{NCCL_NEEDS_CUDA}, and CUDA is not available on this machine; use the 'in_process', 'bytes' or "
            "'file' weight sync modes on CPU"
        )
    cuda_device = _cuda_device(0 if device is None else device)
    if master_address is None:
        master_address = "127.0.0.1"
    if master_port is None:
        from llmrl_core.ports import free_port

        master_port = free_port(master_address)
    try:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup
    except ImportError as err:
        raise ImportError(f"stateless_init_process_group needs vLLM with CUDA support ({err})") from err
    group = StatelessProcessGroup.create(host=master_address, port=int(master_port), rank=rank, world_size=world_size)
    with _nccl_env():
        return PyNcclCommunicator(group, device=cuda_device)


class GlooCommunicator:
    """A gloo group between a trainer and CPU engines, with ``PyNcclCommunicator``'s ``broadcast`` call.

    The CPU counterpart of :func:`stateless_init_process_group`: a ``torch.distributed`` TCP store (hosted by rank 0
    on ``master_port``) and a ``ProcessGroupGloo`` built on it directly, so like vLLM's stateless group it leaves
    ``torch.distributed``'s global state alone (an in-process vLLM CPU engine keeps its own). Every rank constructs
    it with the same address, port and world size and its own rank; construction blocks until all ranks joined.
    """

    def __init__(
        self, master_address: str, master_port: int, rank: int, world_size: int, timeout_s: float = 600.0
    ) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        timeout = timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(master_address, int(master_port), world_size, is_master=rank == 0, timeout=timeout)
        self.group = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)
        self.rank, self.world_size = rank, world_size

    def broadcast(self, tensor: torch.Tensor, src: int = 0, stream: Any = None) -> None:
        """Broadcast ``tensor`` (a CPU tensor, in place on the receivers) from rank ``src``; ``stream`` is ignored."""
        self.group.broadcast(tensor, src).wait()


def weight_group(
    master_address: str, master_port: int, rank: int, world_size: int, device: torch.device | str | int
) -> Any:
    """Join the weight group on ``device``'s backend: NCCL (:func:`stateless_init_process_group`) for a CUDA device,
    gloo (:class:`GlooCommunicator`) for the CPU. Either answers ``broadcast(tensor, src=0, stream=...)``."""
    if not isinstance(device, int) and torch.device(device).type == "cpu":
        return GlooCommunicator(master_address, master_port, rank, world_size)
    return stateless_init_process_group(master_address, master_port, rank, world_size, device)


def tensor_metadata(state: Mapping[str, torch.Tensor]) -> list[tuple[str, str, tuple[int, ...]]]:
    """``(name, dtype, shape)`` of every tensor of ``state``, in its order: what the receivers allocate."""
    return [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in state.items()]


def send_weights(group: Any, state: Mapping[str, torch.Tensor], device: torch.device | str) -> int:
    """Broadcast every tensor of ``state`` from rank 0 of ``group`` (in :func:`tensor_metadata`'s order), staged
    on ``device``; returns the number of tensors sent. The one sender of the trainer actor and of
    :class:`~llmrl_core.weight_sync.updater.vLLMUpdater`."""
    on_cuda = torch.device(device).type == "cuda"
    stream = torch.cuda.current_stream() if on_cuda else None
    for tensor in state.values():
        group.broadcast(tensor.detach().to(device).contiguous(), src=0, stream=stream)
    if on_cuda:
        torch.cuda.synchronize()
    return len(state)


def receive_weights(
    group: Any, metadata: Sequence[tuple[str, str, tuple[int, ...]]], device: torch.device | str
) -> list[tuple[str, torch.Tensor]]:
    """The receiving side of :func:`send_weights`: one broadcast per ``(name, dtype, shape)`` into a new tensor on
    ``device``."""
    on_cuda = torch.device(device).type == "cuda"
    stream = torch.cuda.current_stream() if on_cuda else None
    weights = []
    for name, dtype, shape in metadata:
        tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        group.broadcast(tensor, src=0, stream=stream)
        weights.append((name, tensor))
    if on_cuda:
        torch.cuda.synchronize()
    return weights
