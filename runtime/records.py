"""Collected episodes <-> Parquet rows <-> train samples: the conversions between collector, store and trainer."""

from __future__ import annotations

import math
from typing import Any

import pyarrow.parquet as pq

from llmrl_core.collectors.tensordict_batches import EpisodeRow
from llmrl_core.trainer.batch import TrainSample
from storage.schema import TrajectoryRecord, table_to_records
from storage.trajectories import TrajectoryStore


def trajectory_to_record(
    t: EpisodeRow,
    *,
    run_id: str,
    policy_version: int,
    model_id: str,
    sampling: dict[str, Any],
    weights_fingerprint: str | None = None,
) -> TrajectoryRecord:
    """One stored row for a finished (tokens-mode) episode: prompt = tokens before the first sampled one;
    ``weights_fingerprint``: of the weights the sampling engine held."""
    if t.tokens is None or t.policy_mask is None or t.sampler_log_probs is None:
        raise ValueError("trajectory_to_record needs tokens-mode episodes with log-probs (env input_mode='tokens')")
    mask = t.policy_mask.tolist()
    if True not in mask:
        raise ValueError(f"trajectory of prompt {t.prompt_id} has no sampled token")
    start = mask.index(True)
    tokens = t.tokens.tolist()
    sampled = iter(t.sampler_log_probs.tolist())
    logprobs = [next(sampled) if m else math.nan for m in mask[start:]]
    return TrajectoryRecord(
        run_id=run_id,
        policy_version=policy_version,
        prompt_id=str(t.prompt_id),
        group_id=str(t.group_id),
        sample_index=int(t.sample_index),
        turn=max(0, t.num_turns - 1),
        messages=[dict(m) for m in t.messages],
        prompt_tokens=tokens[:start],
        response_tokens=tokens[start:],
        response_mask=mask[start:],
        sampler_logprobs=logprobs,
        reward=float(t.reward),
        reward_components={k: float(v) for k, v in t.reward_components.items()},
        finish_reason=t.finish_reason or "unknown",
        truncated=bool(t.truncated),
        num_tool_calls=int(t.info.get("num_tool_calls", 0)),
        tool_calls=[dict(call) for call in t.info.get("tool_calls", [])],
        model_id=model_id,
        sampling_params=dict(sampling),
        weights_fingerprint=weights_fingerprint,
    )


def logprob_temperature(row: TrajectoryRecord) -> float:
    """The temperature whose distribution the row's ``sampler_logprobs`` describe (1.0 for raw log-probs)."""
    params = row.sampling_params or {}
    temperature = params.get("temperature")
    if params.get("logprobs_mode") == "processed_logprobs" and temperature:
        return float(temperature)
    return 1.0


def record_to_sample(row: TrajectoryRecord) -> TrainSample:
    """The train step's view of a stored row (its advantage must be set), scored at the row's sampling
    temperature when its log-probs are the sampler's processed ones."""
    if row.advantage is None:
        raise ValueError(f"row {row.run_id}/v{row.policy_version}/{row.group_id}#{row.sample_index} has no advantage")
    return TrainSample(
        prompt_ids=row.prompt_tokens,
        response_ids=row.response_tokens,
        response_mask=row.response_mask,
        sampler_logprobs=row.sampler_logprobs,
        advantage=float(row.advantage),
        ref_logprobs=row.ref_logprobs,
        sample_id=f"{row.run_id}/v{row.policy_version}/{row.group_id}#{row.sample_index}",
        temperature=logprob_temperature(row),
    )


def read_shards(store: TrajectoryStore, run_id: str, version: int) -> list[tuple[str, list[TrajectoryRecord]]]:
    """Every visible shard of a partition as (shard key, records), so a stage can rewrite it in place."""
    out = []
    for info in store.shards(run_id, version=version):
        key = info.name.removesuffix(".parquet")
        shard = int(key.removeprefix("shard-")) if key.startswith("shard-") else key
        out.append((shard, table_to_records(pq.read_table(info.path, filesystem=store.fs))))
    return out
