"""``DaskLLMCollector``: N resident vLLM engines on N Dask workers, prompts sharded, results gathered.

Our counterpart of TorchRL's ``RayLLMCollector``. Each worker hosts a :class:`RolloutActor` (a Dask actor)
that keeps its engine for the collector's life. ``collect(rows)`` shards the prompt rows across actors
without splitting a GRPO group (rows that share a ``group_id`` stay together), runs an
:class:`~llmrl_core.collectors.llm_collector.LLMCollector` on each shard, and gathers the episodes (one TensorDict).
``push_weights`` loads new weights into every engine (a safetensors file on shared storage, or bytes)
and moves all of them to the same new version; a trajectory stamped with another version is an error.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase, lazy_stack

from llmrl_core.collectors.llm_collector import LLMCollector
from llmrl_core.collectors.tensordict_batches import rows as episode_rows
from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.envs.transforms.policy_version import PolicyVersion
from llmrl_core.envs.types import PromptRow
from llmrl_core.modules.backends.types import EngineConfig, SamplingConfig
from llmrl_core.weight_sync.serialization import state_dict_to_bytes, write_state_dict_atomic

EnvFactory = Callable[[Any], ChatEnv]  # tokenizer -> env (batch_size None: reset takes any number of rows)


def collect_episodes(
    worker: Any,
    env: ChatEnv,
    rows: Sequence[PromptRow],
    sampling: SamplingConfig,
    progress: bool = False,
    policy_class: type | None = None,
    policy_kwargs: dict[str, Any] | None = None,
) -> TensorDictBase:
    """Every row of ``rows`` played to the end of its episode (all turns, tools included) by ``worker`` (a
    :class:`~llmrl_core.modules.backends.vllm.worker.vLLMWorker` or a ``TransformersWorker``: its ``policy``, TorchRL's
    wrapper on the engine, or ``policy_class`` built the same way plus ``policy_kwargs``) in ``env``, stamped with the
    worker's version. A slot whose conversation outgrows the engine's context is truncated
    (``ChatEnv.max_prompt_tokens``). The one episode loop of the rollout actors and the evaluation of multi-turn
    envs. Returns the collector's TensorDict of episodes (:mod:`llmrl_core.collectors.tensordict_batches`)."""
    room = int(worker.config.max_model_len) - int(sampling.max_new_tokens)  # a prompt the engine can still answer
    env.max_prompt_tokens = room if env.max_prompt_tokens is None else min(env.max_prompt_tokens, room)
    extra = {"cls": policy_class, **(policy_kwargs or {})} if policy_class is not None else {}
    policy = worker.policy(input_mode=env.input_mode, sampling=sampling, progress=progress, **extra)
    collector = LLMCollector(
        env,
        policy,
        prompts=list(rows),
        prompts_per_reset=len(rows),
        total_trajectories=len(rows),
        policy_version=PolicyVersion(initial=worker.policy_version),
    )
    return collector.collect()


class RolloutActor:
    """Lives on one Dask worker: a resident engine, an env factory, and the version of its weights.

    The one rollout actor of llmrl: :class:`DaskLLMCollector` uses it as is, and the GRPO/collect flows' rollout
    worker (``runtime.rollout_actor.RolloutWorker``) extends it with staging shards and rollout metrics."""

    def __init__(
        self,
        env_factory: EnvFactory,
        engine_config: EngineConfig,
        sampling: SamplingConfig,
        policy_class: type | None = None,
        policy_kwargs: dict[str, Any] | None = None,
    ) -> None:
        from llmrl_core.modules.backends.vllm.worker import start_engine

        self.worker = start_engine(engine_config)  # vLLM, or Transformers (engine_config.backend)
        self.env = env_factory(self.worker.get_tokenizer())
        self.sampling = sampling
        self.policy_class, self.policy_kwargs = policy_class, dict(policy_kwargs or {})  # the wrapper to sample with
        self.busy_until = time.perf_counter()  # end of the engine's last collect or weight load

    def idle_s(self) -> float:
        """Seconds since the engine's last collect or weight load ended (how long it has waited for work)."""
        return time.perf_counter() - self.busy_until

    def collect(
        self, rows: list[PromptRow], sampling: SamplingConfig | None = None, progress: bool = False
    ) -> TensorDictBase:
        """Run every row to the end of its episode (all turns) with the current weights; ``sampling`` overrides
        the actor's own for this call (e.g. a seed per version and shard)."""
        try:
            return collect_episodes(
                self.worker,
                self.env,
                rows,
                sampling or self.sampling,
                progress=progress,
                policy_class=self.policy_class,
                policy_kwargs=self.policy_kwargs,
            )
        finally:
            self.busy_until = time.perf_counter()

    def load_weights(self, weights: bytes | str, version: int) -> int:
        """Load weights (safetensors bytes or file path) and adopt ``version``."""
        try:
            return int(self.worker.load_weights(weights, version))
        finally:
            self.busy_until = time.perf_counter()

    def weight_group_size(self) -> int:
        """Ranks this engine brings to the trainer's weight group (see :meth:`vLLMWorker.weight_group_size`)."""
        return self.worker.weight_group_size()

    def join_weight_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int) -> None:
        """Join the trainer's weight group (NCCL on CUDA, gloo on CPU; engines started with the weight-sync
        extension)."""
        self.worker.join_weight_group(master_address, master_port, rank_offset, world_size)

    def receive_weights(self, metadata: list[tuple[str, str, tuple[int, ...]]], version: int) -> int:
        """Receive the trainer's broadcast of new weights and adopt ``version`` (the broadcast counterpart of
        :meth:`load_weights`)."""
        try:
            return int(self.worker.receive_weights(metadata, version))
        finally:
            self.busy_until = time.perf_counter()

    def version(self) -> int:
        """The version of the weights this engine holds."""
        return int(self.worker.policy_version)

    def close(self) -> None:
        """Stop the engine and free its memory before Dask drops this actor (a dropped engine is not freed:
        :meth:`vLLMWorker.close`); the env's tools are closed too. Idempotent."""
        close_env = getattr(self.env, "close", None)
        if callable(close_env):
            close_env()
        self.worker.close()


