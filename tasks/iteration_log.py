"""What one GRPO iteration reports: its metrics, assembled from the rollout shards, the advantages, the reference
scoring and the train step, and the lines the flow logs about it (the version line, asynchronous and tool lines,
the agreement and skipped-episode warnings)."""

from __future__ import annotations

from typing import Any

from llmrl_core.pipeline.grpo_config import GRPOConfig

NAN = float("nan")


def merge_shard_metrics(shards: list[dict]) -> dict[str, float]:
    """Row-weighted means of the shards' rollout metrics (min/max of the token extremes)."""
    rows = sum(s["rows"] for s in shards)
    merged: dict[str, float] = {}
    for key in (
        "reward_mean",
        "accuracy",
        "answer_rate",
        "distinct_responses",
        "identical_groups",
        "response_tokens_mean",
        "truncated_rate",
    ):
        if all(key in s for s in shards):
            merged[key] = sum(s[key] * s["rows"] for s in shards) / rows
    calls = sum(s.get("tool_calls", 0.0) for s in shards)
    if calls:  # a tool env: the share of rollouts that called a tool, and the share of calls that worked
        merged["tool_call_rate"] = sum(s.get("tool_call_rate", 0.0) * s["rows"] for s in shards) / rows
        merged["tool_success_rate"] = 1.0 - sum(s.get("tool_errors", 0.0) for s in shards) / calls
    if any("reward_errors" in s for s in shards):  # env.reward_errors=skip: episodes whose reward function failed
        merged["reward_errors"] = sum(s.get("reward_errors", 0.0) for s in shards)
    for key in {k for s in shards for k in s if k.startswith("agent_") and isinstance(s[k], int | float)}:
        merged[key] = sum(s.get(key, 0.0) for s in shards)  # env.agent: episodes, failures (by kind), ...
    if any("agent_calls_mean" in s for s in shards):  # ... except the per-row mean, weighted by the stored rows
        merged["agent_calls_mean"] = sum(s.get("agent_calls_mean", 0.0) * s["rows"] for s in shards) / max(rows, 1)
    # rollout.sleep_level: the engines' sleep and wake; an engine's peak CUDA memory (the largest engine's)
    for key in ("engine_sleep_s", "engine_wake_s", "engine_cuda_peak_gib", "engine_cuda_reserved_gib"):
        if any(key in s for s in shards):
            merged[key] = max(s.get(key, 0.0) for s in shards)
    if all("response_tokens_min" in s for s in shards):
        merged["response_tokens_min"] = min(s["response_tokens_min"] for s in shards)
        merged["response_tokens_max"] = max(s["response_tokens_max"] for s in shards)
    return merged


def iteration_metrics(
    shards: list[dict],
    written: dict[str, Any],
    ref_info: dict[str, Any],
    train_metrics: dict[str, Any],
    *,
    sampled: int,
    trainer_wait_s: float,
    train_s: float,
) -> dict[str, float]:
    """The version's metrics row: the shards' rollout metrics, where the time went, the advantages' signal, the
    reward spread, the reference KL and the train step's numbers (``iteration_s`` is added by the caller)."""
    adv = written["advantages"]
    return {
        **merge_shard_metrics(shards),
        "rollout_s": max(s["seconds"] for s in shards),
        "trainer_wait_s": trainer_wait_s,  # the trainer idle, waiting for this batch's rollouts
        # the engines idle (no rollout, no weight load) before they started this batch
        "rollout_idle_s": max(s["engine_idle_s"] for s in shards),
        # the engines' own reload of the weights they sampled with (kernel re-packing included)
        "engine_reload_s": max(s.get("engine_reload_s", 0.0) for s in shards),
        "train_s": train_s,
        "sampled_by_version": float(sampled),
        "groups_with_signal": adv["groups"] - adv["zero_signal_groups"] - adv["dropped_groups"],
        **written["reward_spread"],
        **{k: float(v) for k, v in ref_info.items() if k != "rows"},
        **{k: float(v) for k, v in train_metrics.items() if isinstance(v, int | float)},
    }


