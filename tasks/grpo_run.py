"""The GRPO flow's steps (:mod:`flows.grpo` runs them in the order of its diagram): where a run attempt starts, its
records (run lock, MLflow lineage, Prefect identity, checkpoint store), the resident actors and the weight route,
one iteration, and the run's summary."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from llmrl_core.pipeline.grpo_config import GRPOConfig
from runtime.actor_calls import wait_calls
from runtime.cluster import dask_cluster
from runtime.console import library_logs, progress_bar
from runtime.rollout_actor import RolloutWorker
from runtime.trainer_actor import TrainerWorker
from runtime.trainer_ranks import TrainerRanks
from runtime.weight_sync import choose_weight_route, endpoint_of, updater_for
from storage.checkpoints import CheckpointStore
from storage.hashing import config_hash
from storage.layout import RunLayout
from storage.lineage import LineageConfig, LineageRecorder
from storage.run_lock import RunLock
from storage.trajectories import TrajectoryStore
from tasks import commits
from tasks import grpo_stages as stages
from tasks.fork import resolve_fork, start_from_fork
from tasks.iteration_log import (
    agreement_off_line,
    bar_postfix,
    failed_agent_episodes,
    failed_episodes_line,
    iteration_lines,
    iteration_metrics,
)
from tasks.publishing import PendingPublish, publish_version, start_publish
from tasks.reporting import BackgroundReports
from tasks.rollout_ahead import RolloutAhead
from tasks.run_identity import identify_run


def iteration_bar(cfg: GRPOConfig, start: int) -> Any:
    """The console's bar (:func:`~runtime.console.progress_bar`) over the run's versions (``None`` when
    ``cfg.progress`` is off)."""
    return progress_bar(cfg.iterations, f"grpo {cfg.run_id}", "version", initial=start, enabled=cfg.progress)


@dataclass
class ResumePoint:
    """Where a run attempt starts: its layout, the last committed version (``published``: ``(version, marker)``,
    None for a new run), the data cursor, the fork it starts from, and whether the trainer state is there."""

    layout: RunLayout
    published: tuple[int, dict[str, Any]] | None
    start: int
    primer_state: Any
    fork: Any
    with_state: bool

    @property
    def run_dir(self) -> Any:
        """The run's own folder (config, commit markers, reports, logs)."""
        return self.layout.run_dir


def resume_point(cfg: GRPOConfig, log: Any) -> ResumePoint:
    """The last committed version (markers fetched from a remote ``runs_dir`` first), said in one line."""
    layout = RunLayout.for_runs_dir(cfg.run_id, cfg.runs_dir)  # a remote runs_dir: the workers' data goes there
    fetched = commits.fetch_markers(layout.run_dir, layout.markers_uri)  # versions another host committed
    published = commits.latest_published(layout.run_dir)
    start = published[0] if published else 0
    primer_state = published[1]["primer_state"] if published else None
    fork = resolve_fork(cfg.run_id, cfg.runs_dir, cfg.init) if published is None else None  # a resume goes on
    with_state = start == 0 or commits.check_resume_state(layout, start, cfg.train.resume_without_state)
    if fork is not None and cfg.init.data_cursor:
        primer_state = fork.primer_state
    how = f"resuming at version {start}" if published else f"new run, forked from {fork.label}" if fork else "new run"
    log.info("run %s: %s (versions %d..%d)", cfg.run_id, how, start, cfg.iterations)
    if fetched:
        log.info("versions %s were committed from another flow host (markers fetched from runs_dir)", fetched)
    return ResumePoint(layout, published, start, primer_state, fork, with_state)


def open_records(cfg: GRPOConfig, point: ResumePoint, log: Any) -> tuple[ExitStack, LineageRecorder, Any]:
    """The run's lock, its MLflow lineage run, its Prefect identity and its checkpoint store, with the libraries'
    logs in ``<run>/logs/`` (``llmrl run ... -v``: on the console) until the returned stack closes."""
    quiet = ExitStack()
    quiet.enter_context(library_logs(point.run_dir))
    try:
        quiet.enter_context(RunLock(point.run_dir, cfg.run_id))  # one flow per run at a time: a second is refused
        lineage = LineageRecorder(
            point.run_dir,
            pipeline="grpo",
            run_id=cfg.run_id,
            config=stages.lineage_config(cfg),
            lineage_config=LineageConfig(tracking_uri=cfg.tracking_uri),
            accepted_hashes={config_hash(stages.lineage_config(cfg, keep_where=True))},  # as recorded before WHERE_ONLY
            new_run=point.published is None,
        )
        if lineage.replaced_run:
            log.info(commits.replaced_line(cfg.run_id, lineage.replaced_run))
        identify_run(cfg.run_id, point.start, cfg.iterations, lineage)  # the Prefect run named after it, both UIs
        checkpoints = CheckpointStore(point.layout.checkpoints_uri)
        commits.save_run_config(point.run_dir, stages.lineage_config(cfg))
    except BaseException:
        quiet.close()
        raise
    return quiet, lineage, checkpoints


