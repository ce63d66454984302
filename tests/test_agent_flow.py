"""The agent route end to end: the GRPO flow trains a 3-tool-call agent written with the plain ``openai`` client
(tests/agent_examples/calculator_agent.py) for 2 iterations; the stored token ids are the engine's sampled ids
and trainer/sampler agreement is at the level of the built-in envs."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

AGENTS = Path(__file__).parent / "agent_examples"


@pytest.fixture
def agents_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(AGENTS))
    yield
    sys.modules.pop("calculator_agent", None)


@pytest.mark.slow
@pytest.mark.isolated
def test_grpo_trains_a_three_tool_call_agent_from_the_engines_exact_tokens(tmp_path, agents_on_path, monkeypatch):
    from flows.grpo import grpo
    from storage.trajectories import TrajectoryStore

    log = tmp_path / "agent-calls.jsonl"
    monkeypatch.setenv("CALC_AGENT_LOG", str(log))
    runs = tmp_path / "runs"
    grpo(
        overrides=[
            "run_id=agent",
            f"runs_dir={runs}",
            "progress=false",
            "iterations=2",
            "data.source=arithmetic:train",
            "data.prompts_per_iteration=2",
            "data.group_size=2",
            "env.agent=calculator_agent:solve",
            "rollout.agent_concurrency=4",
            "rollout.agent_timeout_s=90",
            "rollout.max_new_tokens=24",
            "rollout.dtype=float32",
            "rollout.temperature=1.0",
            "train.mixed_precision=no",  # fp32 on both sides, as the built-in envs' agreement test
            "train.lr=1e-5",
        ]
    )
    store = TrajectoryStore(runs / "trajectories")
    assert store.versions("agent") == [0, 1]
    from transformers import AutoTokenizer

    from llmrl_core.model_store import ensure_default_model

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_default_model()))
    episodes = [json.loads(line) for line in log.read_text().splitlines()]
    engine_ids = {tuple(t for call in e["calls"] for t in call["token_ids"]) for e in episodes}
    for call in (c for e in episodes for c in e["calls"]):
        if call["content"] is not None and "<tool_call>" not in call["content"]:
            assert tokenizer.decode(call["token_ids"], skip_special_tokens=True) == call["content"]
    for version in (0, 1):
        records = store.read_records("agent", version=version)
        assert len(records) == 4
        for r in records:
            assert r.num_tool_calls == 3 and r.turn == 3  # 3 tool calls, 4 model calls
            assert [m["role"] for m in r.messages].count("tool") == 3
            sampled = tuple(t for t, m in zip(r.response_tokens, r.response_mask, strict=True) if m)
            assert sampled in engine_ids  # the stored ids are the engine's, call after call
            assert r.response_tokens[0] == sampled[0] and False in r.response_mask  # tool turns masked out
            for m, lp in zip(r.response_mask, r.sampler_logprobs, strict=True):
                assert m == math.isfinite(lp)
            assert r.reward_components["calculator_calls"] == 3.0
            assert r.sampling_params["temperature"] == pytest.approx(1.0)
        metrics = json.loads((runs / "agent" / "state" / f"published-v{version + 1}.json").read_text())["metrics"]
        assert metrics["agent_episodes"] == 4 and metrics["agent_failures"] == 0
        assert metrics["agreement_abs_diff_mean"] < 1e-3, metrics  # as the built-in envs (test_grpo_flow)
        assert metrics["agreement_off"] == 0.0
