"""Held-out evaluation of an agent run (``env.agent``): the evaluate flow and the GRPO flow's ``final_eval`` play
every held-out row with the run's agent against the endpoint of the evaluation engine, with the evaluation's
sampling imposed, and report task success per version with the paired change against version 0."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from llmrl_core.agents.runner import EpisodeOutcome
from llmrl_core.evaluation.agent_eval import agent_sample, agent_success
from tasks.evaluate import env_scoring

AGENTS = Path(__file__).parent / "agent_examples"


@pytest.fixture
def agents_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(AGENTS))
    yield
    sys.modules.pop("calculator_agent", None)


def test_task_success_is_the_agents_success_entry_else_a_positive_reward():
    assert agent_success(EpisodeOutcome("e", reward=0.1))
    assert not agent_success(EpisodeOutcome("e", reward=0.0))
    assert not agent_success(EpisodeOutcome("e", reward=1.0, components={"success": 0.0}))
    assert agent_success(EpisodeOutcome("e", reward=0.0, components={"success": 1.0}))
    assert not agent_success(EpisodeOutcome("e", reward=1.0, error="timeout"))
    failed = agent_sample(EpisodeOutcome("e", error="crash", detail="boom"), None)
    assert not failed.correct and failed.extra["agent_failed"] == 1.0 and failed.reward == 0.0


def test_an_agents_result_is_any_number_a_reward_function_may_return():
    """``return answer == gold``, NumPy and one-element tensor rewards are rewards; a ``success`` flag given as a
    bool decides task success (a False one was dropped, and a positive reward counted as a success)."""
    import numpy as np
    import torch

    from llmrl_core.agents.runner import read_result

    numbers = (True, False, np.float32(0.5), np.int64(2), torch.tensor(0.25))
    assert [read_result("e", r, 0.1).reward for r in numbers] == [1.0, 0.0, 0.5, 2.0, 0.25]
    flagged = read_result("e", {"reward": 1.0, "success": False, "tool_calls": np.int64(3), "note": "x"}, 0.1)
    assert flagged.components == {"success": 0.0, "tool_calls": 3.0} and not agent_success(flagged)
    assert agent_success(read_result("e", {"reward": 0.0, "success": True}, 0.1))
    for bad in ("1.0", None, float("nan"), torch.ones(2), {"score": 1.0}):
        assert read_result("e", bad, 0.1).error == "bad_result"


def test_an_agent_run_is_scored_by_its_agent():
    assert env_scoring({"agent": "m:f", "name": "gsm8k"}) == "agent"
    assert env_scoring({"name": "gsm8k"}) == "single_turn"


@pytest.mark.extended  # the long tier: pytest -m extended (README "Tests")
@pytest.mark.slow
@pytest.mark.isolated
def test_evaluate_flow_and_final_eval_play_the_agent_per_version(tmp_path, agents_on_path, monkeypatch):
    from flows.evaluate import evaluate
    from flows.grpo import grpo

    runs = tmp_path / "runs"
    summary = grpo(
        overrides=[
            "run_id=agent-eval",
            f"runs_dir={runs}",
            "progress=false",
            "iterations=1",
            "data.source=arithmetic:train",
            "task.eval_source=arithmetic:test",
            "data.prompts_per_iteration=2",
            "data.group_size=2",
            "env.agent=calculator_agent:solve",
            "rollout.agent_concurrency=4",
            "rollout.max_new_tokens=16",
            "train.lr=1e-5",
            "final_eval.questions=2",  # no longer refused with env.agent: the final evaluation plays the agent
        ]
    )
    assert "held-out accuracy" in summary["final_eval"]["line"]
    assert {r["version"] for r in summary["final_eval"]["rows"]} == {0, 1}

    out = evaluate(
        "agent-eval",
        versions=[0, 1],
        runs_dir=str(runs),
        n_questions=3,
        n_samples=1,
        temperature=0.5,
        max_new_tokens=16,
        log_mlflow=False,
    )
    rows = {(r["version"], r["mode"]): r for r in out["rows"]}
    assert set(rows) == {(0, "greedy"), (1, "greedy"), (0, "sampled"), (1, "sampled")}
    for row in rows.values():
        assert row["num_questions"] == 3 and 0.0 <= row["accuracy"] <= 1.0 and row["agent_failed"] == 0.0
        assert row["turns"] == 4.0 and row["tool_calls"] == 3.0  # the test agent: 3 tool calls, then the answer
    assert "delta_accuracy" in rows[(1, "greedy")] and "delta_accuracy_se" in rows[(1, "greedy")]
    result = json.loads(Path(out["results"]["1"]).read_text())
    assert result["settings"]["agent"] == "calculator_agent:solve"
    assert result["modes"]["greedy"]["temperature"] == 0.0 and result["modes"]["sampled"]["temperature"] == 0.5
    report = Path(out["report_markdown"]).read_text()
    assert "accuracy" in report
