"""Publishing a policy version, shared by the grpo, sft and offline flows.

One call does what makes a version count, in order: checkpoint (weights + optimizer/RNG state) and load
into the rollout engines, MLflow lineage, the commit marker (written last), then the per-version report (which
the GRPO flow lets run beside its next iteration).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from storage.checkpoints import CheckpointStore
from storage.lineage import DataRef, LineageRecorder
from tasks.grpo_stages import commit_version, marker_path, publish_weights
from tasks.reporting import BackgroundReports, report_iteration


def version_history(run_dir: Path, upto: int) -> list[dict[str, Any]]:
    """The committed metrics of versions 0..upto that have any (for reports and summaries)."""
    rows = []
    for version in range(upto + 1):
        path = marker_path(run_dir, version)
        if path.exists():
            metrics = json.loads(path.read_text())["metrics"]
            if metrics:
                rows.append({"version": version, **metrics})
    return rows


def publish_version(
    trainer: Any,
    engines: Sequence[Any],
    version: int,
    config: dict,
    *,
    run_id: str,
    run_dir: Path,
    checkpoints: CheckpointStore,
    lineage: LineageRecorder,
    data: Sequence[DataRef] = (),
    metrics: dict[str, float] | None = None,
    primer_state: dict | None = None,
    weight_sync: Any = None,
    reports: BackgroundReports | None = None,
) -> dict[str, Any]:
    """Publish ``version``; returns the checkpoint info (path, sha256). ``weight_sync``: an open NCCL weight group
    (tasks/weight_sync.py) that carries the weights to the engines instead of a checkpoint load. ``reports``: the
    version's report is written in the background (beside the next iteration) instead of before returning."""
    info = publish_weights(trainer, list(engines), version, config, weight_sync)
    lineage.log_version(version, checkpoint=checkpoints.manifest(version), data=list(data), metrics=metrics or None)
    commit_version(run_dir, version, primer_state, metrics or {})
    if version > 0 and reports is not None:
        reports.submit(run_id, version_history(run_dir, version), run_dir / "reports", lineage)
    elif version > 0:
        report_iteration(run_id, version_history(run_dir, version), run_dir / "reports", lineage)
    return info
