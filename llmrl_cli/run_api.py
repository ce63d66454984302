"""The Prefect API that ``llmrl run`` records into when no ``llmrl ui`` server (or user's ``PREFECT_API_URL``) is up.

Prefect would start an ephemeral API itself on first use, as a child in the command's process group that only its
exit hooks stop: a terminal's Ctrl-C (SIGINT to the whole group) stopped that server first, so the run could not
record its own end and retried the dead API for minutes (exit 1, the run left RUNNING), and a ``kill -9`` of the
command left the server running for good. Here the command starts the same API (Prefect's app under uvicorn, on
127.0.0.1, over llmrl's Prefect home) itself, before the flow:

* in a session of its own, so a terminal's Ctrl-C reaches the run and not its API; the run stops, records how it
  ended, and then stops the API;
* through :mod:`llmrl_cli.api_child`, which asks the kernel to end the server when the command's process dies
  (``PR_SET_PDEATHSIG``), so not even a ``kill -9`` leaves it behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llmrl_cli.prefect_home import prefect_home
from llmrl_core.ports import free_port

STARTUP_TIMEOUT_S = 180.0  # a busy 2-core machine can take a while to import Prefect's server


class RunAPIError(RuntimeError):
    """The run's Prefect API did not start (the message names its log file)."""


@contextmanager
def run_api() -> Iterator[str | None]:
    """Serve the run's Prefect API while the block runs and point Prefect's settings at it; yields its URL, or None
    when an API is set already (``PREFECT_API_URL``: the ``llmrl ui`` server or the user's own)."""
    if os.environ.get("PREFECT_API_URL"):
        yield None
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    home = Path(os.environ.get("PREFECT_HOME") or prefect_home()).expanduser()  # never the working directory
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "run-api.log"
    with log_path.open("ab") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "llmrl_cli.api_child", str(os.getpid()), str(port)],
            env={**os.environ, "PREFECT_HOME": str(home), "PREFECT_UI_ENABLED": "0"},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a terminal's Ctrl-C stops the run, which then stops this
        )
    try:
        why = http_ready(server, f"{url}/health", STARTUP_TIMEOUT_S, poll_s=0.2)
        if why is not None:
            raise RunAPIError(f"the run's Prefect API {why}; see {log_path}")
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        _drain_prefect_clients()
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def _drain_prefect_clients() -> None:
    """Send the logs and events Prefect still holds for the API before it stops (else Prefect's exit hooks try a
    dead API and print "Error logging to API")."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        try:
            worker.drain_all(timeout=10)
        except Exception:  # noqa: BLE001 - best effort: the run's own result is already decided
            pass


def http_ready(proc: subprocess.Popen, url: str, timeout_s: float, poll_s: float = 0.5) -> str | None:
    """Wait until ``url`` answers 200: None then; else why not (``proc``, the server, exited or never answered)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if reply.status == 200:
                    return None
        except OSError:
            pass
        time.sleep(poll_s)
    return f"did not answer {url} within {timeout_s:.0f} s"
