"""The GRPO stages as thin Prefect tasks: arguments in, a core/storage/actor call, a small summary out.

Trajectories travel through the Parquet store (a staging store for rollouts in progress, the run's store
once a partition is complete) and weights through the checkpoint store; tasks return paths and numbers.
Stages that can safely run twice (they rewrite the same shard names) retry once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from llmrl_core.builtin_data.sources import resolve_source
from llmrl_core.collectors.dask_collector import shard_by_group
from llmrl_core.envs.primer import DataLoadingPrimer
from llmrl_core.envs.transforms import KLComputation
from llmrl_core.envs.transforms.kl_computation import kl_penalties
from llmrl_core.envs.types import PromptRow
from llmrl_core.objectives import MCAdvantage
from llmrl_core.pipeline.components import component_class
from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.user_code import UserCodeError
from llmrl_core.weight_sync.fingerprint import check_engines_hold
from runtime.actor_calls import WorkerLost, wait_calls
from runtime.records import read_shards
from runtime.trainer_ranks import TrainerRanks
from runtime.weight_sync import EngineActorsUpdater
from storage.filesystems import join_uri
from storage.trajectories import TrajectoryStore
from tasks.rollout_traces import trace_sample

STAGE = dict(cache_policy=NO_CACHE, persist_result=False)


@dataclass(frozen=True)
class Batch:
    """One training batch of a GRPO run: it trains version ``index`` -> ``index + 1`` and was sampled by version
    ``policy_version`` = max(0, index - rollout.max_staleness) (= ``index`` in a synchronous run).

    Rows are stored by the version that sampled them, so in an asynchronous run several batches can share a
    partition (the first ``max_staleness + 1`` batches all come from version 0): each batch then has its own
    staging folder and its shards in the run's store are named ``shard_prefix*``. A synchronous batch is the
    whole partition (``shard_prefix`` None), as before.
    """

    index: int
    policy_version: int
    staging_uri: str
    shard_prefix: str | None

    @property
    def staleness(self) -> int:
        """How many versions older than the trainer the sampling policy is."""
        return self.index - self.policy_version


def batch_of(cfg: GRPOConfig, staging_uri: str, index: int) -> Batch:
    """The batch that trains version ``index`` (where it is staged under the run's staging root, a path or URI,
    and which version samples it)."""
    k = cfg.rollout.max_staleness
    if k == 0:
        return Batch(index, index, staging_uri, None)
    return Batch(index, max(0, index - k), join_uri(staging_uri, f"batch-{index}"), f"b{index:06d}-")


@task(name="load-prompts", **STAGE)
def load_prompts(cfg: GRPOConfig, primer_state: dict | None) -> tuple[list[PromptRow], dict]:
    """Draw the next ``prompts_per_iteration`` prompts, ``group_size`` copies each; returns rows and cursor."""
    d = cfg.data
    primer = DataLoadingPrimer(
        resolve_source(d.source, cfg.env.options),
        batch_size=d.prompts_per_iteration,
        repeats=d.group_size,
        group_repeats=True,  # all G copies of a prompt in one iteration: a GRPO group is never split
        shuffle=d.shuffle,
        seed=cfg.seed,
        rename={cfg.env.prompt_field: "query"},
    )
    if primer_state is not None:
        primer.load_state_dict(primer_state)
    rows = primer.next_batch()
    return rows, primer.state_dict()


class EpisodesFailed(UserCodeError):
    """More of a batch's agent episodes failed than ``rollout.max_failed_fraction`` allows: the message gives the
    counts by kind and an example."""


class AgreementOff(RuntimeError):
    """``train.agreement_stop``: the sampler's and the trainer's log-probs of a batch differ by more than
    ``train.agreement_warn``; the run stops before the version trained on it is published."""


def dispatch_rollout(
    actors: list[Any],
    rows: list[PromptRow],
    version: int,
    staging_uri: str,
    shard_offset: int = 0,
    batch: int | None = None,
) -> list[tuple[Any, Any]]:
    """Send the rows to the rollout engines (groups kept whole), one staging shard each; returns ``(engine, its
    call)`` pairs at once (wait with :func:`runtime.actor_calls.wait_calls`). Calls on one engine run in the order
    they are sent, so weights loaded afterwards wait for this rollout. ``batch``: the training batch (seeds the
    sampling; default ``version``)."""
    shards = shard_by_group(rows, len(actors))
    return [
        (actor, actor.rollout(shard, version, staging_uri, shard_offset + i, batch))
        for i, (actor, shard) in enumerate(zip(actors, shards, strict=False))
    ]


def retry_unless_user_error(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition: the user's code that failed (a reward function, env factory or transform) fails
    the same way again, and a lost worker is not back a moment later, so none is retried."""
    try:
        state.result()
    except (UserCodeError, WorkerLost):
        return False
    except Exception:  # any other failure: the task's retry policy applies
        return True
    return True