@dataclass
class GrpoRun:
    """What the iterations use: the config, the resident actors, and where a version is published to."""

    cfg: GRPOConfig
    log: Any
    store_uri: str
    engines: list[Any]
    trainer: Any
    ranks: TrainerRanks
    config_dict: dict[str, Any]
    published_to: dict[str, Any]
    lineage: LineageRecorder
    closing: ExitStack  # what leaving the run closes (the libraries' logs, the run lock, the console's bar)


def start_actors(
    cfg: GRPOConfig,
    place: Any,
    point: ResumePoint,
    lineage: Any,
    checkpoints: Any,
    reports: Any,
    log: Any,
    closing: ExitStack,
) -> GrpoRun:
    """The rollout engines and the trainer(s), resident on their workers, and the route new weights take to the
    engines; said in three lines (start-up time, dtypes and devices, the route and why)."""
    t0 = time.perf_counter()
    # each worker resolves cfg.model itself (the packaged default: under its own $LLMRL_HOME)
    engines = [place.start_actor(RolloutWorker, cfg, worker=a) for a in place.rollout]
    others = [place.start_actor(TrainerWorker, cfg, layout=point.layout, worker=a) for a in place.trainer_ranks]
    trainer = place.start_actor(TrainerWorker, cfg, layout=point.layout, worker=place.trainer).result()
    ranks = TrainerRanks(trainer, [t.result() for t in others])
    engines = [e.result() for e in engines]
    if joined := ranks.join(place.trainer):
        log.info(joined)
    log.info("%d rollout engine(s) and the trainer are resident (%.1f s)", len(engines), time.perf_counter() - t0)
    *described, trainer_described = wait_calls(
        [*((e, e.describe()) for e in engines), (trainer, trainer.describe())], "start-up"
    )
    hardware = {**described[0], **trainer_described}
    if len({d["rollout_device"] for d in described}) > 1:  # a joined cluster may mix CPU and GPU engines
        hardware["rollout_device"] = "mixed"
    log.info(
        "rollouts in %s on %s (%s); training in %s on %s (%s)",
        hardware["rollout_dtype"],
        hardware["rollout_device"],
        hardware["rollout_dtype_reason"],
        "bf16 autocast" if hardware["trainer_precision"] == "bf16" else "float32",
        hardware["trainer_device"],
        hardware["trainer_precision_reason"],
    )
    route = choose_weight_route(
        cfg.rollout.weight_sync,
        endpoint_of(trainer_described, "trainer"),
        [endpoint_of(d, "rollout") for d in described],
    )
    hardware["weight_route"] = f"{route.name} ({route.reason})"
    lineage.set_tags({f"llmrl.{k}": v for k, v in hardware.items() if k not in ("host", "gpus")})
    updater = updater_for(route, trainer, engines, place.trainer)
    shared = (
        updater.mode == "checkpoint"
        and place.engines_beside_trainer
        and len({d["rollout_dtype"] for d in described}) == 1
        and wait_calls([(trainer, trainer.share_weights(hardware["rollout_dtype"]))], "start-up")[0]
    )
    how = "shared memory (a file in /dev/shm, rewritten in place)" if shared else updater.description
    log.info("new versions reach the engines by %s; why: %s", how, route.reason)
    published_to = dict(
        run_id=cfg.run_id,
        run_dir=point.run_dir,
        checkpoints=checkpoints,
        lineage=lineage,
        updater=updater,
        reports=reports,
        markers_uri=point.layout.markers_uri,
    )
    config_dict = stages.lineage_config(cfg)
    return GrpoRun(
        cfg, log, point.layout.trajectories_uri, engines, trainer, ranks, config_dict, published_to, lineage, closing
    )


