"""Run the real GRPO flow (``llmrl run grpo``) in a subprocess and time its iterations from the outside.

Shared by ``bench_orchestration.py`` (P3) and ``bench_scaling.py``. The run is isolated in a temporary
``LLMRL_HOME`` (its own runs root, MLflow store and Prefect home; ``models`` and ``vllm-cache`` are links to the
real ones, so nothing is converted or compiled again, and no running ``llmrl ui`` is joined). Sources:

- the Prefect database of that home (``prefect/prefect.db``, table ``task_run``): start and end of every task
  run (``load-prompts``, ``rollout``, ``write-trajectories``, ``train``, ``publish-weights``,
  ``seal-checkpoint`` and ``commit-version`` (the previous version's, beside this iteration's rollouts),
  ``report-iteration``). Iteration ``k`` is the span from its ``load-prompts`` start to the
  next iteration's ``load-prompts`` start (the last one: to the end of its last task);
- the commit markers ``RUN/state/published-v<N>.json``: the metrics the flow records per version, of which
  ``rollout_s`` (the rollout actor's own time for its stage, engine generation included) and ``step_time_s``
  (the trainer's optimizer step) are the compute inside the iteration; ``publish_write_s``, ``publish_load_s``
  and ``seal_s`` split the publish, and ``engine_reload_s`` (recorded with the next version's rollouts) is the
  engines' own share of the load: the engine's reload, which re-packs the weights for its kernels.

Everything else in the span is orchestration: task calls, Dask actor calls, Parquet stages, checkpoint +
engine reload (``publish-weights``), waiting for the checkpoint's seal (``seal-checkpoint``), MLflow lineage writes
and the report.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LLMRL = REPO / ".venv" / "bin" / "llmrl"
TASKS = (
    "load-prompts",
    "rollout",
    "score-reference",
    "write-trajectories",
    "train",
    "publish-weights",
    "seal-checkpoint",
    "commit-version",
    "report-iteration",
)


@dataclass
class TaskRun:
    name: str
    start: float  # epoch seconds
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Iteration:
    """One GRPO iteration (policy version ``version`` -> ``version + 1``) as seen from outside."""

    version: int
    start: float
    end: float
    last: bool  # the run's last iteration: its span ends at its last task's end
    tasks: list[TaskRun] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    publish: dict[str, float] = field(default_factory=dict)  # publish-weights split by the times the flow records
    engine_reload: float = 0.0  # the engines' own reload of the version this iteration publishes (0: not recorded)

    @property
    def wall(self) -> float:
        return self.end - self.start

    @property
    def train_compute(self) -> float:
        """The optimizer step time the flow records; when no group had a reward signal there is no step and the
        trainer only runs a forward pass for the agreement metrics, which the flow does not time: then the whole
        ``train`` task counts (its Parquet read and Dask call included, ~0.02 s when measured beside a step)."""
        if "step_time_s" in self.metrics:
            return self.metrics["step_time_s"]
        return self.task_seconds("train")

    @property
    def compute(self) -> float:
        """Engine + trainer compute: the rollout actor's stage time and the trainer's time (see train_compute)."""
        return self.metrics.get("rollout_s", 0.0) + self.train_compute

    @property
    def compute_with_reload(self) -> float:
        """:attr:`compute` plus the engines' own weight reload: the work a hand-written loop around the same
        engine and trainer does too (the engine's reload re-packs the weights for its kernels)."""
        return self.compute + self.engine_reload

    def task_seconds(self, name: str) -> float:
        return sum(t.seconds for t in self.tasks if t.name == name)

    def split(self) -> dict[str, float]:
        """Where the wall time goes: compute, then each orchestration share (seconds; all but the background report
        add up to ``wall``)."""
        m = self.metrics
        out = {
            "rollout compute (actor)": m.get("rollout_s", 0.0),
            "train step compute": self.train_compute,
            # the GRPO flow sends its rollouts as Dask actor calls (tasks/rollout_ahead.py), not as a Prefect task
            # run: then the rollout lies between tasks, and only the time around the actor's own is orchestration
            "rollout task - actor time (Dask call, rows in/out)": self.task_seconds("rollout") - m.get("rollout_s", 0.0)
            if self.task_seconds("rollout")
            else 0.0,
            "train task - step time (Dask call, Parquet read, samples)": self.task_seconds("train")
            - self.train_compute,
            "publish-weights (weights file, engine load)": self.task_seconds("publish-weights"),
            "seal-checkpoint (waiting for the trainer's seal, beside the next rollouts)": self.task_seconds(
                "seal-checkpoint"
            ),
            "write-trajectories (advantages, Parquet staging -> store)": self.task_seconds("write-trajectories"),
            "report-iteration (PNG, Prefect artifacts, MLflow artifact; in the background: overlaps the rest)": (
                self.task_seconds("report-iteration")
            ),
            "load-prompts": self.task_seconds("load-prompts"),
            "commit-version (marker; beside the next rollouts: overlaps them)": self.task_seconds("commit-version"),
            "score-reference": self.task_seconds("score-reference"),
        }
        gaps = self.gaps()
        outside = 0.0 if self.task_seconds("rollout") else m.get("rollout_s", 0.0)  # the rollout, between tasks
        out["between tasks (Prefect task calls, Dask rollout calls, MLflow trajectory input, flow code)"] = (
            sum(gaps.values()) - outside
        )
        return {k: v for k, v in out.items() if abs(v) > 0 or "compute" in k}

    def gaps(self) -> dict[str, float]:
        """Time between consecutive tasks of the iteration, keyed by the task that follows ("end": the tail)."""
        out: dict[str, float] = {}
        cursor = self.start
        for t in sorted(self.tasks, key=lambda t: t.start):
            out[t.name] = out.get(t.name, 0.0) + max(0.0, t.start - cursor)
            cursor = max(cursor, t.end)
        out["end"] = max(0.0, self.end - cursor)
        return out


@dataclass
class FlowRun:
    overrides: list[str]
    wall: float  # the whole command
    startup: float  # command start -> first iteration's load-prompts (imports, Prefect, Dask, engines, version 0)
    iterations: list[Iteration]
    log: Path

    @property
    def steady(self) -> list[Iteration]:
        """The iterations after the first (warm-up: first Parquet/MLflow writes, first report) and before the last
        (the end of the run: it waits for its own checkpoint's seal), or fewer if the run is too short for that."""
        middle = [it for it in self.iterations if it.version > 0 and not it.last]
        return middle or [it for it in self.iterations if it.version > 0] or self.iterations


def _epoch(value: str) -> float:
    return dt.datetime.fromisoformat(value).replace(tzinfo=dt.UTC).timestamp()


def _task_name(name: str) -> str:
    base, _, suffix = name.rpartition("-")
    return base if base and len(suffix) == 3 and all(c in "0123456789abcdef" for c in suffix) else name


def isolated_home(root: Path) -> Path:
    """A fresh ``LLMRL_HOME`` under ``root`` that shares the real home's prepared models and vLLM cache."""
    from llmrl_core.paths import llmrl_home  # noqa: PLC0415 (import inside: keeps this module light)

    real = llmrl_home()
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    for name in ("models", "vllm-cache"):
        (real / name).mkdir(parents=True, exist_ok=True)
        (home / name).symlink_to(real / name)
    return home


def run_flow(
    overrides: list[str], root: Path | None = None, run_id: str = "bench-flow", config: str | None = None
) -> FlowRun:
    """``llmrl run grpo`` (the main job's config, or ``config``) with ``overrides``, isolated; returns its timed
    iterations."""
    root = Path(root or tempfile.mkdtemp(prefix="bench-flow-"))
    home = isolated_home(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(LLMRL_HOME=str(home), PREFECT_HOME=str(home / "prefect"), PYTHONUNBUFFERED="1")
    env.pop("LLMRL_RUNS_DIR", None)
    command = [str(LLMRL), "run", "grpo", "--set", f"run_id={run_id}", "--set", "final_eval.questions=0"]
    command += ["--set", "progress=false"] + (["--config", str(config)] if config else [])
    for item in overrides:
        command += ["--set", item]
    log = root / "flow.log"
    started = time.time()
    with log.open("w") as out:
        rc = subprocess.run(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    wall = time.time() - started
    if rc != 0:
        raise RuntimeError(f"llmrl run grpo exited with {rc}; log: {log}")
    tasks = _task_runs(home / "prefect" / "prefect.db")
    run_dir = home / "runs" / run_id
    starts = [t for t in tasks if t.name == "load-prompts"]
    iterations = []
    for k, lp in enumerate(starts):
        last = k == len(starts) - 1
        inside = [t for t in tasks if t.start >= lp.start and (last or t.start < starts[k + 1].start)]
        end = max(t.end for t in inside) if last else starts[k + 1].start
        marker = json.loads((run_dir / "state" / f"published-v{k + 1}.json").read_text())
        iteration = Iteration(k, lp.start, end, last, inside, marker["metrics"])
        iteration.publish = _publish_split(marker["metrics"], [t for t in inside if t.name == "publish-weights"])
        following = run_dir / "state" / f"published-v{k + 2}.json"  # its rollouts record the reload of version k+1
        if following.exists():
            iteration.engine_reload = json.loads(following.read_text())["metrics"].get("engine_reload_s", 0.0)
        iterations.append(iteration)
    return FlowRun(overrides, wall, starts[0].start - started if starts else float("nan"), iterations, log)


def _publish_split(metrics: dict[str, float], tasks: list[TaskRun]) -> dict[str, float]:
    """A version's publish-weights task split by the times the flow commits with the version (its marker's
    ``metrics``: ``publish_write_s``, the trainer's weights for the engines, into shared memory when they share its
    host; ``publish_load_s``, the engines' loads; ``seal_s``, the trainer's seal after the task, beside the next
    rollout: the fp32 checkpoint written when the engines got the weights through shared memory, its fsync and
    sha256, manifest, optimizer + RNG state). Empty for a run that did not record them."""
    if len(tasks) != 1 or "publish_write_s" not in metrics:
        return {}
    task = tasks[0]
    return {
        "weights written for the engines (cast into the shared-memory file, or the checkpoint file)": metrics[
            "publish_write_s"
        ],
        "engine load(s) (file mapped, weights re-packed by vLLM)": metrics["publish_load_s"],
        "rest of the task (Dask calls, Prefect task run)": task.seconds
        - metrics["publish_write_s"]
        - metrics["publish_load_s"],
        "after the task, on the trainer, beside the next rollout: seal (fp32 weights file + fsync + sha256, "
        "manifest, optimizer + RNG state)": metrics.get("seal_s", float("nan")),
    }


def _task_runs(db: Path) -> list[TaskRun]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT name, start_time, end_time FROM task_run WHERE start_time IS NOT NULL AND end_time IS NOT NULL"
        ).fetchall()
    runs = [TaskRun(_task_name(name), _epoch(start), _epoch(end)) for name, start, end in rows]
    return sorted((r for r in runs if r.name in TASKS), key=lambda r: r.start)
