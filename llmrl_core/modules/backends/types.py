"""The settings and results the rollout engines share: :class:`EngineConfig` (how to start one), :class:`SamplingConfig`
(how to sample) and :class:`Completion` (one sampled response), for vLLM (:mod:`llmrl_core.modules.backends.vllm`) and
transformers (:mod:`llmrl_core.modules.backends.transformers`) alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def cuda_available() -> bool:
    """Whether torch sees a CUDA device."""
    import torch

    return torch.cuda.is_available()


LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
ENGINE_BACKENDS = ("vllm", "transformers")
SLEEP_LEVELS = (0, 1, 2)


@dataclass
class EngineConfig:
    """How to build a vLLM engine: model, dtype, KV-cache size, device and seed.

    ``model`` takes anything :func:`llmrl_core.model_store.resolve_model` accepts (``None`` is the
    packaged SmolLM2). ``kv_cache_gb`` sizes the CPU KV cache; on GPU ``gpu_memory_utilization``
    (vLLM's fraction of each GPU's memory for this engine) is used instead. ``device="auto"`` picks CUDA
    when torch sees it. ``tensor_parallel_size`` shards the model over that many GPUs (vLLM starts one
    worker process per GPU); CUDA only: the CPU engine runs in-process, so more than 1 on CPU is refused
    (vLLM's CPU backend only parallelises over NUMA nodes in worker processes; scale CPU rollouts with more
    engines instead).

    ``backend`` picks the engine (:func:`~llmrl_core.modules.backends.vllm.worker.start_engine`): ``vllm``
    (the default, the fast path) or ``transformers``
    (:class:`~llmrl_core.modules.backends.transformers.worker.TransformersWorker`, for machines without vLLM;
    it reads ``model``, ``dtype``, ``device``, ``max_model_len`` and ``logprobs_mode``).

    ``sleep_level`` (CUDA vLLM engines only) starts the engine with vLLM's sleep mode, so that
    :meth:`~llmrl_core.modules.backends.vllm.worker.vLLMWorker.sleep` can give its GPU memory back while a trainer
    on the same GPU trains: ``1`` moves the weights to host memory and drops the KV cache, ``2`` drops both (the next
    weight load refills them); ``0`` (the default) leaves sleep mode off.

    ``logprobs_mode`` is vLLM's: ``processed_logprobs`` (the default here) returns the log-probs of the
    distribution the token was drawn from (temperature, top-k/top-p applied), which is what an importance
    ratio needs; ``raw_logprobs`` (vLLM's own default) those of the unscaled model. A trainer scoring
    processed log-probs divides its logits by the same temperature (``TrainSample.temperature``).
    """

    model: str | None = None
    dtype: str = "auto"  # auto: bfloat16 where the hardware runs it fast, else float32 (llmrl_core.hardware)
    kv_cache_gb: float = 1.0
    gpu_memory_utilization: float = 0.4
    tensor_parallel_size: int = 1
    max_model_len: int = 2048
    seed: int = 0
    device: str = "auto"
    enforce_eager: bool = True
    in_process: bool = True
    weight_sync_extension: bool = False
    logprobs_mode: str = "processed_logprobs"
    extra: dict[str, Any] = field(default_factory=dict)
    backend: str = "vllm"
    sleep_level: int = 0

    def __post_init__(self) -> None:
        if self.backend not in ENGINE_BACKENDS:
            raise ValueError(f"EngineConfig.backend must be one of {ENGINE_BACKENDS}, got {self.backend!r}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"EngineConfig.logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"EngineConfig.tensor_parallel_size must be >= 1, got {self.tensor_parallel_size!r}")
        if self.sleep_level not in SLEEP_LEVELS:
            raise ValueError(f"EngineConfig.sleep_level must be one of {SLEEP_LEVELS}, got {self.sleep_level!r}")
        if self.sleep_level and self.backend != "vllm":
            raise ValueError("EngineConfig.sleep_level needs the vllm backend (vLLM's sleep mode)")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"EngineConfig.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}"
            )

    def check_parallelism(self) -> None:
        """Refuse what this engine cannot run on its device, before vLLM starts: tensor parallelism and sleep mode
        need CUDA."""
        if self.sleep_level and self.resolved_device() == "cpu":
            raise ValueError(
                f"sleep_level={self.sleep_level} needs a CUDA engine (vLLM's sleep mode frees GPU memory; its CPU "
                "backend has none): set rollout.sleep_level=0 on CPU"
            )
        if self.tensor_parallel_size > 1 and self.resolved_device() == "cpu":
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} needs CUDA GPUs (one per shard), and this engine "
                "runs on CPU: the CPU engine runs in-process on the worker's cores; set rollout.tensor_parallel_size=1 "
                "and scale CPU rollouts with rollout.workers"
            )

    def resolved_device(self) -> str:
        """``cuda`` or ``cpu``: the device this config runs on."""
        if self.device == "auto":
            return "cuda" if cuda_available() else "cpu"
        if self.device not in {"cpu", "cuda"}:
            raise ValueError(f"EngineConfig.device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        return self.device


@dataclass
class SamplingConfig:
    """Sampling settings shared by both backends (``temperature=0`` means greedy)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def vllm_kwargs(self) -> dict[str, Any]:
        """These settings as :func:`llmrl_core.modules.backends.vllm.engine.generate`'s arguments."""
        return {
            "max_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": self.stop or None,
        }

    def as_kwargs(self) -> dict[str, Any]:
        """These settings as a policy wrapper's ``generate_kwargs`` (TorchRL's common names)."""
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature}
        kwargs["top_p"] = self.top_p
        if self.seed is not None:
            kwargs["seed"] = self.seed
        if self.stop:
            kwargs["stop_sequences"] = list(self.stop)
        return kwargs


@dataclass
class Completion:
    """One sampled response: its tokens, their log-probs under the sampler, text and finish reason."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None
