"""Flow ``grpo``: iterative GRPO, one policy version per iteration, stage by stage.

    prompts -> rollouts (resident vLLM engines) -> reference KL (if kl_coef > 0) -> advantages
            -> trajectories (Parquet, by policy version) -> train (resident trainer) -> publish weights
            -> lineage (MLflow) -> commit

A version is *published* once its commit marker exists (checkpoint, optimizer/RNG state, engines loaded,
lineage logged, data cursor saved). The engines get a new version as soon as its weights file is written; the
rest of its publish (checkpoint file, hash and manifest, optimizer state, then lineage and marker) completes
beside the next batch's rollouts. Running the same run id
again resumes after the last published version: that iteration's partition is rebuilt from scratch (same prompts,
same seeds), nothing published is repeated. Run it with
``llmrl run grpo [--config x.yaml] [--set section.key=value ...]``.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from prefect import flow, get_run_logger

from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.pipeline.preflight import final_eval_source, preflight
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
from tasks.run_identity import attempts, identify_run, named_at_creation


def iteration_bar(cfg: GRPOConfig, start: int) -> Any:
    """The console's bar (:func:`~runtime.console.progress_bar`) over the run's versions (``None`` when
    ``cfg.progress`` is off)."""
    return progress_bar(cfg.iterations, f"grpo {cfg.run_id}", "version", initial=start, enabled=cfg.progress)


@flow(
    name="grpo", flow_run_name=named_at_creation(GRPOConfig, lambda cfg: cfg.iterations), validate_parameters=False
)  # the config validates itself (load_config), with llmrl's messages
def grpo(
    config: str | None = None,
    settings: GRPOConfig | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Run (or resume) GRPO: the built-in defaults, then the config file, then ``settings``, then ``overrides``.

    Args:
        config: YAML config file, relative to the checkout (e.g. llmrl_cli/main_job.yaml: two-digit addition;
            recipes/gsm8k-demo.yaml: GSM8K). Empty: the built-in defaults.
        settings: Every setting of the run, by section (the run form shows them all); the ones given replace the
            config file's. The same run_id resumes the run after its last published version.
        overrides: Any setting as section.key=value, e.g. train.kl_coef=0.01; applied last.
    """
    log = get_run_logger()
    cfg = load_config(GRPOConfig, config, overrides or [], settings=settings)
    preflight(cfg)  # before any task, cluster, engine or write
    return attempts(lambda: run_grpo(cfg, log), cfg.dask.restarts, log)


def run_grpo(cfg: GRPOConfig, log: Any) -> dict[str, Any]:
    """One attempt at the run ``cfg``: resume after its last committed version (or start it), on workers of its
    own (a fresh local cluster, or the joined cluster's), and train to ``cfg.iterations``; then the final
    evaluation. A :class:`~runtime.actor_calls.WorkerLost` leaves every committed version in place, so a new attempt
    resumes exactly there (:func:`grpo` makes up to ``dask.restarts`` of them).

    Each iteration is the module docstring's diagram (:func:`_iteration`); the start-up (where to resume, the run's
    records, the resident actors and the weight route) is :func:`_resume_point`, :func:`_open_records` and
    :func:`_start_actors`."""
    point = _resume_point(cfg, log)
    quiet, lineage, checkpoints = _open_records(cfg, point, log)
    # each version's report is written while the next iteration runs (the last one is waited for on leaving)
    with quiet, lineage, dask_cluster(cfg, point.run_dir / "dask") as place, BackgroundReports() as reports:
        run = _start_actors(cfg, place, point, lineage, checkpoints, reports, log)
        if point.published is None:
            if point.fork is not None:
                start_from_fork(run.ranks, point.fork, lineage)
            info = publish_version(run.trainer, run.engines, 0, run.config_dict, **run.published_to)
            log.info("version 0 (base model) published: %s", info["checkpoint"])
        elif point.start > 0:
            # the engines get the weights each batch needs when it is sent
            run.ranks.call_all("restore", point.start, stage="resume", version=point.start)
            if not point.with_state:
                log.warning(
                    "version %d resumed from its weights alone: a fresh optimizer (train.resume_without_state)",
                    point.start,
                )
        ahead = RolloutAhead(cfg, point.layout.staging_uri, run.engines, checkpoints, 0, point.primer_state)
        ahead.fill(point.start)  # asynchronous runs: rollout.max_staleness batches in flight before training starts
        bar = iteration_bar(cfg, point.start)
        if bar is not None:  # closed on any way out: an error line then starts a line of its own
            quiet.callback(bar.close)
        pending: PendingPublish | None = None  # the version the engines hold, committed beside the next rollouts
        for version in range(point.start, cfg.iterations):
            pending = _iteration(run, ahead, version, pending, bar)
        if pending is not None:
            pending.complete()
        if bar is not None:
            bar.close()
    return _finish(cfg, point, lineage, log)


@dataclass
class _ResumePoint:
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


def _resume_point(cfg: GRPOConfig, log: Any) -> _ResumePoint:
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
    return _ResumePoint(layout, published, start, primer_state, fork, with_state)


def _open_records(cfg: GRPOConfig, point: _ResumePoint, log: Any) -> tuple[ExitStack, LineageRecorder, Any]:
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
class _Run:
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


def _start_actors(
    cfg: GRPOConfig, place: Any, point: _ResumePoint, lineage: Any, checkpoints: Any, reports: Any, log: Any
) -> _Run:
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
    return _Run(cfg, log, point.layout.trajectories_uri, engines, trainer, ranks, config_dict, published_to, lineage)


def _iteration(
    run: _Run, ahead: RolloutAhead, version: int, pending: PendingPublish | None, bar: Any
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


def _finish(cfg: GRPOConfig, point: _ResumePoint, lineage: LineageRecorder, log: Any) -> dict[str, Any]:
    """The run's summary, with the held-out evaluation of its last version (``final_eval.questions > 0``)."""
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


def final_evaluation(cfg: GRPOConfig, final: int) -> dict[str, Any]:
    """Evaluate version 0 and ``final`` on held-out problems (the evaluate flow, as a subflow)."""
    from flows.evaluate import evaluate

    e = cfg.final_eval
    out = evaluate(
        cfg.run_id,
        versions=[0, final],
        runs_dir=cfg.runs_dir,
        n_questions=e.questions,
        n_samples=e.samples,
        k_values=[1],
        temperature=cfg.rollout.temperature,
        seed=cfg.seed,
        max_new_tokens=cfg.rollout.max_new_tokens,
        model=cfg.model,
        dtype=cfg.rollout.dtype,
        backend=cfg.rollout.backend,
        tracking_uri=cfg.tracking_uri,
        progress=cfg.progress,
    )
    greedy = {row["version"]: row for row in out["rows"] if row["mode"] == "greedy"}
    base, last = greedy[0], greedy[final]
    line = (
        f"held-out accuracy {base['accuracy']:.2f} -> {last['accuracy']:.2f} "
        f"({last['delta_accuracy']:+.2f} ± {last['delta_accuracy_se']:.2f}, z = {last['z']:.1f}; greedy, "
        f"{last['num_questions']} problems of {final_eval_source(cfg)}, version 0 -> {final})"
    )
    return {"line": line, "report": out["report_markdown"], "curves": out["report_png"], "rows": out["rows"]}


if __name__ == "__main__":
    grpo()
