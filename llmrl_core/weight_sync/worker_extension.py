"""Methods mixed into vLLM's worker class (``worker_extension_cls``) so weights can arrive from outside.

vLLM calls ``collective_rpc(name, args=...)`` on every worker of an engine; with this extension the
worker understands three more names:

* ``llmrl_reload_from_bytes(data)``: safetensors bytes (works across processes, where tensors in rpc
  arguments do not survive);
* ``llmrl_reload_from_file(path)``: a safetensors file on storage every worker can read;
* ``llmrl_init_weight_group(...)`` / ``llmrl_receive_weights(...)``: join a trainer's weight group (NCCL on CUDA,
  gloo on CPU) and receive broadcast tensors.

All paths end in :func:`reload_and_fingerprint`: the weights re-packed for the device (on CPU in place, with
vLLM's own loaders and packing, :mod:`llmrl_core.weight_sync.cpu_reload`; elsewhere the model runner's
``reload_weights``), then the fingerprint of what was loaded (:mod:`llmrl_core.weight_sync.fingerprint`), in the
dtype the engine holds it.
:func:`held_fingerprint` answers it (``collective_rpc(held_fingerprint)``). Why over the tensors the loader took
in and not over the model's parameters: on CPU vLLM packs every linear layer's weight into a oneDNN handle and
leaves a zero-size parameter behind, so the parameters no longer show the values.
"""

from __future__ import annotations

from typing import Any

WEIGHT_SYNC_EXTENSION = "llmrl_core.weight_sync.worker_extension.WeightSyncExtension"
_FINGERPRINT = "_llmrl_weights_fingerprint"


def _worker(target: Any) -> Any:
    """The vLLM worker itself: a callable sent through ``collective_rpc`` gets its wrapper (which forwards reads, not
    writes), a method of this extension gets the worker."""
    return getattr(target, "worker", None) or target


def _held_as(worker: Any) -> tuple[Any, bool]:
    """The dtype the engine holds its weights in, and whether its model ties the output head to the embeddings."""
    config = worker.model_runner.model_config
    return config.dtype, bool(getattr(config.hf_config, "tie_word_embeddings", False))


def reload_and_fingerprint(worker: Any, weights: list[tuple[str, Any]]) -> int:
    """Reload ``weights`` into ``worker``'s model (:func:`~llmrl_core.weight_sync.cpu_reload.reload_weights`) and
    record their fingerprint in the engine's dtype; returns the number of tensors. Runs in the vLLM worker
    (``collective_rpc``)."""
    from llmrl_core.weight_sync.cpu_reload import reload_weights
    from llmrl_core.weight_sync.fingerprint import weights_fingerprint

    worker = _worker(worker)
    reload_weights(worker.model_runner, weights)
    dtype, tied = _held_as(worker)
    setattr(worker, _FINGERPRINT, weights_fingerprint(weights, dtype, tied=tied))
    return len(weights)


def held_fingerprint(worker: Any) -> dict[str, str]:
    """``{"fingerprint", "dtype"}`` of the weights ``worker`` holds: of its last reload, or, before any, of the model
    folder's safetensors files it started from. Runs in the vLLM worker (``collective_rpc``)."""
    worker = _worker(worker)
    dtype, tied = _held_as(worker)
    found = getattr(worker, _FINGERPRINT, None)
    if found is None:
        from pathlib import Path

        from safetensors.torch import load_file

        from llmrl_core.weight_sync.fingerprint import weights_fingerprint

        state: dict[str, Any] = {}
        for path in sorted(Path(worker.model_runner.model_config.model).glob("*.safetensors")):
            state.update(load_file(str(path)))
        found = weights_fingerprint(state, dtype, tied=tied)
        setattr(worker, _FINGERPRINT, found)
    return {"fingerprint": found, "dtype": str(dtype).removeprefix("torch.")}


def forget_reload_records(worker: Any) -> int:
    """Drop vLLM's layer-wise reload records of ``worker``'s model; returns how many were dropped. Runs in the vLLM
    worker (``collective_rpc``), when the engine stops.

    Every ``reload_weights`` records each layer in a process-wide ``WeakKeyDictionary`` keyed by the layer; the
    records hold tensors that lead back to their layer (the tied output head to the embedding), so the entries
    never expire: an in-process engine stopped in a long-lived process (a joined Dask cluster's rollout worker)
    left ~400 MB behind per engine that had reloaded weights. Nothing of the model is needed after its engine
    stops."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except ImportError:  # a vLLM without layer-wise reloads keeps no such records
        return 0
    return sum(LAYERWISE_INFO.pop(m, None) is not None for m in _worker(worker).model_runner.get_model().modules())


class WeightSyncExtension:
    """vLLM worker extension: weight reloads from bytes, files or an NCCL broadcast."""

    model_runner: Any  # provided by the vLLM worker this class is mixed into
    device: Any

    def _llmrl_reload(self, weights: list[tuple[str, Any]]) -> int:
        return reload_and_fingerprint(self, weights)

    def llmrl_reload_from_bytes(self, data: bytes) -> int:
        """Load a safetensors payload; returns the number of tensors loaded."""
        from llmrl_core.weight_sync.serialization import state_dict_from_bytes

        return self._llmrl_reload(list(state_dict_from_bytes(data).items()))

    def llmrl_reload_from_file(self, path: str) -> int:
        """Load a safetensors file; returns the number of tensors loaded."""
        from safetensors.torch import load_file

        return self._llmrl_reload(list(load_file(path).items()))

    def llmrl_init_weight_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int) -> None:
        """Join the trainer's weight group (the trainer is rank 0): NCCL through vLLM's stateless process group on a
        CUDA worker, gloo on a CPU worker (:func:`~llmrl_core.weight_sync.process_group.weight_group`)."""
        from vllm.distributed.parallel_state import get_world_group

        from llmrl_core.weight_sync.process_group import weight_group

        rank = get_world_group().rank + rank_offset
        self._llmrl_group = weight_group(master_address, master_port, rank, world_size, self.device)

    def llmrl_receive_weights(self, metadata: list[tuple[str, str, tuple[int, ...]]]) -> int:
        """Receive one broadcast per (name, dtype, shape) from rank 0, then reload them all."""
        from llmrl_core.weight_sync.process_group import receive_weights

        comm = getattr(self, "_llmrl_group", None)
        if comm is None:
            raise RuntimeError("llmrl_receive_weights called before llmrl_init_weight_group")
        return self._llmrl_reload(receive_weights(comm, metadata, self.device))
