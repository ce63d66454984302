"""Per-iteration visibility: a Prefect metrics table, a PNG of the reward / KL / length / agreement curves, MLflow."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

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


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")


def plot_curves(history: list[dict[str, Any]], path: Path) -> Path:
    """Write a PNG with one panel per tracked metric against the policy version."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = CURVES + tuple(c for c in TOOL_CURVES if any(c[0] in row for row in history))  # tool runs only
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
        ax.set_title(title)
        ax.set_xlabel("policy version")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


@task(name="report-iteration", cache_policy=NO_CACHE, persist_result=False)
def report_iteration(run_id: str, history: list[dict[str, Any]], report_dir: Path, recorder: Any = None) -> str:
    """Publish the metrics table and the curves PNG as Prefect artifacts (and the PNG to MLflow)."""
    png = plot_curves(history, report_dir / "curves.png")
    create_table_artifact(
        key=artifact_key(run_id, "metrics"),
        table=history,
        description=f"GRPO metrics per policy version for run {run_id}",
    )
    encoded = base64.b64encode(png.read_bytes()).decode()
    create_markdown_artifact(
        key=artifact_key(run_id, "curves"),
        markdown=f"## {run_id}: rollout curves\n\n![curves](data:image/png;base64,{encoded})\n",
    )
    if recorder is not None:
        recorder.client.log_artifact(recorder.mlflow_run_id, str(png), "reports")
    return str(png)
