"""Per-iteration visibility: a Prefect metrics table, a PNG of the reward / KL / length / agreement curves, MLflow."""

from __future__ import annotations

import base64
import json
import logging
import re
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import TableArtifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.runtime import flow_run

from llmrl_core.evaluation.report import save_figure

CURVES = (
    ("reward_mean", "mean reward"),
    ("accuracy", "rollout accuracy"),
    ("distinct_responses", "distinct responses / group"),
    ("kl_to_ref", "KL to reference"),
    ("response_tokens_mean", "response tokens"),
    ("loss", "loss"),
    ("agreement_abs_diff_mean", "|trainer - sampler| log-prob (mean)"),
    ("agreement_kl_to_sampler", "KL(trainer, sampler) k3"),
    ("agreement_ess", "ESS of trainer/sampler ratio"),
)
TOOL_CURVES = (("tool_call_rate", "rollouts calling a tool"), ("tool_success_rate", "tool calls that worked"))
ASYNC_CURVES = (  # asynchronous runs (rollout.max_staleness > 0): how far off-policy, and who waited
    ("offpolicy_kl_to_sampler", "KL(trainer, older sampler) k3"),
    ("trainer_wait_s", "trainer waiting for rollouts (s)"),
)


# The columns a user reads first (the live "metrics" table); every metric is in the "metrics-all" table.
LEAD_COLUMNS = (
    "version",
    "reward_mean",
    "reward_p10",
    "reward_p90",
    "accuracy",
    "distinct_responses",
    "agreement_abs_diff_mean",
    "kl_to_ref",
    "response_tokens_mean",
    "loss",
    "iteration_s",
    "tokens_per_s",
)


def lead_table(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history with only :data:`LEAD_COLUMNS` (those a run has), in that order."""
    present = [c for c in LEAD_COLUMNS if any(c in row for row in history)]
    return [{c: row.get(c) for c in present} for row in history]


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only (at most 100 characters)."""
    key = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower())).strip("-")
    return key[:100] or "llmrl"


# (flow run id, artifact key) -> the artifact this flow run keeps up to date
_LIVE_ARTIFACTS: dict[tuple[str, str], Any] = {}


def live_table(key: str, table: list[dict[str, Any]], description: str) -> Any:
    """One table artifact per (flow run, key): created on the first call, updated in place after (so a run page
    shows one live table, not a copy per iteration). Returns its id."""
    return _live(key, lambda: create_table_artifact(table, key=key, description=description), table, description)


def live_markdown(key: str, markdown: str, description: str | None = None) -> Any:
    """Like :func:`live_table`, for a markdown artifact."""
    create = lambda: create_markdown_artifact(markdown, key=key, description=description)  # noqa: E731
    return _live(key, create, markdown, description)


def _live(key: str, create: Any, data: Any, description: str | None) -> Any:
    where = (str(flow_run.get_id()), key)
    known = _LIVE_ARTIFACTS.get(where)
    if known is None:
        _LIVE_ARTIFACTS[where] = known = create()
    else:
        payload = json.dumps(TableArtifact._sanitize(data)) if isinstance(data, list) else data
        with get_client(sync_client=True) as client:
            client.update_artifact(known, ArtifactUpdate(data=payload, description=description))
    return known


def plot_curves(history: list[dict[str, Any]], path: Path) -> Path:
    """Write a PNG with one panel per tracked metric against the policy version."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = CURVES + tuple(c for c in TOOL_CURVES if any(c[0] in row for row in history))  # tool runs only
    if any("offpolicy_kl_to_sampler" in row for row in history):  # asynchronous runs only
        curves += ASYNC_CURVES
    columns = 3
    rows = -(-len(curves) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3 * rows), squeeze=False)
    versions = [row["version"] for row in history]
    for ax in axes.flat[len(curves) :]:
        ax.axis("off")
    for ax, (key, title) in zip(axes.flat, curves, strict=False):
        values = [row.get(key) for row in history]
        points = [(v, y) for v, y in zip(versions, values, strict=True) if y is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o")
        if key == "reward_mean":  # the spread of the batch's rewards: 10th-90th percentile band and the median
            spread = [(v, r) for v, r in zip(versions, history, strict=True) if "reward_p10" in r]
            band = [(v, r["reward_p10"], r["reward_p50"], r["reward_p90"]) for v, r in spread]
            if band:
                xs, low, mid, high = zip(*band, strict=True)
                ax.fill_between(xs, low, high, alpha=0.2, label="p10-p90")
                ax.plot(xs, mid, linestyle="--", label="median")
                ax.legend(fontsize="x-small")
        ax.set_title(title)
        ax.set_xlabel("policy version")
    fig.tight_layout()
    return save_figure(fig, path, dpi=80)


class BackgroundReports:
    """The per-version reports of a flow run, each written while the next iteration runs (a submitted Prefect
    task, off the iteration's critical path: the PNG, the Prefect artifacts and the MLflow upload took ~1 s per
    iteration): one in flight at a time, in version order. Used as a context manager inside the run's lineage
    block: leaving it waits for the last report (re-raising its failure, unless the block is failing already)."""

    def __init__(self) -> None:
        self._pending: Any = None

    def __enter__(self) -> BackgroundReports:
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        if kind is None:
            self.wait()
            return
        try:  # the run is failing: let the report in flight finish, but keep the run's own error
            self.wait()
        except Exception as report_error:
            logging.getLogger(__name__).warning("the report in flight failed too: %s", report_error)

    def submit(
        self,
        run_id: str,
        history: list[dict[str, Any]],
        report_dir: Path,
        recorder: Any = None,
        traces: list[dict[str, Any]] | None = None,
    ) -> None:
        """Start the report of the latest version (after the previous one is done); ``traces``: the version's
        rollouts to log as MLflow traces (:mod:`tasks.rollout_traces`)."""
        self.wait()
        self._pending = report_iteration.submit(run_id, history, report_dir, recorder, traces)

    def wait(self) -> str | None:
        """Wait for the report in flight, if any; returns its PNG path."""
        pending, self._pending = self._pending, None
        return None if pending is None else pending.result()


@task(name="report-iteration", cache_policy=NO_CACHE, persist_result=False)
def report_iteration(
    run_id: str,
    history: list[dict[str, Any]],
    report_dir: Path,
    recorder: Any = None,
    traces: list[dict[str, Any]] | None = None,
) -> str:
    """The metrics table and the curves PNG as live Prefect artifacts of this flow run (and the PNG to MLflow, with
    ``traces``: a sample of the version's rollouts as MLflow traces of the run)."""
    png = plot_curves(history, report_dir / "curves.png")
    live_table(artifact_key(run_id, "metrics"), lead_table(history), f"main metrics per policy version of {run_id}")
    live_table(artifact_key(run_id, "metrics-all"), history, f"every metric per policy version of {run_id}")
    encoded = base64.b64encode(png.read_bytes()).decode()
    live_markdown(
        artifact_key(run_id, "curves"),
        f"## {run_id}: curves per policy version\n\n![curves](data:image/png;base64,{encoded})\n",
        f"curves per policy version for run {run_id}",
    )
    if recorder is not None:
        recorder.client.log_artifact(recorder.mlflow_run_id, str(png), "reports")
        if traces:
            from tasks.rollout_traces import log_traces

            log_traces(recorder, run_id, traces)
    return str(png)