@task(name="rollout", retries=1, retry_condition_fn=retry_unless_user_error, **STAGE)
def rollout(
    actors: list[Any],
    rows: list[PromptRow],
    version: int,
    staging_uri: str,
    shard_offset: int = 0,
    batch: int | None = None,
) -> list[dict]:
    """Shard the rows over the rollout engines and wait for their staging shards (see :func:`dispatch_rollout`)."""
    return wait_calls(dispatch_rollout(actors, rows, version, staging_uri, shard_offset, batch), "rollout", version)


@task(name="await-rollout", **STAGE)
def await_rollout(calls: list[tuple[Any, Any]], version: int | None = None) -> list[dict]:
    """Wait for rollouts sent earlier with :func:`dispatch_rollout` (the trainer's wait for data)."""
    return wait_calls(calls, "rollout", version)


@task(name="score-reference", retries=1, retry_condition_fn=retry_unless_user_error, **STAGE)
def score_reference(trainer: Any, staging_uri: str, version: int) -> dict:
    """Reference-model log-probs for every staged row (on the trainer worker)."""
    return wait_calls([(trainer, trainer.score_reference(staging_uri, version))], "reference scoring", version)[0]


def assign_advantages(cfg: GRPOConfig, records: list[Any]) -> dict[str, int]:
    """Set each record's group advantage (``train.advantage``: grpo | dr_grpo | rloo over its GRPO group); returns
    the counts (groups, zero-signal and dropped groups). With ``train.kl_in=reward`` the return of a row is its task
    reward less its KL to the reference, as TorchRL's ``KLComputation`` takes it out of the per-token rewards
    (:func:`~llmrl_core.envs.transforms.kl_computation.kl_penalties`; stored as ``reward_components["kl_penalty"]``,
    ``reward`` stays the task's)."""
    t = cfg.train
    if t.kl_coef > 0 and t.kl_in == "reward":
        for record in records:
            if record.ref_logprobs is None:
                where = f"{record.group_id}#{record.sample_index}"
                raise RuntimeError(f"train.kl_in=reward: row {where} has no ref_logprobs")
        penalties = kl_penalties(
            kl_reward_transform(cfg),
            [r.sampler_logprobs for r in records],
            [r.ref_logprobs for r in records],
            [r.response_mask for r in records],
        )
        for record, penalty in zip(records, penalties, strict=True):
            record.reward_components = {**record.reward_components, "kl_penalty": -penalty}
    returns = [r.reward + r.reward_components.get("kl_penalty", 0.0) for r in records]
    result = advantage_estimator(cfg)(returns, [r.group_id for r in records])
    for record, advantage in zip(records, result.advantages.tolist(), strict=True):
        record.advantage = float(advantage)
    return {k: int(v) for k, v in result.stats.items()}


def kl_reward_transform(cfg: GRPOConfig) -> KLComputation:
    """TorchRL's ``KLComputation`` with ``coeff=train.kl_coef`` (``train.kl_reward_class``: a subclass, built the
    same way plus ``train.kl_reward_kwargs``): what takes the KL out of the rewards with ``train.kl_in=reward``."""
    t = cfg.train
    cls = (
        component_class(t.kl_reward_class, KLComputation, "train.kl_reward_class")
        if t.kl_reward_class
        else KLComputation
    )
    return cls(coeff=t.kl_coef, **t.kl_reward_kwargs)


def advantage_estimator(cfg: GRPOConfig) -> MCAdvantage:
    """TorchRL's ``MCAdvantage`` with the run's ``train.advantage`` method (``train.advantage_class``, a subclass,
    built the same way plus ``train.advantage_kwargs``), called on a batch's returns and group ids."""
    t = cfg.train
    cls = component_class(t.advantage_class, MCAdvantage, "train.advantage_class") if t.advantage_class else MCAdvantage
    return cls(method=t.advantage, **t.advantage_kwargs)


