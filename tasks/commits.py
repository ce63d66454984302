"""The commit protocol every training flow shares (grpo, sft, offline): when a version counts, and where a
resume starts.

A version counts once its commit marker ``RUN/state/published-v<N>.json`` exists (written last, atomically, with
the data cursor and the iteration's metrics; on a remote ``runs_dir`` the data store gets it first, so another
flow host resumes from it). A resume starts after the newest marker and needs the trainer's optimizer/RNG state of
that version (or ``train.resume_without_state``). ``RUN/config.json`` holds the settings that define the versions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
from prefect import task

from storage.filesystems import read_bytes, resolve_filesystem, write_bytes_atomic
from storage.lineage import flatten_config
from tasks.grpo_stages import STAGE, version_defining


def check_resume_state(layout: Any, version: int, without_state: bool) -> bool:
    """Whether the optimizer/RNG state a resume at ``version`` restores is there (``layout``: the run's
    :class:`~storage.layout.RunLayout`). Missing, it is an error naming the file, unless ``without_state``
    (``train.resume_without_state``): then the resume takes the weights alone and the caller says so."""
    fs, path = layout.trainer_state_file(version)
    if fs.get_file_info(path).type == pafs.FileType.File:
        return True
    if not without_state:
        raise RuntimeError(
            f"resuming at version {version}: its optimizer/RNG state {path} is missing, so the optimizer would start "
            "afresh; set train.resume_without_state=true to resume from the weights alone"
        )
    return False


def marker_path(run_dir: Path, version: int) -> Path:
    """The file whose presence means ``version`` is fully published (written last, atomically)."""
    return run_dir / "state" / f"published-v{version}.json"


def marker_version(name: str) -> int | None:
    """The version a commit marker's file name (``published-v<N>.json``) names; None for any other name."""
    stem = name.removeprefix("published-v").removesuffix(".json")
    return int(stem) if name.startswith("published-v") and name.endswith(".json") and stem.isdigit() else None


def published_versions(run_dir: Path) -> list[int]:
    """The fully published versions of the run in ``run_dir`` (those with a commit marker), ascending."""
    return sorted(v for p in (run_dir / "state").glob("published-v*.json") if (v := marker_version(p.name)) is not None)


def latest_published(run_dir: Path) -> tuple[int, dict] | None:
    """The highest fully published version and its marker contents, or None for a new run."""
    found = published_versions(run_dir)
    if not found:
        return None
    return found[-1], json.loads(marker_path(run_dir, found[-1]).read_text())


@task(name="commit-version", **STAGE)
def commit_version(
    run_dir: Path, version: int, primer_state: dict | None, metrics: dict, markers_uri: str | None = None
) -> str:
    """Mark ``version`` fully published: the data cursor for its rollouts and the iteration's metrics.

    ``markers_uri``: a folder of the data store (:attr:`RunLayout.markers_uri`) that gets the same marker first,
    so a flow on another host can resume the run (:func:`fetch_markers`)."""
    data = json.dumps({"version": version, "primer_state": primer_state, "metrics": metrics}, indent=2).encode()
    path = marker_path(run_dir, version)
    for folder in ([markers_uri] if markers_uri is not None else []) + [str(path.parent)]:  # the local one last
        fs, where = resolve_filesystem(folder)
        write_bytes_atomic(fs, f"{where}/{path.name}", data)
    return str(path)


def fetch_markers(run_dir: Path, markers_uri: str | None) -> list[int]:
    """Copy the commit markers this flow host lacks from ``markers_uri`` into ``run_dir/state`` (a run started or
    continued on another host); returns the versions copied. Nothing to do without a ``markers_uri``."""
    if markers_uri is None:
        return []
    fs, folder = resolve_filesystem(markers_uri)
    local, _ = resolve_filesystem(str(run_dir))
    copied = []
    for entry in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)):
        version = marker_version(entry.base_name)
        if version is not None and not marker_path(run_dir, version).exists():
            write_bytes_atomic(local, str(marker_path(run_dir, version)), read_bytes(fs, entry.path))
            copied.append(version)
    return sorted(copied)


def changed_settings(run_dir: Path, config: dict) -> list[str]:
    """The settings (``section.key: recorded -> now``) in which ``config`` (a run's lineage settings) differs from
    the run's ``RUN/config.json``; [] when they agree or when this flow host has no record of the run. A record
    written before a setting left the lineage (:func:`tasks.grpo_stages.version_defining`) is read without it."""
    path = run_dir / "config.json"
    if not path.is_file():
        return []
    recorded = flatten_config(version_defining(json.loads(path.read_text())))
    now = flatten_config(json.loads(json.dumps(config, default=str)))  # as save_run_config wrote it
    return [
        f"{key}: {recorded.get(key)} -> {now.get(key)}"
        for key in sorted(set(recorded) | set(now))
        if recorded.get(key) != now.get(key)
    ]


def check_unchanged_config(run_id: str, run_dir: Path, config: dict) -> None:
    """A ``ValueError`` naming the settings a resume of ``run_id`` would change (the versions it has were made with
    the recorded ones): before the flow, its Prefect API or any engine starts. A run with no published version
    (its first attempt failed before publishing the starting model) takes the new settings; one with only version
    0 (the starting model, nothing trained) is refused with how to start it over."""
    published = latest_published(run_dir)
    changes = changed_settings(run_dir, config) if published is not None else []
    if changes:
        shown = "; ".join(changes[:5]) + (f"; and {len(changes) - 5} more" if len(changes) > 5 else "")
        remedy = (
            f"no version of it was trained yet: remove {run_dir} to start it over with these settings, or use a "
            "new run id"
            if published is not None and published[0] == 0
            else "a changed config needs a new run id (or the recorded values back, see RUN/config.json)"
        )
        raise ValueError(f"run {run_id!r} exists with other settings ({shown}): {remedy}")


def replaced_line(run_id: str, mlflow_run_id: str) -> str:
    """The log line of a new run that replaced an MLflow record of an earlier attempt with other settings."""
    return (
        f"run {run_id}: an earlier attempt with other settings published no version; its MLflow run {mlflow_run_id} "
        f"is deleted and a new one recorded (mlflow runs restore --run-id {mlflow_run_id} brings it back)"
    )


def save_run_config(run_dir: Path, config: dict) -> Path:
    """``RUN/config.json``: the run's settings, written atomically (the evaluate flow reads its task)."""
    path = run_dir / "config.json"
    write_bytes_atomic(pafs.LocalFileSystem(), str(path), json.dumps(config, indent=2, default=str).encode())
    return path
