"""``llmrl ui``: the Prefect UI (server, deployments, a worker) and the MLflow UI, on 127.0.0.1, in one command.

Both serve llmrl's one home: the Prefect database under ``$LLMRL_HOME/prefect`` (where ``llmrl run`` records
too, see :mod:`llmrl_cli.prefect_home`) and the MLflow store of the runs root (``<runs root>/mlflow.db``).
While the UI is up, ``llmrl run ...`` in another shell reports to it live. The services' own output goes to
log files under ``$LLMRL_HOME/ui/``; Ctrl-C (or SIGTERM) stops them all.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import typer

REPO_ROOT = Path(__file__).resolve().parents[1]  # holds prefect.yaml and the flows the deployments run
WORK_POOL = "llmrl-local"


class UIError(RuntimeError):
    """A service of ``llmrl ui`` did not start (the message names it and its log file)."""


class UIServices:
    """The child processes of ``llmrl ui``: started in order, each waited for, stopped in reverse order."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = env
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        """Start ``argv`` in its own session (so stopping it stops its children), output to ``<name>.log``."""
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - kept open for the child's lifetime
        proc = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs.append((name, proc))
        return proc

    def run(self, name: str, argv: list[str], timeout_s: float = 300.0) -> None:
        """Run a one-off command (e.g. ``prefect deploy``) to completion; its output goes to ``<name>.log``."""
        with open(self.log_dir / f"{name}.log", "ab") as log:
            done = subprocess.run(
                argv, cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s
            )
        if done.returncode != 0:
            raise UIError(f"{name} failed (exit {done.returncode}); see {self.log_dir / f'{name}.log'}")

    def wait_http(self, name: str, url: str, timeout_s: float) -> None:
        """Wait until ``url`` answers 200, or raise naming the service and its log when it dies or times out."""
        from llmrl_cli.run_api import http_ready

        why = http_ready(dict(self.procs)[name], url, timeout_s, poll_s=1.0)
        if why is not None:
            raise UIError(f"{name} {why}; see {self.log_dir / f'{name}.log'}")

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop every child and its descendants (a worker's flow runs live in sessions of their own), newest
        first (the worker before the server it talks to): SIGTERM, then SIGKILL after ``grace_s``."""
        import psutil

        while self.procs:
            _, proc = self.procs.pop()
            try:
                family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for member in family:
                with contextlib.suppress(psutil.NoSuchProcess):
                    member.terminate()
            _, alive = psutil.wait_procs(family, timeout=grace_s)
            for member in alive:
                with contextlib.suppress(psutil.NoSuchProcess):
                    member.kill()
            psutil.wait_procs(alive, timeout=10)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def ui(
    prefect_port: int = typer.Option(4200, help="Port of the Prefect UI and API."),
    mlflow_port: int = typer.Option(5000, help="Port of the MLflow UI."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback unless you say otherwise)."),
    worker: bool = typer.Option(True, help="Start a process worker, so deployments run from the UI."),
    runs_dir: Path = typer.Option(None, "--runs-dir", help="Runs root (default: $LLMRL_RUNS_DIR or $LLMRL_HOME/runs)."),
) -> None:
    """Serve the Prefect UI (with llmrl's deployments and a worker) and the MLflow UI of every run."""
    from llmrl_cli.prefect_home import QUIET_PREFECT, prefect_home
    from llmrl_core.paths import llmrl_home
    from storage.layout import default_runs_root
    from tasks.ui_state import running_ui, ui_state_file

    already = running_ui()
    if already is not None:
        typer.echo(f"llmrl ui is already running: Prefect {already['prefect_ui_url']}  MLflow {already['mlflow_url']}")
        raise typer.Exit(0)
    runs_root = (runs_dir or default_runs_root()).expanduser().absolute()
    runs_root.mkdir(parents=True, exist_ok=True)
    log_dir = llmrl_home() / "ui"
    log_dir.mkdir(parents=True, exist_ok=True)
    api_url = f"http://{host}:{prefect_port}/api"
    env = {
        **os.environ,
        **QUIET_PREFECT,
        "PREFECT_HOME": os.environ.get("PREFECT_HOME", str(prefect_home())),
        "PREFECT_API_URL": api_url,
        "LLMRL_RUNS_DIR": str(runs_root),
        # MLflow's job runner (GenAI judges and scorers; 7 processes, ~1 GB) only when asked for: llmrl uses none
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": os.environ.get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false"),
    }
    Path(env["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    services = UIServices(log_dir, env)
    state = {
        "prefect_api_url": api_url,
        "prefect_ui_url": f"http://{host}:{prefect_port}",
        "mlflow_url": f"http://{host}:{mlflow_port}",
        # MLflow 3's UI opens experiments in its GenAI view unless the link asks for the training-runs view
        "mlflow_runs_url": f"http://{host}:{mlflow_port}/#/experiments?workflowType=machine_learning",
        "runs_dir": str(runs_root),
        "pid": os.getpid(),
    }

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)  # Ctrl-C, also when started with SIGINT ignored (`cmd &` in a script)
    try:
        typer.echo(f"starting the Prefect server ({env['PREFECT_HOME']}) and the MLflow UI ({runs_root / 'mlflow.db'})")
        services.start(
            "prefect-server", [str(bin_dir / "prefect"), "server", "start", "--host", host, "--port", str(prefect_port)]
        )
        services.start(
            "mlflow",
            [
                str(bin_dir / "mlflow"),
                "server",
                "--host",
                host,
                "--port",
                str(mlflow_port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{runs_root / 'mlflow.db'}",
                "--default-artifact-root",
                (runs_root / "mlartifacts").as_uri(),
            ],
        )
        services.wait_http("prefect-server", f"{api_url}/health", timeout_s=240)
        prefect = str(bin_dir / "prefect")
        if subprocess.run([prefect, "work-pool", "inspect", WORK_POOL], env=env, capture_output=True).returncode != 0:
            services.run("work-pool", [prefect, "work-pool", "create", WORK_POOL, "--type", "process"])
        typer.echo("deploying prefect.yaml's flows")
        services.run("deploy", [prefect, "--no-prompt", "deploy", "--all"])
        if worker:
            services.start("worker", [prefect, "worker", "start", "--pool", WORK_POOL])
        services.wait_http("mlflow", f"{state['mlflow_url']}/health", timeout_s=240)
        ui_state_file().write_text(json.dumps(state, indent=2))
        typer.echo(f"Prefect UI: {state['prefect_ui_url']}   (deployments, flow runs, artifacts)")
        typer.echo(f"MLflow UI:  {state['mlflow_runs_url']}   (every run's metrics, lineage and models)")
        typer.echo(f"`llmrl run ...` in another shell now reports here. Logs: {log_dir}. Ctrl-C stops all.")
        while all(proc.poll() is None for _, proc in services.procs):
            time.sleep(1.0)
        dead = next(name for name, proc in services.procs if proc.poll() is not None)
        raise UIError(f"{dead} exited; see {log_dir / f'{dead}.log'}")
    except UIError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from err
    except KeyboardInterrupt:
        typer.echo("stopping the UI services")
    finally:
        services.stop()
        if ui_state_file().is_file() and json.loads(ui_state_file().read_text()).get("pid") == os.getpid():
            ui_state_file().unlink()