@task(name="write-trajectories", retries=1, **STAGE)
def write_trajectories(
    cfg: GRPOConfig, staging_uri: str, store_uri: str, version: int, shard_prefix: str | None = None
) -> dict:
    """Give the staged rows their group advantages (:func:`assign_advantages`) and publish the partition into the
    run's trajectory store (replacing any partial earlier attempt), in one read of the staging shards; returns
    ``{"partition", "shards", "rows", "advantages", "trace_sample", "reward_spread"}`` (the advantage counts; the
    rows to show as MLflow traces, :func:`tasks.rollout_traces.trace_sample`; :func:`reward_spread`).

    With ``shard_prefix`` (one batch of an asynchronous run) the shards are stored as ``<prefix><shard>`` beside
    the other batches of the same policy version, and only that batch's shards are replaced."""
    staging, store = TrajectoryStore(staging_uri), TrajectoryStore(store_uri)
    shards = read_shards(staging, cfg.run_id, version)
    records = [r for _, rs in shards for r in rs]
    if not records:
        raise RuntimeError(f"no staged rollouts for {cfg.run_id} version {version}")
    counts = assign_advantages(cfg, records)
    store.delete_partition(cfg.run_id, version, shard_prefix)
    infos = [
        store.write_shard(cfg.run_id, version, shard if shard_prefix is None else f"{shard_prefix}{shard}", rs)
        for shard, rs in shards
    ]
    staging.delete_partition(cfg.run_id, version)
    return {
        "partition": store.partition_uri(cfg.run_id, version),
        "shards": len(infos),
        "rows": sum(i.num_rows or 0 for i in infos),
        "advantages": counts,
        "trace_sample": trace_sample(records),  # logged as MLflow traces with the version's report
        "reward_spread": reward_spread([r.reward for r in records]),
    }


def reward_spread(rewards: list[float]) -> dict[str, float]:
    """How the batch's rewards are spread (the version metrics show means; this shows the distribution):
    standard deviation, min, max and the 10th / 50th / 90th percentiles."""
    import numpy as np

    values = np.asarray(rewards, dtype=float)
    p10, p50, p90 = np.percentile(values, [10, 50, 90])
    return {
        "reward_std": float(values.std()),
        "reward_min": float(values.min()),
        "reward_max": float(values.max()),
        "reward_p10": float(p10),
        "reward_p50": float(p50),
        "reward_p90": float(p90),
    }


@task(name="train", **STAGE)
def train(ranks: TrainerRanks, store_uri: str, batch: Batch) -> dict:
    """Optimizer steps on a published batch (on the trainer worker, or on every data-parallel rank at once):
    version ``batch.index`` -> ``+ 1``; rank 0's metrics (the global batch's)."""
    args = (store_uri, batch.policy_version, batch.shard_prefix, batch.index)
    return ranks.call_all("train", *args, stage="training", version=batch.index)


@dataclass
class StagedVersion:
    """A version every rollout engine holds, whose checkpoint the trainer is still sealing (fsync, sha256,
    manifest, optimizer/RNG state): ``sealing`` is ``(trainer, that call)``; :func:`seal_checkpoint` waits for it."""

    version: int
    checkpoint: str
    sealing: Any
    seconds: dict[str, float] = field(default_factory=dict)  # publish_write_s, publish_load_s (the critical path)
    held: list[dict[str, str]] = field(default_factory=list)  # each engine's {"fingerprint", "dtype"} after its load


@task(name="publish-weights", retries=1, retry_condition_fn=retry_unless_user_error, **STAGE)
def publish_weights(
    trainer: Any, rollout_actors: list[Any], version: int, config: dict, updater: EngineActorsUpdater | None = None
) -> StagedVersion:
    """Get ``version`` into every rollout engine; returns once they all hold it, with the checkpoint's seal under
    way on the trainer (wait for it with :func:`seal_checkpoint` before the version counts).

    The trainer writes the weights file first (:meth:`TrainerWorker.stage`: into shared memory when the engines
    share its host); then ``updater`` (TorchRL's ``vLLMUpdater`` for Dask-actor engines, runtime/weight_sync.py;
    default: checkpoint loads) carries the version: each engine loads the file, or the trainer broadcasts (NCCL,
    gloo) or hands over CUDA IPC handles instead. The seal (hash, manifest, optimizer state:
    :meth:`TrainerWorker.seal`) is asked for once the engines hold the version, so it runs beside their next rollout
    and not beside the loads (on shared cores it would slow the loads down: 0.6-0.75 s per reload instead of ~0.3 s
    on 2 cores). Each
    engine's fingerprint of what it loaded is kept; the seal computes the trainer's in the engines' dtypes
    (:func:`verify_engines_hold` compares them)."""
    staged = wait_calls([(trainer, trainer.stage(version, config))], "weight publishing", version)[0]
    if "note" in staged:  # the shared-memory handoff stopped or started again
        logging.getLogger("llmrl.publish").warning("version %d: %s", version, staged["note"])
    start = time.perf_counter()
    if rollout_actors:
        (updater or EngineActorsUpdater(rollout_actors)).push_version(version, staged["checkpoint"])
    seconds = {"publish_write_s": staged["seconds"], "publish_load_s": time.perf_counter() - start}
    held = wait_calls([(a, a.weights_fingerprint()) for a in rollout_actors], "weight publishing", version)
    sealing = (trainer, trainer.seal(version, config, sorted({h["dtype"] for h in held})))
    return StagedVersion(version, staged["checkpoint"], sealing, seconds, held)