def shard_by_group(rows: Sequence[PromptRow], n_shards: int) -> list[list[PromptRow]]:
    """Split rows into at most ``n_shards`` balanced shards, never splitting a group."""
    groups: dict[Any, list[PromptRow]] = defaultdict(list)
    for i, row in enumerate(rows):
        groups[row.group_id if row.group_id is not None else ("row", i)].append(row)
    shards: list[list[PromptRow]] = [[] for _ in range(n_shards)]
    for members in sorted(groups.values(), key=len, reverse=True):
        min(shards, key=len).extend(members)
    return [s for s in shards if s]


class DaskLLMCollector:
    """Rollouts on resident engines spread over a Dask cluster (see the module docstring)."""

    def __init__(
        self,
        client: Any,
        env_factory: EnvFactory,
        *,
        engine_config: EngineConfig | None = None,
        sampling: SamplingConfig | None = None,
        workers: Sequence[str] | None = None,
        shared_dir: str | Path | None = None,
    ) -> None:
        self.client = client
        addresses = list(workers or client.scheduler_info()["workers"])
        if not addresses:
            raise ValueError("the Dask cluster has no workers")
        config, sampling = engine_config or EngineConfig(), sampling or SamplingConfig()
        futures = [
            client.submit(RolloutActor, env_factory, config, sampling, actor=True, workers=[addr], pure=False)
            for addr in addresses
        ]
        self.actors = [f.result() for f in futures]
        self.shared_dir = Path(shared_dir) if shared_dir is not None else None
        self.version = 0

    def collect(self, rows: Sequence[PromptRow]) -> TensorDictBase:
        """Shard ``rows`` over the engines, run them, and return all episodes as one TensorDict (shard order)."""
        shards = shard_by_group(rows, len(self.actors))
        pending = [actor.collect(shard) for actor, shard in zip(self.actors, shards, strict=False)]
        parts = [future.result() for future in pending]
        trajectories = lazy_stack([part[i] for part in parts for i in range(part.batch_size[0])])
        stale = {v for t in episode_rows(trajectories) for v in t.policy_versions if v != self.version}
        if stale:
            raise RuntimeError(
                f"trajectories stamped with versions {sorted(stale)}; the collector is at {self.version}"
            )
        return trajectories

    def push_weights(self, weights: Mapping[str, torch.Tensor] | torch.nn.Module) -> int:
        """Load ``weights`` into every engine and advance all of them to the next version."""
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else dict(weights)
        version = self.version + 1
        if self.shared_dir is not None:
            payload: bytes | str = str(
                write_state_dict_atomic(state, self.shared_dir / f"policy-v{version}.safetensors")
            )
        else:
            payload = state_dict_to_bytes(state)
        loaded = [future.result() for future in [actor.load_weights(payload, version) for actor in self.actors]]
        if any(v != version for v in loaded):
            raise RuntimeError(f"engines report versions {loaded} after loading version {version}")
        self.version = version
        return version

    def engine_versions(self) -> list[int]:
        """The version each engine reports."""
        return [future.result() for future in [actor.version() for actor in self.actors]]

    def shutdown(self) -> None:
        """Stop every engine and free its memory on its worker (:meth:`RolloutActor.close`); Dask alone would
        drop the actors without freeing their engines. The collector cannot collect afterwards."""
        actors, self.actors = self.actors, []
        for future in [actor.close() for actor in actors]:
            future.result()
