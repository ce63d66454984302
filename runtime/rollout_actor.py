"""The flows' rollout actor, resident on its Dask worker across iterations: a rollout engine and the run's env.

``RolloutWorker`` holds an engine (vLLM, or Transformers with ``rollout.backend: transformers``) and a tokens-mode
env; it exchanges only paths, versions and small summaries with the flow: trajectories go through the Parquet
store, weights arrive as checkpoint files, shared memory or a broadcast. The trainer is :mod:`runtime.trainer_actor`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from llmrl_core.collectors.dask_collector import RolloutActor
from llmrl_core.collectors.tensordict_batches import rows as episode_rows
from llmrl_core.envs.reward_calls import RewardFunctionError
from llmrl_core.evaluation.rollout_health import rollout_health
from llmrl_core.hardware import cuda_peak_gib, where_am_i
from llmrl_core.modules.backends.types import EngineConfig, SamplingConfig
from llmrl_core.pipeline.components import component_class, policy_base
from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.pipeline.task_config import make_task_env
from llmrl_core.user_code import UserCodeError
from runtime.records import trajectory_to_record
from storage.checkpoints import CheckpointStore
from storage.trajectories import TrajectoryStore


def sampling_config(cfg: GRPOConfig, batch: int, shard: int) -> SamplingConfig:
    """Sampling settings of one rollout shard; the seed depends on (seed, batch, shard) for reproducibility.

    ``batch`` is the training batch the shard belongs to (the version it trains; in a synchronous run also the
    version that samples it, so the seeds are those of the policy version)."""
    r = cfg.rollout
    return SamplingConfig(
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        seed=cfg.seed * 1_000_003 + batch * 1_009 + shard,
    )


class AgentFailed(UserCodeError):
    """Every agent episode of a rollout shard failed (crash, timeout, bad result): the message gives the first
    failures' reasons."""


class RolloutStopped(RuntimeError):
    """A rollout its run stopped (Ctrl-C, SIGTERM, an error elsewhere) while it was in flight: its rows were not
    written, and the engine takes no more rollouts."""


