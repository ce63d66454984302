"""The agent route's failures through the GRPO flow: one episode crashes and one hangs past
``rollout.agent_timeout_s``; the batch still trains, the two episodes are counted and not stored, and the
group that lost rows trains on the rows it kept (tests/agent_examples/calculator_agent.py:flaky)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

AGENTS = Path(__file__).parent / "agent_examples"


@pytest.mark.slow
@pytest.mark.isolated
# extended tier (README "Tests"): the default run reaches the same episodes' failures at the route
# (tests/test_agent_route.py, the same flaky agents, sync and async) and the agent route in the flow
# (tests/test_agent_flow.py); this adds the group that lost rows training on the rest (~2-3 min)
@pytest.mark.extended
def test_a_crashing_and_a_hung_episode_fail_alone_in_the_flow(tmp_path, monkeypatch):
    from flows.grpo import grpo
    from storage.trajectories import TrajectoryStore

    monkeypatch.syspath_prepend(str(AGENTS))
    from tasks.grpo_stages import EpisodesFailed

    runs = tmp_path / "runs"
    settings = [
        f"runs_dir={runs}",
        "progress=false",
        "iterations=1",
        "data.source=arithmetic:train",
        "data.prompts_per_iteration=2",
        "data.group_size=3",
        "env.agent=calculator_agent:flaky",
        "rollout.agent_concurrency=6",
        "rollout.agent_timeout_s=25",
        "rollout.max_new_tokens=16",
        "rollout.dtype=float32",
        "train.mixed_precision=no",
    ]
    try:
        # more failed than rollout.max_failed_fraction allows: the run stops before training, naming the counts
        with pytest.raises(EpisodesFailed, match=r"6 episodes: 4 trained, 2 failed \(1 crash, 1 timeout\), e\.g\. "):
            grpo(overrides=[*settings, "run_id=flaky-stop", "rollout.max_failed_fraction=0.2"])
        assert not (runs / "flaky-stop" / "state" / "published-v1.json").exists()
        grpo(overrides=[*settings, "run_id=flaky"])  # within the default limit (2 of 6): it trains on the rest
    finally:
        sys.modules.pop("calculator_agent", None)
    records = TrajectoryStore(runs / "trajectories").read_records("flaky", version=0)
    assert len(records) == 4  # 6 episodes, 2 failed
    sizes = Counter(r.group_id for r in records)
    assert sorted(sizes.values()) in ([1, 3], [2, 2])  # a group lost rows, the rest of it is stored
    for r in records:
        if sizes[r.group_id] == 1:
            assert r.advantage == 0.0  # a group of one has no baseline: nothing to learn from it
    metrics = json.loads((runs / "flaky" / "state" / "published-v1.json").read_text())["metrics"]
    assert metrics["agent_episodes"] == 6 and metrics["agent_failures"] == 2
    assert metrics["agent_failures_crash"] == 1 and metrics["agent_failures_timeout"] == 1
    assert metrics["train_samples"] >= 1
