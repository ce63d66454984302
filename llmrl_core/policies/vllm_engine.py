"""Start a vLLM engine from a small config and sample from it with per-token log-probs.

vLLM is imported lazily, after the environment it reads at import time has been set: on CPU the
engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, fastest on few cores and usable
inside Dask workers) with a bounded KV cache (``VLLM_CPU_KVCACHE_SPACE``). Values the user already
exported are left alone.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmrl_core.model_store import resolve_model
from llmrl_core.paths import llmrl_home


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

    ``backend`` picks the engine (:func:`~llmrl_core.policies.vllm_worker.start_engine`): ``vllm`` (the default,
    the fast path) or ``transformers`` (:class:`~llmrl_core.policies.transformers_worker.TransformersWorker`, for
    machines without vLLM; it reads ``model``, ``dtype``, ``device``, ``max_model_len`` and ``logprobs_mode``).

    ``sleep_level`` (CUDA vLLM engines only) starts the engine with vLLM's sleep mode, so that
    :meth:`~llmrl_core.policies.vllm_worker.vLLMWorker.sleep` can give its GPU memory back while a trainer on the
    same GPU trains: ``1`` moves the weights to host memory and drops the KV cache, ``2`` drops both (the next
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


def configure_vllm_environment(config: EngineConfig) -> None:
    """Set the environment variables vLLM reads at start time (user values win, except in_process)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if config.in_process else "1"  # the config decides
    os.environ.setdefault("VLLM_CACHE_ROOT", str(llmrl_home() / "vllm-cache"))
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if "prefect" in sys.modules:
        # vLLM's logging set-up (dictConfig) shuts down every existing handler. In a Prefect flow process that
        # flushes Prefect's API log handler while holding the logging lock, and the flush waits on Prefect's
        # event thread, which needs that lock: the engine start deadlocked (seen in the GRPO flow's final
        # evaluation). Leave logging to the process that owns it.
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    if config.resolved_device() == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(config.kv_cache_gb))))


class ComputedBufferReloadFilter(logging.Filter):
    """Hide vLLM's "RotaryEmbedding: Failed to load weights" warning, printed on every weight reload.

    A rotary embedding has no weights in any checkpoint: its cos/sin cache is computed from the model config,
    and vLLM keeps it as it was. The warning reads like a broken weight sync although every trained tensor was
    loaded (tests/test_weight_sync.py compares the engine's log-probs with the trainer's after a reload), so
    it is explained once on llmrl's logger and then dropped.
    """

    def __init__(self) -> None:
        super().__init__()
        self.explained = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "%s: Failed to load weights" and record.args == ("RotaryEmbedding",):
            if not self.explained:
                self.explained = True
                logging.getLogger("llmrl.weight_sync").info(
                    "weight reloads leave RotaryEmbedding as it is: its cos/sin cache is computed, not a weight "
                    "(vLLM's 'Failed to load weights' warning for it is hidden)"
                )
            return False
        return True


_RELOAD_FILTER = ComputedBufferReloadFilter()


def quiet_reload_warnings() -> None:
    """Install :class:`ComputedBufferReloadFilter` on vLLM's layer-wise reload logger (idempotent)."""
    reload_logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if _RELOAD_FILTER not in reload_logger.filters:
        reload_logger.addFilter(_RELOAD_FILTER)


