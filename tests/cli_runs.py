"""Running the ``llmrl`` command line from a test: in a subprocess of this interpreter, from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def prefect_api_of_this_process() -> str:
    """The Prefect API this test process's flow runs record into: ``PREFECT_API_URL`` when set (an ``isolated``
    test's parent API), else the temporary one Prefect serves for the process, started now if no flow run started it
    yet (Prefect keeps one per process, ``SubprocessASGIServer()``)."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start()
    return server.api_url


def cli_env(base: dict[str, str] | None = None, **env: str) -> dict[str, str]:
    """The environment for a CLI run that records into this process's Prefect API (as ``llmrl run`` does when
    ``llmrl ui`` is up) instead of starting its own (~8 s each): ``base`` (default: this process's environment)
    plus ``env``. A test of the run's own API (``llmrl run`` alone) leaves ``PREFECT_API_URL`` out instead."""
    return {**(os.environ if base is None else base), "PREFECT_API_URL": prefect_api_of_this_process(), **env}


def run_llmrl(
    *args: str, settings: list[str] = (), env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """``llmrl ARGS --set S ...`` (each of ``settings``), its output captured as text; ``env``: the process's
    environment (default: this one's)."""
    command = [sys.executable, "-c", "from llmrl_cli.main import app; app()", *args]
    command += [a for s in settings for a in ("--set", s)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def kill_when_committed(proc: subprocess.Popen, state: Path, version: int, timeout: float = 900) -> None:
    """SIGKILL the process group of ``proc`` (a flow started in a session of its own: the kill reaches its Dask workers
    too) as soon as the run's ``state`` folder holds version ``version``'s commit marker; a test failure if the flow
    ends first or never gets there."""
    import os
    import signal
    import time

    marker = state / f"published-v{version}.json"
    try:
        deadline = time.monotonic() + timeout
        while not marker.exists():
            assert proc.poll() is None, f"the flow exited ({proc.returncode}) before committing version {version}"
            assert time.monotonic() < deadline, f"version {version} was never committed"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
