"""The trainer actor's side of the weight syncs that bypass the checkpoint files (:mod:`runtime.weight_sync` drives
both sides): the weight group it hosts as rank 0 for a broadcast to the engines (NCCL or gloo), and the CUDA IPC
handles it shares with engines on its own GPU (:class:`TrainerWeightSync`, a part of
:class:`~runtime.trainer_actor.TrainerWorker`)."""

from __future__ import annotations

from typing import Any

import torch


class TrainerWeightSync:
    """Weight group and CUDA IPC calls of the trainer actor, on the attributes
    :class:`~runtime.trainer_actor.TrainerWorker` sets: ``trainer`` and ``model``."""

    # --- weight group (trainer = rank 0; runtime/weight_sync.py drives both sides) ---------------------
    def weight_group_port(self) -> int:
        """A TCP port free on this worker's host, for the weight group's rendezvous."""
        from llmrl_core.ports import free_port

        return free_port("")

    def open_weight_group(self, master_address: str, master_port: int, world_size: int) -> None:
        """Host the weight group as rank 0 on the trainer's device, NCCL on a GPU and gloo on the CPU (blocks until
        every engine rank joined)."""
        from llmrl_core.weight_sync.process_group import weight_group

        self._weight_group = weight_group(master_address, master_port, 0, world_size, self.trainer.device)

    def _weights_to_send(self) -> dict[str, torch.Tensor]:
        """The inference weights, with the output head spelled out for a tied model (vLLM keeps its own copy)."""
        from llmrl_core.weight_sync.updater import spell_out_tied_names

        state = self.trainer.state_dict_for_inference()
        spell_out_tied_names(state, bool(getattr(self.model.config, "tie_word_embeddings", False)))
        return state

    def share_weights_cuda(self) -> dict[str, tuple[Any, tuple]]:
        """CUDA IPC handles of a copy of the current inference weights (``torch.multiprocessing``'s reduction of each
        tensor: a rebuild function and its arguments, picklable), for engines on this worker's GPU
        (``rollout.weight_sync=cuda_ipc``, :class:`runtime.weight_sync.CudaIpcWeightSync`). The copy is held until
        :meth:`release_shared_cuda`: the engines read it in place."""
        from torch.multiprocessing.reductions import reduce_tensor

        state = self._weights_to_send()
        on_host = sorted(name for name, t in state.items() if not t.is_cuda)
        if on_host:
            raise RuntimeError(
                f"rollout.weight_sync=cuda_ipc needs the trainer's weights on CUDA; {on_host[0]} is on "
                f"{state[on_host[0]].device}"
            )
        self._ipc_copy = state
        return {name: reduce_tensor(t) for name, t in state.items()}

    def release_shared_cuda(self) -> None:
        """Let go of the copy :meth:`share_weights_cuda` shared (the engines have loaded it)."""
        self._ipc_copy = None

    def weights_metadata(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """``(name, dtype, shape)`` of every tensor :meth:`broadcast_weights` sends, in its order."""
        from llmrl_core.weight_sync.process_group import tensor_metadata

        return tensor_metadata(self._weights_to_send())

    def broadcast_weights(self, metadata: list[tuple[str, str, tuple[int, ...]]]) -> int:
        """Broadcast the current weights to the group, in the order of ``metadata`` (what the engines expect);
        returns the number of tensors sent."""
        group = getattr(self, "_weight_group", None)
        if group is None:
            raise RuntimeError("broadcast_weights called before open_weight_group")
        from llmrl_core.weight_sync.process_group import send_weights

        state = self._weights_to_send()
        if [m[0] for m in metadata] != list(state):
            raise RuntimeError("the engines expect other tensors than the trainer holds (weights_metadata is stale)")
        return send_weights(group, state, self.trainer.device)
