"""Print a finished GRPO run's per-version metrics from its MLflow store, one row per version.

    python bench/run_metrics.py RUNS_DIR RUN_ID [--keys publish_write_s,publish_load_s,...] [--json OUT]

RUNS_DIR is the run's ``runs_dir`` (its MLflow store is ``RUNS_DIR/mlflow.db``). The default keys are where a
version's time and memory go: the weight hand-over (``publish_write_s``: the trainer's weights file,
``publish_load_s``: the engines' load or the broadcast / CUDA IPC hand-over), the engines' own reload, rollout and
train seconds, the sampler/trainer agreement and, on a GPU, each process's peak CUDA memory (GiB).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_KEYS = (
    "publish_write_s",
    "publish_load_s",
    "engine_reload_s",
    "rollout_s",
    "train_s",
    "iteration_s",
    "agreement_abs_diff_mean",
    "train_cuda_peak_gib",
    "train_cuda_reserved_gib",
    "engine_cuda_peak_gib",
    "engine_cuda_reserved_gib",
)


def per_version(runs_dir: str, run_id: str, keys: tuple[str, ...]) -> dict[int, dict[str, float]]:
    """``{version: {key: value}}`` of the run's logged metrics (the MLflow step is the version)."""
    from mlflow.tracking import MlflowClient

    from storage.lineage_query import find_run

    client = MlflowClient(tracking_uri=f"sqlite:///{Path(runs_dir).absolute() / 'mlflow.db'}")
    run = find_run(client, run_id)
    rows: dict[int, dict[str, float]] = {}
    for key in keys:
        for m in client.get_metric_history(run.info.run_id, key):
            rows.setdefault(int(m.step), {})[key] = float(m.value)
    return dict(sorted(rows.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs_dir")
    parser.add_argument("run_id")
    parser.add_argument("--keys", default=",".join(DEFAULT_KEYS))
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args()
    keys = tuple(k for k in args.keys.split(",") if k)
    rows = per_version(args.runs_dir, args.run_id, keys)
    shown = [k for k in keys if any(k in r for r in rows.values())]
    print("version " + " ".join(f"{k:>24}" for k in shown))
    for version, row in rows.items():
        print(f"{version:7d} " + " ".join(f"{row.get(k, float('nan')):24.4g}" for k in shown))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
