"""``vLLMUpdater``: push a trainer's weights into resident vLLM engines and advance the policy version.

Paths (``mode``), chosen by config:

* ``"in_process"``: the engine lives in this process; tensors go straight to the model runner's
  ``reload_weights`` through ``collective_rpc`` (:func:`~llmrl_core.weight_sync.worker_extension.
  reload_and_fingerprint`, which also records the fingerprint of what was loaded).
* ``"bytes"``: safetensors bytes through ``collective_rpc`` to :class:`WeightSyncExtension` (engines in
  another process; 2-5 s for 135M parameters on CPU).
* ``"file"``: a safetensors file written atomically under ``shared_dir`` (shared storage, any number of
  engines), then loaded by every engine's extension.
* ``"nccl"``: a CUDA broadcast from the trainer (rank 0) to every engine worker, over vLLM's
  stateless process group (GPU only).

After every push the engine's prefix cache is reset (its KV entries were computed with the old weights)
and the version is incremented on every registered tracker (e.g. the env's ``PolicyVersion`` transform),
so each trajectory records the weights that produced it. ``bytes``, ``file`` and ``nccl`` need engines
started with ``EngineConfig(weight_sync_extension=True)``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from llmrl_core.ports import free_port
from llmrl_core.weight_sync.process_group import send_weights, stateless_init_process_group, tensor_metadata
from llmrl_core.weight_sync.serialization import state_dict_to_bytes, write_state_dict_atomic
from llmrl_core.weight_sync.worker_extension import reload_and_fingerprint

WEIGHT_SYNC_MODES = ("in_process", "bytes", "file", "nccl")


TIED_NAMES = ("model.embed_tokens.weight", "lm_head.weight")


def add_tied_head(state: dict[str, torch.Tensor], llm: Any) -> None:
    """Spell out both names of a tied embedding/output head when ``state`` has only one of them.

    A state dict of a tied model carries the shared tensor once, under either name (``save_pretrained`` keeps
    the embeddings; a de-duplicated checkpoint may keep the head). vLLM loads the tensor through the embeddings'
    name: given only the head, it still updates the shared tensor but warns on every reload that the embeddings
    "Failed to load weights" / "were not loaded from checkpoint" (tests/test_weight_sync.py checks that the
    reloaded engine scores like the trainer either way). Given both names, it loads the embeddings and ties the
    head, with no warning; a CPU build that keeps the head as its own tensor gets it too."""
    config = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "hf_config", None)
    spell_out_tied_names(state, bool(getattr(config, "tie_word_embeddings", False)))


def spell_out_tied_names(state: dict[str, torch.Tensor], tied: bool) -> None:
    """For a model that ties its output head to its input embeddings (``tied``), give ``state`` both names of the
    shared tensor when it carries one of them (in place); any other state is left as it is."""
    if not tied:
        return
    present = [name for name in TIED_NAMES if name in state]
    if len(present) == 1:
        for name in TIED_NAMES:
            state.setdefault(name, state[present[0]])


def engine_dtype(llm: Any) -> torch.dtype | None:
    """The dtype an engine holds its weights in (its model config's ``dtype``), or None when it does not say."""
    dtype = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else None


def cast_floats(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """``state`` with its floating-point tensors in ``dtype`` (unchanged when None or already there).

    The engine would round them to its dtype on load anyway (the same round-to-nearest-even cast), but vLLM
    warns once per tensor it has to convert, on every reload; casting first keeps the log clean and halves the
    bytes a bf16 engine is sent from an fp32 trainer."""
    if dtype is None:
        return state
    return {k: t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t for k, t in state.items()}


class vLLMUpdater:  # noqa: N801 - TorchRL's name
    """Pushes state dicts into registered vLLM engines (see the module docstring for the modes)."""

    def __init__(
        self,
        master_address: str | None = None,
        master_port: int | None = None,
        model_metadata: dict[str, tuple[torch.dtype, torch.Size]] | None = None,
        vllm_tp_size: int | None = None,
        *,
        mode: str = "in_process",
        shared_dir: str | Path | None = None,
        device: str = "cuda:0",
        initial_version: int = 0,
    ) -> None:
        if mode not in WEIGHT_SYNC_MODES:
            raise ValueError(f"mode must be one of {WEIGHT_SYNC_MODES}, got {mode!r}")
        if mode == "file" and shared_dir is None:
            raise ValueError("mode='file' needs shared_dir (a folder every engine can read)")
        self.mode = mode
        self.shared_dir = Path(shared_dir) if shared_dir is not None else None
        self.master_address = master_address or "127.0.0.1"
        self.model_metadata = dict(model_metadata) if model_metadata else None
        self.vllm_tp_size = vllm_tp_size
        self.master_port = master_port
        self.device = device
        self.version = initial_version
        self.engines: list[Any] = []
        self.trackers: list[Any] = []
        self._nccl: Any = None

    def register_engine(self, llm: Any) -> vLLMUpdater:
        """Add a ``vllm.LLM`` (or anything with ``collective_rpc`` and ``reset_prefix_cache``)."""
        if self._nccl is not None:
            raise RuntimeError("register every engine before the first NCCL push")
        self.engines.append(getattr(llm, "llm", llm))
        return self

    def register_version_tracker(self, tracker: Any) -> vLLMUpdater:
        """Anything with ``increment_version()`` (e.g. the ``PolicyVersion`` transform) advances on each push."""
        self.trackers.append(tracker)
        return self

    def init(self, model_metadata: dict[str, tuple[torch.dtype, torch.Size]] | None = None) -> None:
        """TorchRL's set-up call: record the weights' names, dtypes and shapes (``...`` or None: none given).
        Engines join through :meth:`register_engine`; the NCCL group opens on the first NCCL push."""
        if model_metadata is not None and model_metadata is not Ellipsis:
            self.model_metadata = dict(model_metadata)

    def increment_version(self) -> int:
        """Advance the version (and every registered tracker) without sending weights."""
        self.version += 1
        for tracker in self.trackers:
            tracker.increment_version()
        return self.version

    def push_weights(self, weights: Mapping[str, torch.Tensor] | torch.nn.Module | None) -> int:
        """Send ``weights`` to every engine, reset their prefix caches, bump the version; returns it.

        ``None`` (or TorchRL's ``...`` placeholder): the policy's weights were changed in place (a transformers
        policy, or engines updated by other means); only the version advances."""
        if weights is None or weights is Ellipsis:
            return self.increment_version()
        if not self.engines:
            raise RuntimeError("no engine registered: call register_engine(llm) first")
        self._send(weights)
        return self.increment_version()

    def _send(self, weights: Mapping[str, torch.Tensor] | torch.nn.Module | Any) -> None:
        """Carry ``weights`` to every registered engine as version ``self.version + 1``, the mode's way, and reset
        their prefix caches. A subclass that reaches its engines another way overrides this one step (the flows'
        engines are Dask actors: :class:`runtime.weight_sync.EngineActorsUpdater`)."""
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else dict(weights)
        for llm in self.engines:
            add_tied_head(state, llm)
        dtypes = {engine_dtype(llm) for llm in self.engines}
        if self.mode != "nccl" and len(dtypes) == 1:
            state = cast_floats(state, dtypes.pop())
        if self.mode == "in_process":
            items = [(name, t.detach()) for name, t in state.items()]
            for llm in self.engines:  # vLLM's reload_weights, and the fingerprint of what it loaded
                llm.collective_rpc(reload_and_fingerprint, args=(items,))
        elif self.mode == "bytes":
            payload = state_dict_to_bytes(state)
            for llm in self.engines:
                llm.collective_rpc("llmrl_reload_from_bytes", args=(payload,))
        elif self.mode == "file":
            assert self.shared_dir is not None
            path = write_state_dict_atomic(state, self.shared_dir / f"policy-v{self.version + 1}.safetensors")
            for llm in self.engines:
                llm.collective_rpc("llmrl_reload_from_file", args=(str(path),))
        else:
            self._push_nccl(state)
        for llm in self.engines:
            llm.reset_prefix_cache()

    # --- NCCL ------------------------------------------------------------------------------------
    def _init_nccl(self) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("mode='nccl' needs CUDA; use 'in_process', 'bytes' or 'file' on CPU")
        port = self.master_port or free_port()
        sizes = [int(llm.llm_engine.vllm_config.parallel_config.world_size) for llm in self.engines]
        world = 1 + sum(sizes)
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        threads = [
            threading.Thread(
                target=llm.collective_rpc,
                args=("llmrl_init_weight_group",),
                kwargs={"args": (self.master_address, port, offset, world)},
                daemon=True,
            )
            for llm, offset in zip(self.engines, offsets, strict=True)
        ]
        for thread in threads:
            thread.start()
        self._nccl = stateless_init_process_group(self.master_address, port, 0, world, torch.device(self.device))
        for thread in threads:
            thread.join()

    def _push_nccl(self, state: dict[str, torch.Tensor]) -> None:
        if self._nccl is None:
            self._init_nccl()
        metadata = tensor_metadata(state)
        threads = [
            threading.Thread(
                target=llm.collective_rpc, args=("llmrl_receive_weights",), kwargs={"args": (metadata,)}, daemon=True
            )
            for llm in self.engines
        ]
        for thread in threads:
            thread.start()
        send_weights(self._nccl, state, self.device)
        for thread in threads:
            thread.join()
