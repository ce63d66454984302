"""Forks (N7): a new run that starts from a published version of another run (``--set init.from=RUN@V``).

:func:`resolve_fork` checks the starting point before anything starts — the source run exists under the same
runs root, ``V`` is published and its checkpoint was kept — and returns what the flow needs: the source's
layout (its checkpoint and trainer state), and its data cursor at ``V``. The trainer then restores that
version (:meth:`runtime.trainer_actor.TrainerWorker.restore` with ``source=``) and the new run publishes it as its
version 0; its MLflow run is a child of the source's (``mlflow.parentRunId``) and every lineage record names the
fork point. A forked run that has versions of its own resumes from them (the fork applied at its start).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage.checkpoints import CheckpointStore
from storage.layout import RunLayout
from tasks.commits import marker_path, published_versions


@dataclass(frozen=True)
class Fork:
    """A new run's starting point: version ``version`` of run ``source_run`` (laid out at ``source``)."""

    source_run: str
    version: int
    source: RunLayout
    primer_state: dict[str, Any] | None  # the source's data cursor after that version's rollouts

    @property
    def label(self) -> str:
        """``RUN@V``."""
        return f"{self.source_run}@{self.version}"


def resolve_fork(run_id: str, runs_dir: str | None, init: Any) -> Fork | None:
    """The fork ``init`` (an ``InitConfig``) asks for, checked; None when it asks for none. Raises ``ValueError``
    naming ``init.from`` when the source run, its version or that version's checkpoint is missing."""
    found = init.source()
    if found is None:
        return None
    source_run, version = found
    if source_run == run_id:
        raise ValueError(f"init.from: a run cannot fork itself ({run_id!r}); give the new run another run_id")
    layout = RunLayout.for_runs_dir(source_run, runs_dir)
    published = published_versions(layout.run_dir)
    if not published:
        raise ValueError(f"init.from: run {source_run!r} has no published version under {layout.run_dir.parent}")
    if version is None:
        version = published[-1]
    if version not in published:
        raise ValueError(f"init.from: run {source_run!r} has not published version {version} (published: {published})")
    kept = CheckpointStore(layout.checkpoints_uri).versions()
    if version not in kept:
        raise ValueError(
            f"init.from: the checkpoint of {source_run}@{version} was not kept (keep_checkpoints / keep_every); "
            f"kept versions: {kept}"
        )
    marker = json.loads(marker_path(layout.run_dir, version).read_text())
    return Fork(source_run, version, layout, marker.get("primer_state"))


def check_fork(cfg: Any) -> Fork | None:
    """The fork a run config asks for, checked as the flow will (``ValueError`` when it cannot start); None for
    a run without ``init.from``, or one that already has versions (it resumes from them)."""
    layout = RunLayout.for_runs_dir(cfg.run_id, cfg.runs_dir)
    if getattr(cfg, "init", None) is None or published_versions(layout.run_dir):
        return None
    return resolve_fork(cfg.run_id, cfg.runs_dir, cfg.init)


def fork_tree(runs_root: Path, run_id: str) -> list[tuple[int, str, str]]:
    """The runs forked from ``run_id`` under ``runs_root``, depth first: ``(depth, run, fork point)`` from each
    run's ``config.json`` (its ``init.from``)."""
    parents: dict[str, list[tuple[str, str]]] = {}
    for config in sorted(runs_root.glob("*/config.json")):
        try:
            point = (json.loads(config.read_text()).get("init") or {}).get("from_")
        except (OSError, ValueError):
            continue
        if point:
            parents.setdefault(point.partition("@")[0], []).append((config.parent.name, point))
    tree: list[tuple[int, str, str]] = []

    def walk(run: str, depth: int) -> None:
        for child, point in parents.get(run, []):
            tree.append((depth, child, point))
            walk(child, depth + 1)

    walk(run_id, 1)
    return tree


def start_from_fork(ranks: Any, fork: Fork, lineage: Any) -> None:
    """Load the fork point into the resident trainer, every rank of it (``ranks``: a
    :class:`~runtime.trainer_ranks.TrainerRanks`; weights, and the optimizer and RNG state when the source kept them:
    a warning says when it did not) and record the fork in ``lineage``."""
    import logging

    if not ranks.call_all("restore", fork.version, fork.source, stage="fork restore", version=fork.version):
        logging.getLogger("llmrl.fork").warning(
            "%s: the source kept no optimizer state for that version (a run keeps its last two): the fork starts "
            "from its weights with a fresh optimizer",
            fork.label,
        )
    lineage.mark_fork(fork.source_run, fork.version)
