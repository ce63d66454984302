"""LLMCollector (sync and async) and the Dask-distributed collector on the packaged model."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from llmrl_core.collectors import DialogTurn, LLMCollector, Trajectory
from llmrl_core.envs import ChatEnv, PolicyVersion, Transform, make_gsm8k_env
from llmrl_core.policies.base import SamplingConfig
from llmrl_core.policies.vllm_wrapper import vLLMWrapper

GSM8K_TEST = "../shared/data/gsm8k_test.jsonl"


@pytest.fixture(scope="module")
def policy(vllm_engine_fp32):
    return vLLMWrapper(vllm_engine_fp32, sampling=SamplingConfig(max_new_tokens=24, temperature=0.8, seed=0))


def _gsm8k_env(tokenizer, batch_size=2, repeats=2, input_mode="history"):
    return make_gsm8k_env(batch_size=batch_size, repeats=repeats, tokenizer=tokenizer, input_mode=input_mode, seed=0)


def test_sync_collector_yields_trajectories_and_stamps_versions(policy):
    env = _gsm8k_env(policy.tokenizer, input_mode="tokens")
    version = PolicyVersion()
    env.append_transform(version)
    collector = LLMCollector(env, policy, total_trajectories=8)
    assert collector.version_tracker is version  # the env's own PolicyVersion is used
    batches = []
    for batch in collector:
        batches.append(batch)
        collector.increment_version()
    assert [len(b) for b in batches] == [4, 4]
    for expected_version, batch in enumerate(batches):
        assert all(isinstance(t, Trajectory) for t in batch)
        assert all(t.policy_versions == [expected_version] for t in batch)
        # one GRPO group per prompt: 2 prompts x 2 copies, copies share the group id and the prompt
        groups = {}
        for t in batch:
            groups.setdefault(t.group_id, []).append(t)
        assert sorted(len(g) for g in groups.values()) == [2, 2]
        for members in groups.values():
            assert len({m.history[1].text for m in members}) == 1
        for t in batch:
            assert t.reward in (0.0, 0.1, 1.0)
            assert t.terminated or t.truncated
            assert t.num_turns == 1 and t.finish_reason in {"stop", "length"}
            # tokens mode: the exact sampled ids sit inside the trajectory tokens, under the policy mask
            sampled = t.responses[0].token_ids
            assert t.tokens[t.policy_mask].tolist() == sampled.tolist()
    assert version.version == 2


def test_dialog_turn_batches_and_sink(policy):
    env = ChatEnv(tokenizer=policy.tokenizer, max_turns=2, batch_size=3)
    sink: queue.Queue = queue.Queue()
    prompts = [{"query": q} for q in ["Hi!", "Name a fruit.", "What is 1+1?"] * 2]
    collector = LLMCollector(
        env,
        policy,
        prompts=prompts,
        yield_completed_trajectories=False,
        dialog_turns_per_batch=4,
        total_dialog_turns=12,
        sink=sink,
    )
    batches = list(collector)
    assert [len(b) for b in batches] == [4, 4, 4]
    turns = [t for b in batches for t in b]
    assert all(isinstance(t, DialogTurn) for t in turns)
    # 2 turns per conversation: the second turn's prompt holds the first answer
    assert sorted(t.turn for t in turns) == [1] * 6 + [2] * 6
    # the second turn's prompt is the whole conversation so far: the query and the first answer
    first_answers = {t.response.text.strip() for t in turns if t.turn == 1}
    for t in (t for t in turns if t.turn == 2):
        assert [m.role for m in t.prompt.messages] == ["user", "assistant"]
        assert t.prompt.messages[-1].text.strip() in first_answers
    assert sink.qsize() == 3 and sink.get() == batches[0]


class StuckTool(Transform):
    """A tool that hangs (until released) for conversations whose query says "stuck"."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def step_slot(self, slot) -> None:
        if "stuck" in slot.data.get("query", ""):
            self.release.wait(timeout=300)
        slot.add_reward(1.0, name="done")
        slot.terminate()


def test_async_collector_finishes_while_one_env_is_stuck_in_a_tool(policy):
    release = threading.Event()
    envs = []
    for _ in range(3):
        env = ChatEnv(tokenizer=policy.tokenizer, batch_size=1, max_turns=1)
        env.append_transform(StuckTool(release))
        envs.append(env)
    prompts = [{"query": "You are stuck in a tool."}] + [{"query": f"Say the number {i}."} for i in range(4)]
    collector = LLMCollector(envs, policy, prompts=prompts, async_envs=True, total_trajectories=4)
    start = time.monotonic()
    try:
        trajectories = collector.collect()
    finally:
        release.set()
    assert time.monotonic() - start < 240
    assert len(trajectories) == 4
    assert all("stuck" not in t.data["query"] for t in trajectories)
    assert sorted(t.data["query"] for t in trajectories) == [f"Say the number {i}." for i in range(4)]
    assert all(t.reward == 1.0 and t.policy_version == 0 for t in trajectories)


def test_collector_argument_errors(policy):
    env = ChatEnv(tokenizer=policy.tokenizer)
    with pytest.raises(ValueError, match="async_envs=True"):
        LLMCollector([env, env], policy)
    with pytest.raises(ValueError, match="needs total_dialog_turns or total_trajectories"):
        LLMCollector(env, policy).collect()
