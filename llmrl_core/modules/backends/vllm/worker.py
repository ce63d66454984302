"""A vLLM engine that stays resident in its process: ``vLLMWorker``, ``make_vllm_worker``, ``LLMOnDevice``.

A worker owns one engine for its whole life (a Dask worker, a script), so loading a model is a one-time
cost. It samples (:func:`~llmrl_core.modules.backends.vllm.engine.generate`) and scores, serves as a policy
through TorchRL's :class:`~llmrl_core.modules.policies.vLLMWrapper` (:meth:`vLLMWorker.policy`), and accepts new
weights as a state dict, safetensors bytes or a safetensors file path (the forms that cross a process boundary),
recording the policy version that each load brings.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from llmrl_core.modules.backends.types import Completion, EngineConfig, SamplingConfig
from llmrl_core.modules.backends.vllm.engine import generate, make_llm, score_with_vllm, shutdown_llm
from llmrl_core.weight_sync.serialization import state_dict_from
from llmrl_core.weight_sync.updater import vLLMUpdater


class vLLMWorker:  # noqa: N801 - TorchRL's naming
    """One resident vLLM engine plus the policy version of the weights it holds."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.llm = make_llm(self.config)
        self.policy_version: int | str = 0
        self.last_reload_s = 0.0  # the engine's own reload of the last weights loaded (re-packing included)
        self.last_wake_s = 0.0  # the last wake from sleep mode (config.sleep_level)
        self._asleep = False
        self._weights_dropped = False  # slept at level 2: the weights must be loaded again before any use
        self._updater = vLLMUpdater(mode="in_process").register_engine(self.llm)

    def get_tokenizer(self) -> Any:
        """The engine's tokenizer."""
        return self.llm.get_tokenizer()

    def policy(
        self,
        input_mode: str = "tokens",
        sampling: SamplingConfig | None = None,
        progress: bool = False,
        cls: type | None = None,
        **kwargs: Any,
    ) -> Any:
        """TorchRL's :class:`~llmrl_core.modules.policies.vLLMWrapper` (or ``cls``, a subclass, with ``kwargs``) on
        this engine, the episode loop's policy: it samples through :meth:`generate`, ``progress`` showing vLLM's
        bar over each call's prompts."""
        from llmrl_core.modules.policies import vLLMWrapper

        self.wake()
        return (cls or vLLMWrapper).on_engine(self, input_mode, sampling, progress, **kwargs)

    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        sampling: SamplingConfig | None = None,
        n: int = 1,
        progress: bool | Callable[[int, int], None] = False,
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt (token-id prompts), with sampler log-probs. ``progress``: vLLM's bar
        (True) or a callback ``(requests done, requests)`` called as requests finish."""
        self.wake()
        return generate(
            self.llm, prompt_token_ids, n=n, use_tqdm=progress, **(sampling or SamplingConfig()).vllm_kwargs()
        )

    def score(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Teacher-forced log-probs of ``responses`` under the current weights."""
        self.wake()
        return score_with_vllm(self.llm, [list(p) for p in prompts], [list(r) for r in responses])

    def load_weights(
        self, weights: Mapping[str, torch.Tensor] | bytes | str | os.PathLike, version: int | str
    ) -> int | str:
        """Load new weights (state dict, safetensors bytes or file path) and record ``version``."""
        state = state_dict_from(weights)
        self.wake(loading=True)
        start = time.perf_counter()
        self._updater.push_weights(state)
        self.last_reload_s = time.perf_counter() - start
        self._weights_dropped = False
        self.policy_version = version
        return version

    # --- sleep mode (CUDA; the engine started with ``config.sleep_level``) ------------------------------------
    def sleep(self) -> float:
        """Give the engine's GPU memory back until its next use (vLLM's sleep mode at ``config.sleep_level``: 1
        moves the weights to host memory and drops the KV cache, 2 drops both), so a trainer sharing the GPU can
        use it; returns the seconds it took. A no-op with sleep mode off or when already asleep. The next
        sampling, scoring or weight load wakes the engine; after level 2 only a weight load may (the weights are
        gone until then)."""
        if not self.config.sleep_level or self._asleep:
            return 0.0
        start = time.perf_counter()
        self.llm.sleep(level=self.config.sleep_level)
        self._asleep = True
        self._weights_dropped = self.config.sleep_level == 2
        return time.perf_counter() - start

    @property
    def asleep(self) -> bool:
        """Whether the engine sleeps (its GPU memory given back)."""
        return self._asleep

    def wake(self, loading: bool = False) -> None:
        """Take the engine's GPU memory back if it sleeps (every use of the engine here calls it; code that drives
        ``self.llm`` itself calls it first). ``loading``: the caller loads a version next, the only use allowed
        after a level-2 sleep."""
        if self._weights_dropped and not loading:
            raise RuntimeError(
                f"engine at version {self.policy_version} slept at sleep_level=2, which drops its weights: load a "
                "version (load_weights / receive_weights) before sampling or scoring with it"
            )
        if not self._asleep:
            return
        start = time.perf_counter()
        self.llm.wake_up()
        self.llm.reset_prefix_cache()  # its cache entries were dropped while it slept
        self._asleep = False
        self.last_wake_s = time.perf_counter() - start

    def weights_fingerprint(self) -> dict[str, str]:
        """``{"fingerprint", "dtype"}`` of the weights the engine holds (:mod:`llmrl_core.weight_sync.fingerprint`):
        of its last load, or of the model it started from; every worker of a parallel engine must agree."""
        from llmrl_core.weight_sync.worker_extension import held_fingerprint

        found = self.llm.collective_rpc(held_fingerprint)
        if any(f != found[0] for f in found):
            raise RuntimeError(f"the engine's workers hold different weights: {found}")
        return found[0]

    # --- weight groups (NCCL on CUDA, gloo on CPU; the engine started with ``weight_sync_extension=True``) ----
    def weight_group_size(self) -> int:
        """Ranks this engine brings to a trainer's weight group: one per worker (its parallel size)."""
        return int(self.llm.llm_engine.vllm_config.parallel_config.world_size)

    def join_weight_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int) -> None:
        """Join the trainer's weight group (the trainer is rank 0; this engine's workers take ranks
        ``rank_offset ..``); blocks until every rank has joined."""
        self.llm.collective_rpc("llmrl_init_weight_group", args=(master_address, master_port, rank_offset, world_size))

    def receive_weights(self, metadata: Sequence[tuple[str, str, tuple[int, ...]]], version: int | str) -> int | str:
        """Receive one broadcast per ``(name, dtype, shape)`` from the trainer, load them, record ``version``."""
        self.wake(loading=True)
        self.llm.collective_rpc("llmrl_receive_weights", args=([tuple(m) for m in metadata],))
        self.llm.reset_prefix_cache()  # its KV entries were computed with the old weights
        self._weights_dropped = False
        self.policy_version = version
        return version

    def close(self) -> None:
        """Shut the engine down and free its memory (:func:`~llmrl_core.modules.backends.vllm.engine.shutdown_llm`);
        the worker cannot be used afterwards. Idempotent. A process that hosts engines one after another (a
        joined Dask cluster's rollout worker, a notebook) must call it: a dropped engine is not freed."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        self._updater.engines.clear()
        shutdown_llm(llm)


def start_engine(config: EngineConfig) -> Any:
    """The resident engine ``config.backend`` names: a :class:`vLLMWorker` (``vllm``) or a
    :class:`~llmrl_core.modules.backends.transformers.worker.TransformersWorker` (``transformers``: no vLLM needed)."""
    if config.backend == "transformers":
        from llmrl_core.modules.backends.transformers.worker import TransformersWorker

        return TransformersWorker(config)
    return vLLMWorker(config)


def make_vllm_worker(
    *,
    model_name: str | None = None,
    devices: Sequence[torch.device | str | int] | None = None,
    num_devices: int | None = None,
    make_ray_worker: bool = True,
    enforce_eager: bool = False,
    enable_fp32_output: bool = False,
    config: EngineConfig | None = None,
    **kwargs: Any,
) -> vLLMWorker:
    """Start a resident vLLM engine in this process (TorchRL's ``make_vllm_worker`` arguments).

    Args:
        model_name: the model (anything :class:`EngineConfig` ``model`` takes; None: the packaged default).
        devices / num_devices: GPU indices, or how many GPUs (tensor parallelism); not both. One device pins the
            engine to that GPU (:class:`LLMOnDevice`); several must be the first visible ones. Without either, the
            engine runs on the first GPU, or on the CPU when this machine has none (TorchRL needs a GPU).
        make_ray_worker: TorchRL's default builds the engine in a Ray actor. llmrl has no Ray, so True is a
            RuntimeError (TorchRL's error when Ray is not running) that says what to pass instead:
            ``make_ray_worker=False`` for an engine here; Dask-hosted engines come with ``DaskLLMCollector``.
        enforce_eager: vLLM's option (llmrl's CPU engine always runs eagerly).
        enable_fp32_output: TorchRL's fp32 output head needs TorchRL's own vLLM model overrides: only False.
        config: llmrl's :class:`EngineConfig` to start from; the arguments above and ``kwargs`` that name one of
            its fields (``dtype``, ``max_model_len``, ``seed``, ``gpu_memory_utilization``, ...) override it,
            other ``kwargs`` go to ``vllm.LLM``.
    """
    if num_devices is not None and devices is not None:
        raise ValueError("Cannot specify both num_devices and devices")
    if make_ray_worker:
        raise RuntimeError(
            "make_vllm_worker(make_ray_worker=True) builds the engine in a Ray actor, and llmrl has no Ray: pass "
            "make_ray_worker=False for an engine in this process (hosted on Dask workers by DaskLLMCollector)"
        )
    if enable_fp32_output:
        raise ValueError("enable_fp32_output=True needs TorchRL's vLLM model overrides; llmrl supports only False")
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    overrides: dict[str, Any] = {k: v for k, v in kwargs.items() if k in fields}
    extra = {k: v for k, v in kwargs.items() if k not in fields}
    config = config or EngineConfig()
    overrides["extra"] = {**config.extra, **extra}
    overrides["enforce_eager"] = enforce_eager or config.enforce_eager
    if model_name is not None:
        overrides["model"] = model_name
    indices = _device_indices(devices)
    if indices is not None and len(indices) == 1:
        return LLMOnDevice(dataclasses.replace(config, **overrides), device=f"cuda:{indices[0]}")
    if indices is not None:
        if indices != list(range(len(indices))):
            raise ValueError(
                f"devices {indices}: a tensor-parallel engine uses the first visible GPUs; set CUDA_VISIBLE_DEVICES "
                f"to {','.join(map(str, indices))} and pass num_devices={len(indices)}"
            )
        num_devices = len(indices)
    if num_devices is not None:
        if num_devices < 1 or num_devices > torch.cuda.device_count():
            raise ValueError(f"num_devices={num_devices}, but this machine has {torch.cuda.device_count()} GPU(s)")
        overrides.update(device="cuda", tensor_parallel_size=num_devices)
    return vLLMWorker(dataclasses.replace(config, **overrides))


def _device_indices(devices: Sequence[torch.device | str | int] | None) -> list[int] | None:
    """GPU indices of ``devices``, each checked against the GPUs this machine has (TorchRL's ``ValueError``)."""
    if devices is None:
        return None
    indices = []
    for device in devices:
        index = device if isinstance(device, int) else torch.device(device).index
        if not isinstance(index, int) or index < 0 or index >= torch.cuda.device_count():
            raise ValueError(f"Invalid device index: {device}")
        indices.append(index)
    return indices


class LLMOnDevice(vLLMWorker):
    """A :class:`vLLMWorker` pinned to one device: ``"cpu"`` or ``"cuda:N"``.

    vLLM places its single worker on the first visible GPU, so ``cuda:N`` is honoured by narrowing
    ``CUDA_VISIBLE_DEVICES`` to ``N`` before CUDA starts in this process (a fresh Dask worker or
    subprocess); asking for another GPU after CUDA started here is an error rather than a silent move.
    """

    def __init__(self, config: EngineConfig | None = None, device: str = "cpu") -> None:
        config = config or EngineConfig()
        if device == "cpu":
            config = dataclasses.replace(config, device="cpu")
        elif device.startswith("cuda"):
            index = device.partition(":")[2] or "0"
            if torch.cuda.is_initialized():
                if torch.cuda.current_device() != int(index) and os.environ.get("CUDA_VISIBLE_DEVICES") != index:
                    raise RuntimeError(f"CUDA already started in this process; cannot move the engine to {device}")
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = index
            config = dataclasses.replace(config, device="cuda")
        else:
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
        self.device = device
        super().__init__(config)