def iteration_lines(version: int, metrics: dict[str, float], written: dict[str, Any], staleness: int) -> list[str]:
    """The flow's log lines for a trained version: one always, one for an asynchronous batch, one for a tool env."""
    if "loss" in metrics:
        trained = f"loss {metrics['loss']:.4f}"
    elif metrics.get("zero_gradient_step"):
        trained = "no group with signal: the optimizer's step with zero gradients (momentum)"
    else:
        trained = f"nothing trained ({metrics.get('groups_with_signal', 0):.0f} groups with signal)"
    lines = [
        f"version {version} -> {version + 1}: {written['rows']} rollouts, reward {metrics['reward_mean']:.3f}, "
        f"accuracy {metrics.get('accuracy', NAN):.3f}, distinct {metrics.get('distinct_responses', NAN):.2f}, "
        f"{metrics['response_tokens_mean']:.0f} response tokens, {trained}, sampler/trainer |delta log-prob| mean "
        f"{metrics.get('agreement_abs_diff_mean', NAN):.2e} max {metrics.get('agreement_abs_diff_max', NAN):.2e}, "
        f"{metrics['iteration_s']:.1f} s; trajectories {written['partition']}"
    ]
    if staleness:
        lines.append(
            f"version {version}: batch sampled by version {metrics['sampled_by_version']:.0f} ({staleness} behind); "
            f"trainer waited {metrics['trainer_wait_s']:.1f} s for it, engines idle {metrics['rollout_idle_s']:.1f} s "
            f"before it; off-policy |delta log-prob| {metrics.get('offpolicy_abs_diff_mean', NAN):.2e}"
        )
    if "train_cuda_peak_gib" in metrics or "engine_cuda_peak_gib" in metrics:
        lines.append(f"version {version}: {cuda_peak_line(metrics)}")
    if "tool_call_rate" in metrics:
        lines.append(
            f"version {version}: {100 * metrics['tool_call_rate']:.0f}% of rollouts called a tool, "
            f"{100 * metrics['tool_success_rate']:.0f}% of the calls worked"
        )
    return lines


def cuda_peak_line(metrics: dict[str, float]) -> str:
    """The processes' peak CUDA memory so far (allocated by tensors / reserved by PyTorch's allocator), to set
    beside ``llmrl plan``'s figures."""
    parts = [
        f"{who} {metrics[f'{key}_cuda_peak_gib']:.2f} / {metrics.get(f'{key}_cuda_reserved_gib', NAN):.2f} GiB"
        for who, key in (("trainer", "train"), ("engine", "engine"))
        if f"{key}_cuda_peak_gib" in metrics
    ]
    return "CUDA memory peak (allocated / reserved): " + ", ".join(parts)


def bar_postfix(metrics: dict[str, float]) -> dict[str, str]:
    """The progress bar's figures after a version."""
    return {
        "reward": f"{metrics['reward_mean']:.3f}",
        "acc": f"{metrics.get('accuracy', NAN):.3f}",
        "distinct": f"{metrics.get('distinct_responses', NAN):.2f}",
        "s": f"{metrics['iteration_s']:.0f}",
    }


def agreement_off_line(version: int, metrics: dict[str, Any], cfg: GRPOConfig) -> str | None:
    """The warning (or, with ``train.agreement_stop``, the error) for an iteration whose sampler and trainer
    disagree before training; None when they agree."""
    if not metrics.get("agreement_off"):
        return None
    return (
        f"version {version}: sampler and trainer disagree before training: mean |delta log-prob| "
        f"{metrics['agreement_abs_diff_mean']:.4f} (max {metrics.get('agreement_abs_diff_max', float('nan')):.3f}, "
        f"KL {metrics.get('agreement_kl_to_sampler', float('nan')):.5f}) > train.agreement_warn "
        f"{cfg.train.agreement_warn:.3f}. The engines may hold other weights than the trainer (a failed weight "
        "publish), or sample in another dtype/temperature than it scores."
    )


def failed_agent_episodes(version: int, shards: list[dict]) -> tuple[str | None, float]:
    """The line for a batch in which agent episodes failed ("version 3: 16 episodes: 4 trained, 12 failed
    (4 bad_result, 4 crash, 4 timeout), e.g. ..."), and the failed share; (None, 0.0) when none failed."""
    episodes = sum(s.get("agent_episodes", 0.0) for s in shards)
    failed = sum(s.get("agent_failures", 0.0) for s in shards)
    if not failed:
        return None, 0.0
    kinds: dict[str, float] = {}
    for shard in shards:
        for key, count in shard.items():
            if key.startswith("agent_failures_"):
                kinds[key.removeprefix("agent_failures_")] = kinds.get(key.removeprefix("agent_failures_"), 0) + count
    how = ", ".join(f"{count:.0f} {kind}" for kind, count in sorted(kinds.items()))
    example = next((e for s in shards for e in s.get("agent_failure_examples", [])), None)
    line = (
        f"version {version}: {episodes:.0f} episodes: {episodes - failed:.0f} trained, {failed:.0f} failed ({how})"
        + (f", e.g. {example[:300]}" if example else "")
    )
    return line, failed / episodes if episodes else 1.0


def failed_episodes_line(version: int, shards: list[dict]) -> str | None:
    """The warning for a batch in which some episodes' reward functions failed (skipped), with an example."""
    failed = sum(s.get("reward_errors", 0.0) for s in shards)
    if not failed:
        return None
    example = next(e for s in shards for e in s.get("reward_error_examples", []))
    return f"version {version}: {failed:.0f} episode(s) skipped (env.reward_errors=skip), e.g. {example}"
