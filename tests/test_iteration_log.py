"""tasks/iteration_log.py: a GRPO iteration's metrics row and log lines, checked against hand-computed values."""

from __future__ import annotations

from llmrl_core.pipeline.grpo_config import GRPOConfig
from tasks.iteration_log import (
    agreement_off_line,
    bar_postfix,
    failed_episodes_line,
    iteration_lines,
    iteration_metrics,
)

SHARDS = [
    {"rows": 6, "reward_mean": 0.5, "accuracy": 0.5, "response_tokens_mean": 10.0, "seconds": 3.0,
     "engine_idle_s": 0.2, "response_tokens_min": 4, "response_tokens_max": 20, "tool_calls": 4.0,
     "tool_call_rate": 0.5, "tool_errors": 1.0},
    {"rows": 2, "reward_mean": 1.0, "accuracy": 1.0, "response_tokens_mean": 30.0, "seconds": 5.0,
     "engine_idle_s": 0.1, "engine_reload_s": 0.4, "response_tokens_min": 2, "response_tokens_max": 40,
     "tool_calls": 0.0, "tool_call_rate": 0.0},
]  # fmt: skip
WRITTEN = {
    "rows": 8,
    "partition": "runs/trajectories/run_id=r/policy_version=3",
    "advantages": {"groups": 4, "zero_signal_groups": 1, "dropped_groups": 1},
    "reward_spread": {"reward_p10": 0.0, "reward_p90": 1.0},
}


def test_the_metrics_row_weights_the_shards_by_rows_and_keeps_each_stage_time():
    m = iteration_metrics(
        SHARDS, WRITTEN, {"kl_to_ref": 0.01, "rows": 8}, {"loss": 0.25, "note": "x"},
        sampled=3, trainer_wait_s=1.5, train_s=2.5,
    )  # fmt: skip
    assert m["reward_mean"] == (6 * 0.5 + 2 * 1.0) / 8 and m["response_tokens_mean"] == (60 + 60) / 8
    assert (m["response_tokens_min"], m["response_tokens_max"]) == (2, 40)
    assert m["tool_call_rate"] == (6 * 0.5) / 8 and m["tool_success_rate"] == 1 - 1 / 4
    assert (m["rollout_s"], m["rollout_idle_s"], m["engine_reload_s"]) == (5.0, 0.2, 0.4)
    assert (m["trainer_wait_s"], m["train_s"], m["sampled_by_version"]) == (1.5, 2.5, 3.0)
    assert m["groups_with_signal"] == 2 and m["kl_to_ref"] == 0.01 and m["loss"] == 0.25
    assert "rows" not in m and "note" not in m  # counts of the reference and text of the trainer stay out


def test_the_lines_of_a_version():
    m = iteration_metrics(SHARDS, WRITTEN, {}, {"loss": 0.25}, sampled=1, trainer_wait_s=1.5, train_s=2.5)
    m["iteration_s"] = 9.04
    lines = iteration_lines(3, m, WRITTEN, staleness=2)
    assert lines[0] == (
        "version 3 -> 4: 8 rollouts, reward 0.625, accuracy 0.625, distinct nan, 15 response tokens, loss 0.2500, "
        "sampler/trainer |delta log-prob| mean nan max nan, 9.0 s; trajectories runs/trajectories/run_id=r/"
        "policy_version=3"
    )
    assert lines[1].startswith("version 3: batch sampled by version 1 (2 behind); trainer waited 1.5 s")
    assert lines[2] == "version 3: 38% of rollouts called a tool, 75% of the calls worked"
    untrained = {k: v for k, v in m.items() if k != "loss"}
    assert "nothing trained (2 groups with signal)" in iteration_lines(3, untrained, WRITTEN, staleness=0)[0]
    momentum = {**untrained, "zero_gradient_step": 1.0}  # train.exact_skip on a version without signal
    line = iteration_lines(3, momentum, WRITTEN, staleness=0)[0]
    assert "no group with signal: the optimizer's step with zero gradients (momentum)" in line
    assert bar_postfix(m) == {"reward": "0.625", "acc": "0.625", "distinct": "nan", "s": "9"}


def test_the_warnings_say_what_is_off():
    cfg = GRPOConfig()
    assert agreement_off_line(2, {"agreement_off": 0.0, "agreement_abs_diff_mean": 0.01}, cfg) is None
    line = agreement_off_line(2, {"agreement_off": 1.0, "agreement_abs_diff_mean": 0.25}, cfg)
    assert line.startswith("version 2: sampler and trainer disagree before training: mean |delta log-prob| 0.2500")
    assert "(max nan, KL nan) > train.agreement_warn 0.100" in line
    assert failed_episodes_line(1, SHARDS) is None
    failed = [{"reward_errors": 2.0, "reward_error_examples": ["row 3: ValueError"]}, {"reward_errors": 1.0}]
    assert failed_episodes_line(1, failed) == (
        "version 1: 3 episode(s) skipped (env.reward_errors=skip), e.g. row 3: ValueError"
    )


def test_failed_agent_episodes_are_counted_by_kind_with_an_example():
    """Issue 71: a batch whose agent episodes failed said "4 rollouts" and nothing else; the line counts every
    episode, trained and failed by kind, and gives the failed share the run's limit is checked against."""
    from tasks.iteration_log import failed_agent_episodes

    assert failed_agent_episodes(3, SHARDS) == (None, 0.0)
    shards = [
        {"agent_episodes": 8.0, "agent_failures": 6.0, "agent_failures_crash": 4.0, "agent_failures_timeout": 2.0,
         "agent_failure_examples": ["p3-1: crash: ValueError: boom"]},
        {"agent_episodes": 8.0, "agent_failures": 6.0, "agent_failures_bad_result": 4.0, "agent_failures_crash": 2.0},
    ]  # fmt: skip
    line, share = failed_agent_episodes(3, shards)
    assert line == (
        "version 3: 16 episodes: 4 trained, 12 failed (4 bad_result, 6 crash, 2 timeout), e.g. p3-1: crash: "
        "ValueError: boom"
    )
    assert share == 0.75 and share > GRPOConfig().rollout.max_failed_fraction  # the default stops such a batch


def test_the_cuda_memory_line_shows_the_largest_engine_and_the_trainer():
    """On a GPU each shard reports its engine's peak CUDA memory and the train step the trainer's: the row keeps
    the largest engine's, and a line sets both beside each other (none on CPU)."""
    shards = [dict(SHARDS[0], engine_cuda_peak_gib=1.5, engine_cuda_reserved_gib=2.0),
              dict(SHARDS[1], engine_cuda_peak_gib=2.25, engine_cuda_reserved_gib=2.5)]  # fmt: skip
    train = {"loss": 0.25, "train_cuda_peak_gib": 3.125, "train_cuda_reserved_gib": 4.0}
    m = iteration_metrics(shards, WRITTEN, {}, train, sampled=3, trainer_wait_s=0.0, train_s=1.0) | {"iteration_s": 9}
    assert (m["engine_cuda_peak_gib"], m["engine_cuda_reserved_gib"]) == (2.25, 2.5)
    lines = iteration_lines(3, m, WRITTEN, staleness=0)
    line = "version 3: CUDA memory peak (allocated / reserved): trainer 3.12 / 4.00 GiB, engine 2.25 / 2.50 GiB"
    assert line in lines
    cpu = iteration_metrics(SHARDS, WRITTEN, {}, {"loss": 0.25}, sampled=3, trainer_wait_s=0.0, train_s=1.0)
    assert not any("CUDA memory" in line for line in iteration_lines(3, cpu | {"iteration_s": 9}, WRITTEN, 0))
