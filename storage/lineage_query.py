"""Read lineage back: find a training run's MLflow records and answer "what produced version N?".

The answer combines the version's lineage JSON (written by :class:`storage.lineage.LineageRecorder`),
the run's tags (code version, config hash), the run inputs tagged with the data's policy version,
the metrics logged at ``step = N`` and the LoggedModel of the version.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Run  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402

from storage.lineage import (  # noqa: E402
    LineageError,
    default_tracking_uri,
    find_run,
    tracking_root,
    version_artifact_path,
)


def recorded_versions(client: MlflowClient, run: Run) -> list[int]:
    """Policy versions that have a lineage record in a run, ascending."""
    try:
        entries = client.list_artifacts(run.info.run_id, "lineage")
    except (MlflowException, OSError):
        return []
    found = []
    for entry in entries:
        name = Path(entry.path).name
        if name.startswith("policy_version=") and name.endswith(".json"):
            found.append(int(name.removeprefix("policy_version=").removesuffix(".json")))
    return sorted(found)


def version_lineage(
    run_id: str,
    policy_version: int,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    tracking_uri: str | None = None,
) -> dict[str, Any]:
    """Which data, config, code and parent weights produced ``policy_version`` of ``run_id``.

    Give the tracking URI, or the run directory (the default sqlite store of its runs root is used).
    """
    if tracking_uri is None:
        if run_dir is None:
            raise LineageError("give run_dir or tracking_uri")
        db = tracking_root(run_dir) / "mlflow.db"
        if not db.is_file():
            raise LineageError(f"no lineage store at {db}")
        tracking_uri = default_tracking_uri(run_dir)
    client = MlflowClient(tracking_uri=tracking_uri)
    run = find_run(client, run_id)
    with tempfile.TemporaryDirectory() as folder:
        try:
            local = client.download_artifacts(run.info.run_id, version_artifact_path(policy_version), folder)
        except (MlflowException, OSError) as err:
            known = recorded_versions(client, run)
            raise LineageError(
                f"run {run_id!r} has no lineage record for policy version {policy_version} (recorded: {known})"
            ) from err
        record = json.loads(Path(local).read_text(encoding="utf-8"))
    tags = run.data.tags
    inputs = []
    for item in run.inputs.dataset_inputs if run.inputs else []:
        input_tags = {t.key: t.value for t in item.tags}
        inputs.append(
            {
                "name": item.dataset.name,
                "digest": item.dataset.digest,
                "source": json.loads(item.dataset.source).get("uri", item.dataset.source),
                "policy_version": int(input_tags["policy_version"]) if "policy_version" in input_tags else None,
                "context": input_tags.get("mlflow.data.context"),
                "kind": input_tags.get("llmrl_kind"),
            }
        )
    step_metrics = {}
    for key in run.data.metrics:
        for point in client.get_metric_history(run.info.run_id, key):
            if point.step == policy_version:
                step_metrics[key] = point.value
    experiment = client.get_experiment(run.info.experiment_id)
    model_tags = client.get_logged_model(record["model_id"]).tags if record.get("model_id") else {}
    return {
        **record,
        "checkpoint_state": (model_tags or {}).get("checkpoint") or None,  # kept | pruned (None: recorded before)
        "tracking_uri": tracking_uri,
        "experiment": experiment.name,
        "run_status": run.info.status,
        "run_git_commit": tags.get("mlflow.source.git.commit"),
        "run_config_hash": tags.get("llmrl_config_hash"),
        "step_metrics": step_metrics,
        "run_inputs": inputs,
    }


def format_lineage(info: dict[str, Any]) -> str:
    """Human-readable lineage report for the CLI."""
    dirty = "  (dirty tree)" if info.get("git_dirty") else ""
    lines = [
        f"run {info['run_id']}  policy version {info['policy_version']}",
        f"  pipeline      {info['pipeline']} (experiment {info['experiment']!r}, MLflow run {info['mlflow_run_id']})",
        f"  model         {info.get('model_id')}",
        f"  code          git {info.get('git_commit') or 'unknown'}{dirty}",
        f"  config hash   {info.get('config_hash')}",
    ]
    parent = info.get("parent_version")
    lines.append(f"  parent        version {parent}" if parent is not None else "  parent        none (base weights)")
    if info.get("parent_model_id"):
        lines[-1] += f"  model {info['parent_model_id']}"
    checkpoint = info.get("checkpoint")
    if checkpoint:
        pruned = "  (pruned: deleted by keep_checkpoints)" if info.get("checkpoint_state") == "pruned" else ""
        lines.append(f"  checkpoint    {info.get('checkpoint_uri') or checkpoint['weights_file']}{pruned}")
        lines.append(f"                sha256 {checkpoint['sha256']}  dtype {checkpoint['dtype']}")
    lines.append("  data:")
    for ref in info.get("data") or []:
        version = f" (sampled by version {ref['policy_version']})" if ref.get("policy_version") is not None else ""
        lines.append(f"    - {ref['name']}{version}  rows={ref.get('num_rows')}  digest={ref['digest'][:16]}")
        lines.append(f"      {ref['source']}")
    if not info.get("data"):
        lines.append("    (none recorded)")
    if info.get("params"):
        lines.append("  params:  " + ", ".join(f"{k}={v}" for k, v in sorted(info["params"].items())))
    metrics = info.get("step_metrics") or info.get("metrics") or {}
    if metrics:
        lines.append("  metrics: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
    lines.append(f"  tracking      {info['tracking_uri']}")
    return "\n".join(lines)