def iteration(
    run: GrpoRun, ahead: RolloutAhead, version: int, pending: PendingPublish | None, bar: Any
) -> PendingPublish:
    """One iteration: rollouts (sent ahead) -> reference KL -> advantages and trajectories -> train -> publish
    ``version + 1`` (committed beside the next iteration's rollouts); returns that pending publish."""
    cfg, log = run.cfg, run.log
    t_iter = time.perf_counter()
    ahead.send(version + cfg.rollout.max_staleness)  # sampled by `version` while the trainer trains
    if pending is not None:  # committed beside the rollouts now in flight (the trainer seals meanwhile)
        pending.complete()  # also checks the engines that sample them hold the trainer's weights
    arrived = ahead.take(version)
    batch, shards = arrived.batch, arrived.shards
    sampled = batch.policy_version
    failed_line, failed_share = failed_agent_episodes(sampled, shards)
    if failed_line and failed_share > cfg.rollout.max_failed_fraction:  # before it trains: a resume samples again
        raise stages.EpisodesFailed(
            f"{failed_line}: more than rollout.max_failed_fraction={cfg.rollout.max_failed_fraction} of the batch "
            f"failed, so the run stopped at version {version}"
        )
    if failed_line:
        log.warning(failed_line)
    ref_info = stages.score_reference(run.trainer, batch.staging_uri, sampled) if cfg.train.kl_coef > 0 else {}
    written = stages.write_trajectories(cfg, batch.staging_uri, run.store_uri, sampled, batch.shard_prefix)
    t_train = time.perf_counter()
    train_metrics = stages.train.submit(run.ranks, run.store_uri, batch).result()
    train_s = time.perf_counter() - t_train
    if disagree := agreement_off_line(version, train_metrics, cfg):
        if cfg.train.agreement_stop:  # version + 1 is not published: a resume samples version `version` again
            raise stages.AgreementOff(f"{disagree} Stopped (train.agreement_stop); version {version} is kept")
        log.warning(disagree)
    if skipped := failed_episodes_line(version, shards):
        log.warning(skipped)
    metrics = iteration_metrics(
        shards, written, ref_info, train_metrics, sampled=sampled, trainer_wait_s=arrived.wait_s, train_s=train_s
    )
    metrics["iteration_s"] = time.perf_counter() - t_iter
    pending = start_publish(
        run.trainer,
        run.engines,
        version + 1,
        run.config_dict,
        metrics=metrics,
        primer_state=arrived.primer_state,
        traces=written["trace_sample"],
        **run.published_to,
    )
    # the trained-on partition's lineage input, once the engines hold the new version (off the critical path)
    store = TrajectoryStore(run.store_uri)
    pending.data.append(run.lineage.log_trajectory_partition(store, sampled, shard_prefix=batch.shard_prefix))
    ahead.published(version + 1)
    if bar is not None:
        bar.update(1)
        bar.set_postfix(**bar_postfix(metrics))
    for line in iteration_lines(version, metrics, written, batch.staleness):
        log.info("%s", line)
    return pending


def finish(
    cfg: GRPOConfig,
    point: ResumePoint,
    lineage: LineageRecorder,
    log: Any,
    final_evaluation: Callable[[GRPOConfig, int], dict[str, Any]],
) -> dict[str, Any]:
    """The run's summary, with the held-out evaluation of its last version (``final_eval.questions > 0``:
    ``final_evaluation(cfg, version)``, the evaluate flow run as a subflow)."""
    summary = {
        "run_id": cfg.run_id,
        "published_version": max(point.start, cfg.iterations),
        "trajectories": point.layout.trajectories_uri,
        "checkpoints": point.layout.checkpoints_uri,
        "mlflow_tracking_uri": lineage.tracking_uri,
        "run_dir": str(point.run_dir),
        "curves": str(point.run_dir / "reports" / "curves.png"),
    }
    final = summary["published_version"]
    if cfg.final_eval.questions > 0 and final > 0:
        with library_logs(point.run_dir):
            summary["final_eval"] = final_evaluation(cfg, final)
        log.info("%s", summary["final_eval"]["line"])
    log.info("done: %s", summary)
    return summary


@contextmanager
def resident_run(cfg: GRPOConfig, point: ResumePoint, log: Any) -> Iterator[GrpoRun]:
    """The run's records (:func:`open_records`), its Dask cluster, its background reports and its resident actors
    (:func:`start_actors`) for the block; leaving it waits for the last report and closes them all."""
    closing, lineage, checkpoints = open_records(cfg, point, log)
    with closing, lineage, dask_cluster(cfg, point.run_dir / "dask") as place, BackgroundReports() as reports:
        yield start_actors(cfg, place, point, lineage, checkpoints, reports, log, closing)


def first_version(run: GrpoRun, point: ResumePoint) -> None:
    """Before the first iteration: a new run publishes version 0 (the base model, or the fork's weights); a resumed
    one restores the trainer at its last version (the engines get each batch's weights when it is sent)."""
    if point.published is None:
        if point.fork is not None:
            start_from_fork(run.ranks, point.fork, run.lineage)
        info = publish_version(run.trainer, run.engines, 0, run.config_dict, **run.published_to)
        run.log.info("version 0 (base model) published: %s", info["checkpoint"])
    elif point.start > 0:
        run.ranks.call_all("restore", point.start, stage="resume", version=point.start)
        if not point.with_state:
            run.log.warning(
                "version %d resumed from its weights alone: a fresh optimizer (train.resume_without_state)",
                point.start,
            )


def rollouts_ahead(run: GrpoRun, point: ResumePoint) -> RolloutAhead:
    """The batches' dispatcher, with the batches that must be in flight before training ``point.start`` sent
    (asynchronous runs: ``rollout.max_staleness`` of them)."""
    checkpoints = run.published_to["checkpoints"]
    ahead = RolloutAhead(run.cfg, point.layout.staging_uri, run.engines, checkpoints, 0, point.primer_state)
    ahead.fill(point.start)
    return ahead