def make_llm(config: EngineConfig | None = None) -> Any:
    """Build a ``vllm.LLM`` for ``config`` (the packaged model; ``dtype="auto"`` resolved for this hardware)."""
    config = config or EngineConfig()
    config.check_parallelism()
    configure_vllm_environment(config)
    model = resolve_model(config.model)
    from vllm import LLM

    from llmrl_core.hardware import choose_dtype

    kwargs: dict[str, Any] = dict(
        model=model,
        dtype=choose_dtype(config.dtype, config.resolved_device()).dtype,
        max_model_len=config.max_model_len,
        seed=config.seed,
        enforce_eager=config.enforce_eager,
        logprobs_mode=config.logprobs_mode,
        # the checkpoint-shard bar is a library's line: shown with the libraries' logs (``llmrl run -v``)
        use_tqdm_on_load=os.environ.get("LLMRL_VERBOSE", "") == "1",
    )
    if config.resolved_device() == "cuda":
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
        if config.sleep_level:
            kwargs["enable_sleep_mode"] = True  # memory from vLLM's CuMem pool, so sleep() can release it
        if config.tensor_parallel_size > 1:
            # vLLM starts one worker process per GPU (its multiprocessing executor), also with the engine core
            # in-process; inside a Dask worker that needs non-daemonic worker processes (tasks/cluster.py).
            kwargs["tensor_parallel_size"] = config.tensor_parallel_size
    else:
        # Per-request seeds on CPU: when chunked prefill splits a seeded prompt, vLLM rewinds the request's
        # torch.Generator with set_offset, which CPU generators do not support ("CPU Generator does not use
        # offset"). Whole-prompt prefill avoids it (vLLM does the same on CPU for MLA models).
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(config.max_model_len, 8192)
    if config.weight_sync_extension:
        from llmrl_core.weight_sync.worker_extension import WEIGHT_SYNC_EXTENSION

        kwargs["worker_extension_cls"] = WEIGHT_SYNC_EXTENSION
    kwargs.update(config.extra)
    from llmrl_core.policies.vllm_module_scan import modules_hidden_from_vllm_scan

    with modules_hidden_from_vllm_scan():  # a Flask global in this process would stop vLLM's start-up scan
        llm = LLM(**kwargs)
    quiet_reload_warnings()  # after LLM(): vLLM's logging set-up, where it runs, replaces handlers, not filters
    return llm


def shutdown_llm(llm: Any) -> None:
    """Stop a ``vllm.LLM``'s engine core now (its processes, queues and threads) instead of at interpreter exit,
    and free what it held.

    With the engine core in another process, teardown left to interpreter finalisation can abort the process
    ("terminate called without an active exception", exit -6) after all work succeeded. With the engine core
    in this process (CPU engines), vLLM freezes the garbage collector's heap when the engine starts
    (``gc.freeze()``): everything alive then, the engine's reference cycles included, is never collected until
    the engine core's shutdown unfreezes it. An engine dropped without this call therefore stays in memory for
    the life of the process, as does a model whose weights were reloaded
    (:func:`~llmrl_core.weight_sync.worker_extension.forget_reload_records`; measured together: a Dask rollout
    worker kept ~0.8 GB more after every flow run it had hosted).
    """
    import gc

    from llmrl_core.weight_sync.worker_extension import forget_reload_records

    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        if type(core).__name__ == "InprocClient":  # the model lives in this process (callables cannot travel)
            llm.collective_rpc(forget_reload_records)  # else the model outlives its engine (see that function)
        core.shutdown()
    gc.collect()  # the engine's cycles, collectable again once the heap is unfrozen


@dataclass
class Completion:
    """One sampled response: its tokens, their log-probs under the sampler, text and finish reason."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None


def generate(
    llm: Any,
    prompt_token_ids: Sequence[Sequence[int]],
    *,
    max_tokens: int = 128,
    temperature: float = 1.0,
    top_p: float = 1.0,
    n: int = 1,
    seed: int | None = None,
    stop: Sequence[str] | None = None,
    ignore_eos: bool = False,
    use_tqdm: bool = False,
) -> list[list[Completion]]:
    """Sample ``n`` responses per prompt; each comes with its sampled tokens' log-probs.

    Prompts are token ids (render them with the tokenizer's chat template first), so the tokens
    the sampler saw are exactly the tokens a trainer will score.

    ``seed`` seeds prompt ``i`` with ``seed + i``: the same call gives the same samples again, and repeated
    prompts (the G copies of a GRPO group) get different samples. One seed for every request would make
    identical prompts sample identical responses.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def params_for(index: int) -> Any:
        return SamplingParams(
            n=n,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=None if seed is None else seed + index,
            stop=list(stop) if stop else None,
            ignore_eos=ignore_eos,
            logprobs=0,
        )

    prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_token_ids]
    params = [params_for(i) for i in range(len(prompts))] if seed is not None else params_for(0)
    outputs = llm.generate(prompts, params, use_tqdm=use_tqdm)
    results: list[list[Completion]] = []
    for out in outputs:
        group = []
        for comp in out.outputs:
            token_ids = list(comp.token_ids)
            lps = [step[tok].logprob for tok, step in zip(token_ids, comp.logprobs or [], strict=True)]
            group.append(Completion(list(out.prompt_token_ids), token_ids, lps, comp.text, comp.finish_reason))
        results.append(group)
    return results
