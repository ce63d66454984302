"""What the model wrote, in MLflow: a sample of each version's rollouts as MLflow traces of the run.

Per version: every response of one whole GRPO group (the first), and the version's best and worst response by
reward. A trace's input is the prompt (the chat messages before the answer), its output the response; its tags
name the llmrl run, the policy version and why it was picked (``group``, ``best``, ``worst``); the reward and the
advantage are feedback assessments; token counts, finish reason and reward parts are attributes. MLflow lists them
under the run ("Traces"), searchable with ``MlflowClient.search_traces(..., run_id=...)``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


def trace_sample(records: Sequence[Any]) -> list[dict[str, Any]]:
    """The rows to trace from one version's :class:`~storage.schema.TrajectoryRecord`s, as plain dicts."""
    if not records:
        return []
    first_group = records[0].group_id
    picked: dict[int, str] = {i: "group" for i, r in enumerate(records) if r.group_id == first_group}
    by_reward = sorted(range(len(records)), key=lambda i: (records[i].reward, -i))
    picked.setdefault(by_reward[-1], "best")
    picked.setdefault(by_reward[0], "worst")
    sample = []
    for index, role in sorted(picked.items()):
        r = records[index]
        messages = list(r.messages)
        answer = next((j for j in range(len(messages) - 1, -1, -1) if messages[j].get("role") == "assistant"), None)
        sample.append(
            {
                "role": role,
                "policy_version": int(r.policy_version),
                "group_id": str(r.group_id),
                "sample_index": int(r.sample_index),
                "prompt": messages[:answer] if answer is not None else messages,
                "response": messages[answer].get("content", "") if answer is not None else "",
                "reward": float(r.reward),
                "advantage": None if r.advantage is None else float(r.advantage),
                "reward_components": {k: float(v) for k, v in (r.reward_components or {}).items()},
                "prompt_tokens": len(r.prompt_tokens),
                "response_tokens": len(r.response_tokens),
                "finish_reason": str(r.finish_reason),
            }
        )
    return sample


def log_traces(recorder: Any, run_id: str, sample: Sequence[dict[str, Any]]) -> list[str]:
    """Log ``sample`` as traces of ``recorder``'s MLflow run; returns the trace ids."""
    import mlflow

    if not sample:
        return []
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")  # written before the report returns
    mlflow.set_tracking_uri(recorder.tracking_uri)  # the tracing exporter writes to the global store
    client = recorder.client
    ids = []
    for row in sample:
        version = row["policy_version"]
        span = client.start_trace(
            f"{run_id} v{version} {row['role']}",
            span_type="LLM",
            inputs={"messages": row["prompt"]},
            attributes={"group_id": row["group_id"], "sample_index": str(row["sample_index"])},
            tags={"llmrl.run_id": run_id, "llmrl.policy_version": str(version), "llmrl.sample": row["role"]},
            experiment_id=recorder.experiment_id,
            run_id=recorder.mlflow_run_id,
        )
        client.end_trace(
            span.trace_id,
            outputs={"response": row["response"]},
            attributes={
                "prompt_tokens": row["prompt_tokens"],
                "response_tokens": row["response_tokens"],
                "finish_reason": row["finish_reason"],
                "reward_components": row["reward_components"],
            },
        )
        mlflow.log_feedback(trace_id=span.trace_id, name="reward", value=row["reward"])
        if row["advantage"] is not None:
            mlflow.log_feedback(trace_id=span.trace_id, name="advantage", value=row["advantage"])
        ids.append(span.trace_id)
    return ids
