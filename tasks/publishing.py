"""Publishing a policy version, shared by the grpo, sft and offline flows.

What makes a version count, in order: its weights written and loaded into the rollout engines, its checkpoint
sealed (sha256, manifest, optimizer/RNG state: on the trainer, once the engines hold it), MLflow lineage, the
commit marker (written last), then the per-version report. :func:`publish_version` does it all in one call;
:func:`start_publish` stops once the engines hold the version and leaves the rest to
:meth:`PendingPublish.complete`, which the GRPO flow calls as soon as it has sent the next batch's rollouts (the
seal, the lineage, the commit marker and the report run beside them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage.checkpoints import CheckpointStore
from storage.lineage import DataRef, LineageRecorder
from tasks.commits import commit_version, marker_path
from tasks.grpo_stages import StagedVersion, publish_weights, seal_checkpoint
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


@dataclass
class PendingPublish:
    """A version the rollout engines already hold whose commit is still to come: :meth:`complete` waits for the
    trainer's seal of its checkpoint, logs its lineage, writes the commit marker and starts its report.

    The GRPO flow completes it once the next batch's rollouts are sent, while the engines sample them (the
    trainer seals meanwhile); until then the version is not published (a resume starts before it). The check
    that the engines hold the version's weights (fingerprints) is part of it, so it runs before the trainer
    touches the rows those engines sample."""

    staged: StagedVersion
    run_id: str
    run_dir: Path
    checkpoints: CheckpointStore
    lineage: LineageRecorder
    data: list[DataRef]
    metrics: dict[str, float]
    primer_state: dict | None
    reports: BackgroundReports | None
    markers_uri: str | None = None
    traces: list[dict[str, Any]] | None = None  # the trained-on rollouts to show as MLflow traces (its report)

    def complete(self) -> dict[str, Any]:
        """Commit the version (see the class); returns the checkpoint info (path, sha256)."""
        version = self.staged.version
        info = seal_checkpoint(self.staged)
        metrics = self.metrics
        if metrics:  # an iteration's metrics, with what its publish cost (version 0 has none)
            metrics = {**metrics, **self.staged.seconds, "seal_s": info["seconds"]}
        self.lineage.log_version(
            version,
            weights_fingerprints=info["fingerprints"],
            checkpoint=self.checkpoints.manifest(version),
            checkpoint_uri=self.checkpoints.weights_uri(version),
            data=list(self.data),
            metrics=metrics or None,
        )
        commit_version(self.run_dir, version, self.primer_state, metrics, self.markers_uri)
        self.lineage.mark_pruned(self.checkpoints.versions())  # the lineage of versions keep_checkpoints deleted
        if version > 0:  # in the background beside the next iteration, or now
            report = self.reports.submit if self.reports is not None else report_iteration
            history = version_history(self.run_dir, version)
            report(self.run_id, history, self.run_dir / "reports", self.lineage, self.traces)
        return info


def start_publish(
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
    updater: Any = None,
    reports: BackgroundReports | None = None,
    markers_uri: str | None = None,
    traces: list[dict[str, Any]] | None = None,
) -> PendingPublish:
    """Load ``version`` into the engines (the trainer seals its checkpoint meanwhile) and return what is left to
    do to publish it. ``updater``: the run's :class:`~runtime.weight_sync.EngineActorsUpdater` (an NCCL, gloo or CUDA
    IPC scheme instead of checkpoint loads; default: checkpoint loads). ``reports``: the version's report is written
    in the background
    (beside the next iteration) instead of before :meth:`PendingPublish.complete` returns. ``markers_uri``: where
    the commit marker is copied for other flow hosts (:func:`tasks.commits.commit_version`). ``traces``: a
    sample of the rollouts the version was trained on, logged as MLflow traces with its report."""
    staged = publish_weights(trainer, list(engines), version, config, updater)
    return PendingPublish(
        staged,
        run_id,
        run_dir,
        checkpoints,
        lineage,
        list(data),
        metrics or {},
        primer_state,
        reports,
        markers_uri,
        traces,
    )


def publish_version(trainer: Any, engines: Sequence[Any], version: int, config: dict, **publish: Any) -> dict[str, Any]:
    """Publish ``version`` now: :func:`start_publish` (same arguments) and complete it; returns the checkpoint
    info (path, sha256)."""
    return start_publish(trainer, engines, version, config, **publish).complete()
