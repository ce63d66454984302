"""The agent route (``env.agent``): OpenAI-API agents written with the plain ``openai`` client
(tests/agent_examples/calculator_agent.py, no llmrl import) against a real engine's endpoint: early config errors,
and a crashing or hung agent (sync and async) fails its own episode only. The GRPO flow run is
tests/test_agent_flow.py."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from llmrl_core.pipeline.config_io import ConfigError, load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig

AGENTS = Path(__file__).parent / "agent_examples"


@pytest.fixture
def agents_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(AGENTS))
    yield
    sys.modules.pop("calculator_agent", None)
    sys.modules.pop("sdk_agent", None)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.agent=no_such_agent_module:solve", "env.agent: cannot import module 'no_such_agent_module'"),
        ("env.agent=calculator_agent:nope", "env.agent: module 'calculator_agent' has no attribute 'nope'"),
        ("env.agent=calculator_agent", "env.agent must look like 'module:function'"),
        ("env.agent=calculator_agent:not_an_agent", r"env.agent: .* must accept \(row, client\)"),
        ("rollout.agent_concurrency=0", "rollout.agent_concurrency must be >= 1, got 0"),
        ("rollout.agent_timeout_s=0", "rollout.agent_timeout_s must be > 0"),
    ],
)
def test_bad_agent_settings_fail_before_anything_starts(agents_on_path, override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(GRPOConfig, None, [override])


def test_an_agent_excludes_env_only_settings(agents_on_path):
    with pytest.raises(ConfigError, match="env.factory does not apply with env.agent"):
        load_config(GRPOConfig, None, ["env.agent=calculator_agent:solve", "env.factory=json:dumps"])
    cfg = load_config(GRPOConfig, None, ["env.agent=calculator_agent:solve", "final_eval.questions=5"])
    assert cfg.final_eval.questions == 5  # the final evaluation plays the agent (tests/test_agent_eval.py)
    cfg = load_config(GRPOConfig, None, ["env.agent=calculator_agent:solve", "rollout.agent_concurrency=3"])
    assert cfg.env.agent == "calculator_agent:solve" and cfg.rollout.agent_concurrency == 3


def _rows(n_groups: int, group_size: int) -> list:
    from llmrl_core.envs.types import PromptRow

    return [
        PromptRow({"query": f"What is {10 + g} + {20 + g}?", "answer": f"#### {30 + 2 * g}"}, f"q{g}", g, i)
        for g in range(n_groups)
        for i in range(group_size)
    ]


def _agent_rollout(engine, agent: str, version: int, max_new_tokens: int, seed: int, timeout_s: float = 120.0):
    """``agent``'s rollout of 2 groups x 2 (``_rows``), 4 at once, on ``engine`` standing at policy ``version``."""
    from transformers import AutoTokenizer

    from llmrl_core.agents import run_agent_rollout
    from llmrl_core.modules.backends.types import SamplingConfig

    worker = types.SimpleNamespace(llm=engine, policy_version=version, config=types.SimpleNamespace(max_model_len=2048))
    return run_agent_rollout(
        worker,
        agent,
        _rows(2, 2),
        SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed),
        tokenizer=AutoTokenizer.from_pretrained(engine.llm_engine.model_config.model),
        concurrency=4,
        timeout_s=timeout_s,
    )


@pytest.mark.parametrize("agent", ["flaky", "flaky_async"])
def test_a_crashing_and_a_hung_agent_fail_only_their_episode(agents_on_path, vllm_engine_fp32, agent):
    """4 episodes at once: the first crashes, the second hangs past the timeout; the other two are stored rows
    whose masked tokens are exactly the engine's sampled ids."""
    import calculator_agent

    calculator_agent._STARTED[0] = 0
    # the hung episode sleeps 60 s; the others take seconds (more on a loaded machine)
    result = _agent_rollout(vllm_engine_fp32, f"calculator_agent:{agent}", 3, 24, seed=11, timeout_s=20.0)
    errors = sorted(o.error for o in result.failures)
    assert errors == ["crash", "timeout"], [(o.error, o.detail) for o in result.outcomes]
    crash = next(o for o in result.failures if o.error == "crash")
    assert "crashed" in crash.detail
    metrics = result.metrics()
    assert metrics["agent_episodes"] == 4 and metrics["agent_failures"] == 2
    assert metrics["agent_failures_crash"] == 1 and metrics["agent_failures_timeout"] == 1
    assert len(result.rows) == 2
    for row in result.rows:
        assert row.num_turns == 4 and row.info["num_tool_calls"] == 3 and not row.info["history_rewritten"]
        assert row.policy_versions == [3, 3, 3, 3]
        assert torch_finite(row.sampler_log_probs)
        log_calls = row.info["agent_calls"]
        assert log_calls == 4
    assert max(result.batch_sizes) > 1  # concurrent episodes shared engine batches


def torch_finite(values) -> bool:
    return bool(values.isfinite().all()) and len(values) > 0


@pytest.mark.parametrize("agent", ["solve", "solve_streamed", "solve_responses"])
def test_an_openai_agents_sdk_agent_trains_as_written(agents_on_path, vllm_engine_fp32, agent):
    """An agent written with the OpenAI Agents SDK (tests/agent_examples/sdk_agent.py: ``Agent``, ``Runner``, a
    ``function_tool``), run, streamed and on the SDK's Responses-API model: every episode is a stored row of the
    engine's exact sampled tokens."""
    pytest.importorskip("agents", reason="openai-agents is not installed")
    result = _agent_rollout(vllm_engine_fp32, f"sdk_agent:{agent}", 5, 96, seed=13)
    failed = [(o.error, o.detail) for o in result.failures]
    if agent == "solve_responses":  # the SDK ends its run with an error on a reply cut at the token cap (OpenAI's
        # "incomplete" status, which the endpoint reports faithfully): that episode fails alone
        failed = [f for f in failed if "max_output_tokens" not in f[1]]
        assert not failed and result.rows, [(o.error, o.detail) for o in result.outcomes]
    else:
        assert not failed and len(result.rows) == 4, failed
    for row in result.rows:
        assert row.info["agent_calls"] >= 1 and set(row.policy_versions) == {5}
        assert torch_finite(row.sampler_log_probs)
        assert 0 < int(row.policy_mask.sum()) == len(row.sampler_log_probs)  # a log-prob per sampled token


def test_an_agent_reads_the_prompt_by_its_data_field_and_may_return_a_bool(vllm_engine_fp32, tmp_path, monkeypatch):
    """The loader renames the prompt field to ``query``; the agent gets it under its data name too (as the held-out
    evaluation gives it), and ``return answer == gold`` (a bool) is its reward."""
    from llmrl_core.agents.rollout import agent_row

    row = {"query": "2+3?", "answer": "5"}
    assert agent_row(row, "question") == {"query": "2+3?", "answer": "5", "question": "2+3?"}
    assert agent_row({"problem": "x"}, "problem") == {"problem": "x", "query": "x"}
    (tmp_path / "field_agent.py").write_text(
        "def solve(row, client):\n"
        "    client.chat.completions.create(model='m', messages=[{'role': 'user', 'content': row['question']}],"
        " max_tokens=2)\n"
        "    return row['question'] == row['query']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        result = _agent_rollout(vllm_engine_fp32, "field_agent:solve", 1, 4, seed=5)
    finally:
        sys.modules.pop("field_agent", None)
    assert [o.error for o in result.outcomes] == [None] * 4 and [o.reward for o in result.outcomes] == [1.0] * 4
