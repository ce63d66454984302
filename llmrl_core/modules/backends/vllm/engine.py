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
from collections.abc import Callable, Sequence
from typing import Any

import torch

from llmrl_core.model_store import resolve_model
from llmrl_core.modules.backends.types import Completion, EngineConfig
from llmrl_core.paths import llmrl_home


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
            # in-process; inside a Dask worker that needs non-daemonic worker processes (runtime/cluster.py).
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
    from llmrl_core.modules.backends.vllm.module_scan import modules_hidden_from_vllm_scan

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


def generate(
    llm: Any,
    prompt_token_ids: Sequence[Sequence[int]],
    *,
    max_tokens: int = 128,
    seed: int | None = None,
    use_tqdm: bool | Callable[[int, int], None] = False,
    **sampling: Any,
) -> list[list[Completion]]:
    """Sample responses to token-id prompts; each comes with its sampled tokens' log-probs, text and finish reason.

    Prompts are token ids (render them with the tokenizer's chat template first), so the tokens the sampler saw
    are exactly the tokens a trainer will score. ``sampling`` holds ``vllm.SamplingParams`` fields (``n``,
    ``temperature``, ``top_p``, ``stop``, ``ignore_eos``, ...; ``logprobs`` is 0 unless given: the sampled
    token's own log-prob).

    ``seed`` seeds prompt ``i`` with ``seed + i``: the same call gives the same samples again, and repeated
    prompts (the G copies of a GRPO group) get different samples. One seed for every request would make
    identical prompts sample identical responses. ``use_tqdm``: vLLM's progress bar (True), or a callback
    ``(requests done, requests)`` called as requests finish (the same answers as without it).
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    settings = {"logprobs": 0, **sampling, "max_tokens": max_tokens}
    if settings.get("stop") is not None:
        settings["stop"] = list(settings["stop"]) or None

    def params_for(index: int) -> Any:
        return SamplingParams(**settings, seed=None if seed is None else seed + index)

    prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_token_ids]
    params = [params_for(i) for i in range(len(prompts))] if seed is not None else params_for(0)
    bar = callback_progress_bar(use_tqdm) if callable(use_tqdm) else use_tqdm
    outputs = llm.generate(prompts, params, use_tqdm=bar)
    results: list[list[Completion]] = []
    for out in outputs:
        group = []
        for comp in out.outputs:
            token_ids = list(comp.token_ids)
            steps = comp.logprobs or []
            lps = [step[tok].logprob for tok, step in zip(token_ids, steps, strict=True)] if steps else []
            group.append(Completion(list(out.prompt_token_ids), token_ids, lps, comp.text, comp.finish_reason))
        results.append(group)
    return results


def callback_progress_bar(callback: Callable[[int, int], None]) -> Callable[..., Any]:
    """A tqdm class for vLLM's ``use_tqdm`` that prints nothing and calls ``callback(done, total)`` as the engine
    finishes requests (vLLM also wraps the prompts it adds in one; that one stays silent)."""
    from tqdm import tqdm

    class CallbackBar(tqdm):
        def __init__(self, iterable: Any = None, *args: Any, **kwargs: Any) -> None:
            self._reports = iterable is None  # the engine's bar over finished requests (not the adding loop)
            kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 - closed with the bar
            super().__init__(iterable, *args, **kwargs)
            if self._reports:
                callback(0, int(self.total or 0))

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            if self._reports:
                callback(int(self.n), int(self.total or 0))
            return shown

        def close(self) -> None:
            super().close()
            self.fp.close()

    return CallbackBar


def score_with_vllm(llm: Any, prompts: list[list[int]], responses: list[list[int]]) -> list[torch.Tensor]:
    """Log-prob of each response token given its prompt, read from vLLM's ``prompt_logprobs``."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {i} is empty: scoring needs at least one prompt token")
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    seqs = [TokensPrompt(prompt_token_ids=p + r) for p, r in zip(prompts, responses, strict=True)]
    outputs = llm.generate(seqs, params, use_tqdm=False)
    result = []
    for prompt, response, out in zip(prompts, responses, outputs, strict=True):
        steps = out.prompt_logprobs[len(prompt) :]
        result.append(torch.tensor([step[tok].logprob for tok, step in zip(response, steps, strict=True)]))
    return result
