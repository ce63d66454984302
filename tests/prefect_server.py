"""A real, local Prefect server and process worker for tests, started as subprocesses and always stopped.

Everything is bound to 127.0.0.1 on a free port, with its own temporary ``PREFECT_HOME`` (so its own
sqlite database and profiles) and analytics off. Every wait has a deadline; on any failure the
assertion message carries the tail of the server's or worker's log. Stopping kills the whole process
tree: a process worker starts each flow run in a session of its own, so signalling its process group
is not enough.

The CLI is the venv's ``prefect`` (next to the running interpreter); the server is talked to over its
plain REST API with the standard library, so the tests do not depend on Prefect's client internals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from llmrl_core.ports import free_port

PREFECT = str(Path(sys.executable).with_name("prefect"))


def log_tail(path: Path, chars: int = 4000) -> str:
    """The last ``chars`` characters of a log file ('' when it does not exist)."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def stop_tree(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """Ask ``proc`` and all its descendants to stop (SIGTERM), then SIGKILL what is left after ``grace_s``."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        try:
            member.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(family, timeout=grace_s)
    for member in alive:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL was sent above
        pass


class PrefectServer:
    """Handle on a running test server: its URL, environment for clients, and small REST helpers."""

    def __init__(self, home: Path, port: int, log_dir: Path) -> None:
        self.home = home
        self.port = port
        self.log_dir = log_dir
        self.url = f"http://127.0.0.1:{port}"
        self.api_url = f"{self.url}/api"
        self.server_log = log_dir / "server.log"
        self.deployed_at: float | None = None  # time.monotonic() of the last deploy, set by the deployer

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for a CLI call or worker that talks to this server."""
        env = {
            **os.environ,
            "PREFECT_HOME": str(self.home),
            "PREFECT_API_URL": self.api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "true",
        }
        env.update(extra)
        return env

    def cli(self, *args: str, cwd: Path, timeout: float = 180.0, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``prefect --no-prompt ARGS`` against this server; with ``check``, asserts exit status 0."""
        proc = subprocess.run(
            [PREFECT, "--no-prompt", *args],
            cwd=cwd,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert not check or proc.returncode == 0, (
            f"prefect {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
        return proc

    def request(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Any:
        """Call the REST API (``path`` below ``/api``); returns the decoded JSON (None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.api_url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            payload = resp.read()
        return json.loads(payload) if payload else None

    def deployment(self, flow_and_name: str) -> dict:
        """The registered deployment ``'flow/deployment'``."""
        flow_name, name = flow_and_name.split("/")
        return self.request("GET", f"/deployments/name/{flow_name}/{name}")

    def deployment_names(self) -> set[str]:
        """Every registered deployment as ``'flow/deployment'``."""
        flows = {f["id"]: f["name"] for f in self.request("POST", "/flows/filter", {})}
        return {f"{flows[d['flow_id']]}/{d['name']}" for d in self.request("POST", "/deployments/filter", {})}

    def flow_runs(self, deployment_id: str) -> list[dict]:
        """All flow runs of one deployment, whatever their state."""
        body = {"flow_runs": {"deployment_id": {"any_": [deployment_id]}}}
        return self.request("POST", "/flow_runs/filter", body)

    def healthy(self) -> bool:
        """Whether the API answers its health check."""
        try:
            return self.request("GET", "/health", timeout=5) is True
        except (urllib.error.URLError, OSError, ValueError):
            return False


@contextmanager
def prefect_server(base: Path, start_timeout_s: float = 180.0, **server_env: str) -> Iterator[PrefectServer]:
    """Start ``prefect server start`` on 127.0.0.1 (free port, temp home under ``base``); stop it on exit.

    ``server_env`` adds settings for the server process only (e.g. a shorter scheduler loop).
    """
    base.mkdir(parents=True, exist_ok=True)
    server = PrefectServer(home=base / "prefect-home", port=free_port(), log_dir=base)
    with open(server.server_log, "wb") as log:
        proc = subprocess.Popen(
            [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(server.port), "--no-ui"],
            cwd=base,
            env=server.env(**server_env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + start_timeout_s
        while not server.healthy():
            assert proc.poll() is None, f"prefect server exited {proc.returncode}:\n{log_tail(server.server_log)}"
            assert time.monotonic() < deadline, (
                f"prefect server not healthy after {start_timeout_s:.0f} s:\n{log_tail(server.server_log)}"
            )
            time.sleep(0.5)
        yield server
    finally:
        stop_tree(proc)


@contextmanager
def process_worker(server: PrefectServer, pool: str, cwd: Path, **worker_env: str) -> Iterator[Path]:
    """Run ``prefect worker start --pool POOL`` against ``server`` from ``cwd``; yields its log path.

    The worker and every flow run it started are stopped on exit.
    """
    log_path = server.log_dir / f"worker-{pool}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", pool],
            cwd=cwd,
            env=server.env(**worker_env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield log_path
    finally:
        stop_tree(proc)
