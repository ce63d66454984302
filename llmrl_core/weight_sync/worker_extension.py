"""Methods mixed into vLLM's worker class (``worker_extension_cls``) so weights can arrive from outside.

vLLM calls ``collective_rpc(name, args=...)`` on every worker of an engine; with this extension the
worker understands three more names:

* ``llmrl_reload_from_bytes(data)``: safetensors bytes (works across processes, where tensors in rpc
  arguments do not survive);
* ``llmrl_reload_from_file(path)``: a safetensors file on storage every worker can read;
* ``llmrl_init_nccl_group(...)`` / ``llmrl_receive_nccl(...)``: join a trainer's NCCL group and receive
  broadcast tensors (CUDA only).

All paths end in the model runner's ``reload_weights``, which re-packs weights for the device (a plain
``load_weights`` fails on CPU, where weights are repacked at load).
"""

from __future__ import annotations

from typing import Any

WEIGHT_SYNC_EXTENSION = "llmrl_core.weight_sync.worker_extension.WeightSyncExtension"


class WeightSyncExtension:
    """vLLM worker extension: weight reloads from bytes, files or an NCCL broadcast."""

    model_runner: Any  # provided by the vLLM worker this class is mixed into
    device: Any

    def _llmrl_reload(self, weights: list[tuple[str, Any]]) -> int:
        self.model_runner.reload_weights(weights_iterator=weights)
        return len(weights)

    def llmrl_reload_from_bytes(self, data: bytes) -> int:
        """Load a safetensors payload; returns the number of tensors loaded."""
        from llmrl_core.weight_sync.serialization import state_dict_from_bytes

        return self._llmrl_reload(list(state_dict_from_bytes(data).items()))

    def llmrl_reload_from_file(self, path: str) -> int:
        """Load a safetensors file; returns the number of tensors loaded."""
        from safetensors.torch import load_file

        return self._llmrl_reload(list(load_file(path).items()))

    def llmrl_init_nccl_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int) -> None:
        """Join the trainer's NCCL group (the trainer is rank 0) through vLLM's stateless process group."""
        from vllm.distributed.parallel_state import get_world_group

        from llmrl_core.weight_sync.process_group import stateless_init_process_group

        rank = get_world_group().rank + rank_offset
        self._llmrl_nccl = stateless_init_process_group(master_address, master_port, rank, world_size, self.device)

    def llmrl_receive_nccl(self, metadata: list[tuple[str, str, tuple[int, ...]]]) -> int:
        """Receive one broadcast per (name, dtype, shape) from rank 0, then reload them all."""
        import torch

        comm = getattr(self, "_llmrl_nccl", None)
        if comm is None:
            raise RuntimeError("llmrl_receive_nccl called before llmrl_init_nccl_group")
        weights = []
        for name, dtype, shape in metadata:
            tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            comm.broadcast(tensor, src=0, stream=torch.cuda.current_stream())
            weights.append((name, tensor))
        torch.cuda.synchronize()
        return self._llmrl_reload(weights)
