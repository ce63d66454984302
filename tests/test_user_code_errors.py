"""The user's code that fails on a rollout worker (an agent here; reward functions, env factories and transforms in
their own tests) is a UserCodeError: one line on the command line, never retried."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig


def test_a_shard_whose_agent_episodes_all_failed_is_the_users_code(monkeypatch):
    """Every episode of an ``env.agent`` shard failed: an AgentFailed (one line on the command line, not retried)
    with the first failures' reasons."""
    from llmrl_core.agents import rollout as agent_rollout
    from llmrl_core.modules.backends.types import SamplingConfig
    from llmrl_core.user_code import UserCodeError
    from runtime.rollout_actor import AgentFailed, RolloutWorker
    from tasks.grpo_stages import retry_unless_user_error

    failure = SimpleNamespace(episode_id="e0", error="crash", detail="ValueError: my agent is broken")
    result = SimpleNamespace(rows=[], failures=[failure] * 2, metrics=lambda: {"agent_failures": 2.0})
    monkeypatch.setattr(agent_rollout, "run_agent_rollout", lambda *args, **kwargs: result)
    actor = RolloutWorker.__new__(RolloutWorker)
    actor.cfg = load_config(GRPOConfig, None, ["env.agent=tests.agent_examples.calculator_agent:solve"])
    actor.worker, actor._agent_tokenizer = SimpleNamespace(), object()
    with pytest.raises(AgentFailed, match=r"all 2 episodes failed, e.g. e0: crash: ValueError: my agent is broken"):
        actor._agent_episodes([object(), object()], SamplingConfig())

    class Failed:
        def result(self):
            raise AgentFailed("x")

    assert issubclass(AgentFailed, UserCodeError) and retry_unless_user_error(None, None, Failed()) is False