@task(name="seal-checkpoint", **STAGE)
def seal_checkpoint(staged: StagedVersion) -> dict:
    """Wait for the trainer to seal ``staged``'s checkpoint and check that the engines hold its weights
    (:func:`verify_engines_hold`); returns ``{"version", "checkpoint", "sha256", "fingerprints", "seconds"}``."""
    return verify_engines_hold(staged)


def verify_engines_hold(staged: StagedVersion) -> dict:
    """The trainer's seal of ``staged`` (waited for), once every engine's fingerprint equals the trainer's
    (:class:`~llmrl_core.weight_sync.fingerprint.WeightsMismatchError` otherwise). Cheap to call again."""
    info = wait_calls([staged.sealing], "checkpoint sealing", staged.version)[0]
    if info["version"] != staged.version:
        raise RuntimeError(f"the trainer sealed version {info['version']} while publishing {staged.version}")
    check_engines_hold(staged.version, info["fingerprints"], staged.held)
    return info


# Settings that only say where and how fast the run computes: not part of what a version is, so a run resumes on
# another machine or cluster with other threads or GPU shares.
PLACEMENT_ONLY = {
    "rollout": ("threads", "gpu_memory_utilization", "tensor_parallel_size", "weight_sync", "sleep_level"),
    "train": ("data_parallel",),
}
# Settings added after runs existed, left out while at their default: an older run's config hash stays the same,
# so it still resumes.
ADDED_LATER = {
    "rollout": {"max_staleness": 0, "backend": "vllm", "policy_class": None, "policy_kwargs": {}},
    "env": {"reward_errors": "raise"},
    "train": {
        "exact_skip": False,
        "loss_class": None,
        "loss_kwargs": {},
        "advantage_class": None,
        "advantage_kwargs": {},
        "kl_transform_class": None,
        "kl_transform_kwargs": {},
        "kl_reward_class": None,
        "kl_reward_kwargs": {},
    },
    "init": {"from_": None, "data_cursor": False},  # a section left out whole while at its defaults
}


# Settings that only say how a flow run resumes, heals or stops: never part of what a version is.
BEHAVIOUR_ONLY = {
    "train": ("resume_without_state", "agreement_stop"),
    "dask": ("restarts", "join_wait_s"),
    "rollout": ("max_failed_fraction",),
}
# Settings that only say where a run's files, records and console output go ("": the top level): a run moved to
# another folder or store, joined to another cluster or resumed without progress bars is the same run. Runs
# recorded before these left the hash still resume: the flows accept the hash of
# ``lineage_config(cfg, keep_where=True)``.
WHERE_ONLY = {"": ("runs_dir", "tracking_uri", "progress"), "dask": ("address", "local_directory")}


def _drop(data: dict, keys_by_section: dict[str, tuple[str, ...]]) -> None:
    for section, keys in keys_by_section.items():
        holder = data if section == "" else data.get(section, {})
        for key in keys:
            holder.pop(key, None)


def version_defining(data: dict, keep_where: bool = False) -> dict:
    """``data`` (a run's settings as nested dicts) without the :data:`BEHAVIOUR_ONLY` and :data:`WHERE_ONLY`
    settings (the latter kept with ``keep_where``, as runs recorded them before), the :data:`ADDED_LATER` settings
    that are at their defaults, and a section they leave empty."""
    _drop(data, BEHAVIOUR_ONLY)
    if not keep_where:
        _drop(data, WHERE_ONLY)
    for section, defaults in ADDED_LATER.items():
        if section not in data:
            continue
        for key, default in defaults.items():
            if key in data[section] and data[section][key] == default:
                data[section].pop(key)
        if not data[section]:
            data.pop(section)
    return data


def lineage_config(cfg: GRPOConfig, keep_where: bool = False) -> dict:
    """The settings that define what a version is (run length, placement and where the run's
    files go excluded; the config hash and ``RUN/config.json`` are made of these). ``keep_where``: as runs
    recorded them before :data:`WHERE_ONLY` left the hash."""
    data = asdict(cfg)
    data.pop("iterations")
    for section, keys in PLACEMENT_ONLY.items():
        for key in keys:
            data[section].pop(key, None)
    return version_defining(data, keep_where)