class RolloutWorker(RolloutActor):
    """The flows' rollout actor: the run's env (``env`` + ``task`` sections) in tokens mode on a resident engine;
    collects staging shards at a given policy version (the engine and the episode loop are
    :class:`~llmrl_core.collectors.dask_collector.RolloutActor`'s)."""

    def __init__(self, cfg: GRPOConfig, model: str | None = None) -> None:
        """``model``: a model reference (default ``cfg.model``), resolved here, on this worker: the packaged
        default is prepared under this node's ``$LLMRL_HOME``, nothing of the flow host's disk is needed."""
        from llmrl_core.model_store import resolve_model

        self.cfg = cfg
        r = cfg.rollout
        model_path = resolve_model(cfg.model if model is None else model)
        placement: dict[str, Any] = {"tensor_parallel_size": r.tensor_parallel_size}
        if r.gpu_memory_utilization is not None:  # None: the engine's default
            placement["gpu_memory_utilization"] = r.gpu_memory_utilization
        engine = EngineConfig(
            model=model_path,
            dtype=r.dtype,
            kv_cache_gb=r.kv_cache_gb,
            seed=cfg.seed,
            max_model_len=r.max_model_len,
            logprobs_mode=r.logprobs_mode,
            backend=r.backend,
            sleep_level=r.sleep_level,
            **placement,
        )
        engine.check_parallelism()  # tensor parallelism on a CPU-only worker fails here, naming the setting
        on_cuda = engine.resolved_device() == "cuda"
        if r.backend == "vllm" and (r.weight_sync == "gloo" or (on_cuda and r.weight_sync != "checkpoint")):
            engine = dataclasses.replace(engine, weight_sync_extension=True)
        super().__init__(
            lambda tokenizer: (
                None if cfg.env.agent else make_task_env(cfg.task, tokenizer, input_mode="tokens", env=cfg.env)
            ),  # an agent run has no env: the agent talks to the engine through its OpenAI endpoint
            engine,
            sampling_config(cfg, 0, 0),
            component_class(r.policy_class, policy_base(r.backend), "rollout.policy_class") if r.policy_class else None,
            r.policy_kwargs,
        )
        self._agent_tokenizer: Any = None
        self._stopped = False

    async def stop(self) -> None:
        """Take no more work: a rollout in flight finishes the generation it is in but writes no staging shard
        (it raises :class:`RolloutStopped`), and a later one is refused. A coroutine, so Dask runs it on the
        worker's event loop at once rather than after the call in flight (an actor's other methods take turns in
        one thread): a run that stops calls it before ``close`` (:meth:`runtime.cluster.Placement.close_actors`), so
        on a joined cluster, whose workers outlive the run, nothing is written after the run has gone."""
        self._stopped = True

    def _check_not_stopped(self, version: int, rows: int, before: str) -> None:
        if self._stopped:
            raise RolloutStopped(
                f"the rollout of version {version} was stopped before {before} its {rows} rows: its run stopped"
            )

    def describe(self) -> dict[str, str]:
        """The engine's device and dtype, and why (for the run's log and lineage)."""
        from llmrl_core.hardware import choose_dtype

        config = self.worker.config
        choice = choose_dtype(config.dtype, config.resolved_device())
        return {
            "rollout_backend": config.backend,
            "rollout_device": config.resolved_device(),
            "rollout_dtype": choice.dtype,
            "rollout_dtype_reason": choice.reason,
            **where_am_i(config.resolved_device()),  # every GPU this worker sees is the engine's
        }

    def weights_fingerprint(self) -> dict[str, str]:
        """``{"fingerprint", "dtype"}`` of the weights the engine holds (computed when it loaded them)."""
        return self.worker.weights_fingerprint()

    def load(self, checkpoint_path: str, version: int) -> int:
        """Load published weights (a safetensors checkpoint) as ``version``.

        ``checkpoint_path`` is what :meth:`CheckpointStore.weights_path` gave the trainer: a local path (read by
        the engine itself) or the URI of a store elsewhere (``s3://...``), whose bytes are read through the store
        on this worker and checked against the version's manifest before the engine gets them.
        """
        if "://" in checkpoint_path and not checkpoint_path.startswith("file://"):
            store, stored = CheckpointStore.from_weights_uri(checkpoint_path)
            return self.load_weights(store.read_weights(stored), version)
        return self.load_weights(checkpoint_path.removeprefix("file://"), version)

    def load_shared_cuda(self, handles: dict[str, tuple[Any, tuple]], version: int) -> int:
        """Load ``version`` from the trainer's CUDA IPC handles (:meth:`TrainerWorker.share_weights_cuda`;
        ``rollout.weight_sync=cuda_ipc``): each tensor is opened in place on this worker's GPU (the trainer's, seen
        here as this process's only device), loaded into the engine and let go."""
        state = open_cuda_handles(handles)
        try:
            return self.load_weights(state, version)  # type: ignore[arg-type]
        finally:
            state.clear()

    def rollout(
        self, rows: list[Any], version: int, staging_uri: str, shard: int, batch: int | None = None
    ) -> dict[str, Any]:
        """Collect every row once with the engine at ``version``; write the rows as a staging shard.

        ``batch``: the training batch (default ``version``; an asynchronous run samples batch ``b`` with an
        older version) — it seeds the sampling, the rows are stamped with ``version``."""

        self._check_not_stopped(version, len(rows), "sampling")
        if self.version() != version:
            raise RuntimeError(f"engine holds version {self.version()}, asked to roll out version {version}")
        idle = self.idle_s()
        start = time.perf_counter()
        try:
            out = self._rollout(rows, version, staging_uri, shard, batch, start, idle)
        finally:  # rollout.sleep_level: the trainer trains next, with the engine's GPU memory
            slept = self.worker.sleep() if self.cfg.rollout.sleep_level else 0.0
        if self.cfg.rollout.sleep_level:
            out |= {"engine_sleep_s": slept, "engine_wake_s": self.worker.last_wake_s}
        return out

    def _rollout(
        self, rows: list[Any], version: int, staging_uri: str, shard: int, batch: int | None, start: float, idle: float
    ) -> dict[str, Any]:
        sampling = sampling_config(self.cfg, version if batch is None else batch, shard)
        episode_metrics: dict[str, float] = {}
        if self.cfg.env.agent:
            trajectories, episode_metrics = self._agent_episodes(rows, sampling)
        else:
            trajectories = episode_rows(self.collect(rows, sampling=sampling, progress=self.cfg.progress))
            trajectories, episode_metrics = drop_failed_rewards(trajectories, len(rows))
        params = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
            "seed": sampling.seed,
            "logprobs_mode": self.worker.config.logprobs_mode,
        }
        held = self.weights_fingerprint()["fingerprint"]
        records = [
            trajectory_to_record(
                t,
                run_id=self.cfg.run_id,
                policy_version=version,
                model_id=self.cfg.model,
                sampling=params,
                weights_fingerprint=held,
            )
            for t in trajectories
        ]
        self._check_not_stopped(version, len(records), "writing")  # its run has gone: nobody would read them
        info = TrajectoryStore(staging_uri).write_shard(self.cfg.run_id, version, shard, records)
        if not records:  # every agent episode of the shard failed: nothing to measure, the failures say why
            return {"shard": info.path, "rows": 0, "seconds": time.perf_counter() - start, **episode_metrics}
        rewards = [r.reward for r in records]
        health = rollout_health(
            texts=[t.response_text for t in trajectories],
            group_ids=[t.group_id for t in trajectories],
            correct=[bool(t.info.get("success", False)) for t in trajectories],
            has_answer=[bool(t.reward_components.get("reward_answer", 0.0)) for t in trajectories],
            num_tokens=[len(r.response_tokens) for r in records],
            truncated=[r.finish_reason == "length" for r in records],
        )
        calls = sum(r.num_tool_calls for r in records)
        errors = sum(1 for r in records for call in r.tool_calls if call.get("error"))
        tools = {"tool_call_rate": float(np.mean([r.num_tool_calls > 0 for r in records]))} if calls else {}
        if calls:
            tools |= {"tool_calls": float(calls), "tool_errors": float(errors)}
        return {
            "shard": info.path,
            "rows": len(records),
            "seconds": time.perf_counter() - start,
            "engine_idle_s": idle,
            "engine_reload_s": self.worker.last_reload_s,  # of the weights this batch was sampled with
            "reward_mean": float(np.mean(rewards)),
            **cuda_peak_gib("engine"),
            **health,
            **tools,
            **episode_metrics,
        }

    def _agent_episodes(self, rows: list[Any], sampling: SamplingConfig) -> tuple[list[Any], dict[str, Any]]:
        """Run ``env.agent`` once per row against this engine's OpenAI endpoint (up for this rollout only, so no
        weight load meets a request in flight); returns the finished episodes' rows and the agent metrics.
        Failed episodes (crash, ``rollout.agent_timeout_s``, bad result) are counted, not stored: their groups
        train on the rows that remain. Raises when every episode failed (the first failures' reasons)."""
        from llmrl_core.agents.rollout import run_agent_rollout

        if self._agent_tokenizer is None:  # the endpoint's own copy: vLLM's engine thread uses the engine's
            from transformers import AutoTokenizer

            self._agent_tokenizer = AutoTokenizer.from_pretrained(self.worker.config.model)
        result = run_agent_rollout(
            self.worker,
            self.cfg.env.agent,
            rows,
            sampling,
            tokenizer=self._agent_tokenizer,
            concurrency=self.cfg.rollout.agent_concurrency,
            timeout_s=self.cfg.rollout.agent_timeout_s,
            model_name=self.cfg.model,
            prompt_field=self.cfg.env.prompt_field,
        )
        metrics: dict[str, Any] = result.metrics()
        failures = result.failures
        if failures:
            metrics["agent_failure_examples"] = [f"{f.episode_id}: {f.error}: {f.detail}" for f in failures[:3]]
        if rows and not result.rows:
            raise AgentFailed(
                f"env.agent {self.cfg.env.agent!r}: all {len(rows)} episodes failed, e.g. "
                + "; ".join(metrics["agent_failure_examples"])
            )
        return result.rows, metrics

    def score(self, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
        """Engine log-probs of fixed tokens (lets tests compare engine and checkpoint weights)."""
        return [t.tolist() for t in self.worker.score(prompts, responses)]


# The position of the device index among the arguments of torch.multiprocessing.reductions.rebuild_cuda_tensor.
CUDA_DEVICE_ARGUMENT = 6


def open_cuda_handles(handles: dict[str, tuple[Any, tuple]], device: int = 0) -> dict[str, Any]:
    """The tensors behind CUDA IPC ``handles`` (``name -> (rebuild, arguments)``, as ``reduce_tensor`` gives them),
    opened on this process's CUDA ``device``: the sender numbers the GPU as it sees it, and an engine on the
    trainer's GPU sees that GPU as its only one (``CUDA_VISIBLE_DEVICES``), device 0."""
    opened = {}
    for name, (rebuild, arguments) in handles.items():
        arguments = list(arguments)
        if getattr(rebuild, "__name__", "") == "rebuild_cuda_tensor":
            arguments[CUDA_DEVICE_ARGUMENT] = device
        opened[name] = rebuild(*arguments)
    return opened


def drop_failed_rewards(trajectories: list[Any], episodes: int) -> tuple[list[Any], dict[str, Any]]:
    """Take out the episodes whose reward function failed (``env.reward_errors: skip``): they are counted
    (``reward_errors``, with up to three of their messages), not stored; their groups train on the rows that remain.
    Raises when every episode of the shard failed (the first messages)."""
    failed = [t.info["reward_error"] for t in trajectories if t.info.get("reward_error")]
    if not failed:
        return trajectories, {}
    if len(failed) == len(trajectories):
        raise RewardFunctionError(f"all {episodes} episodes' reward functions failed, e.g. {failed[0]}")
    kept = [t for t in trajectories if not t.info.get("reward_error")]
    return kept, {"reward_errors": float(len(failed)), "reward_error_examples": failed[:3]}
