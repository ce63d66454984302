"""``env.name=countdown`` in the flows: the ``countdown:train`` / ``countdown:test`` rows, the config defaults it
brings, and a real GRPO run whose rows are scored by the Countdown rule (held-out problems are played in the run's
env, as for every env that is not gsm8k/arithmetic/ifeval: ``tasks.evaluate.env_scoring``)."""

from __future__ import annotations

import json

import pytest

from llmrl_core.builtin_data.countdown_data import countdown_rows
from llmrl_core.builtin_data.sources import load_source_rows, resolve_source
from llmrl_core.envs.countdown import CountdownRewardParser, parse_ground_truth
from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig


def test_the_splits_are_made_the_same_way_each_time_and_share_no_problem():
    train, test = resolve_source("countdown:train"), load_source_rows("countdown:test")
    assert (len(train), len(test)) == (10_000, 1_000)
    assert train[:5] == countdown_rows("countdown:train", n=5)  # made again, the same
    assert not {r["answer"] for r in train} & {r["answer"] for r in test}
    for row in test[:50]:
        target, numbers = parse_ground_truth(row["answer"])
        assert len(numbers) == 4 and all(1 <= n <= 100 for n in numbers) and 1 <= target <= 1000
        assert str(numbers) in row["question"]


def test_env_args_size_the_problems_and_unknown_ones_are_named():
    rows = load_source_rows("countdown:test", limit=20, env_options={"num_count": 3, "max_number": 9, "seed": 4})
    assert all(len(parse_ground_truth(r["answer"])[1]) == 3 for r in rows)
    assert all(max(parse_ground_truth(r["answer"])[1]) <= 9 for r in rows)
    assert rows != load_source_rows("countdown:test", limit=20, env_options={"num_count": 3, "max_number": 9})
    with pytest.raises(ValueError, match=r"expected countdown:train or countdown:test"):
        countdown_rows("countdown:dev")


def test_the_env_brings_its_sources_and_prompt_unless_the_user_set_them():
    cfg = load_config(GRPOConfig, None, ["env.name=countdown"])
    assert (cfg.data.source, cfg.task.eval_source) == ("countdown:train", "countdown:test")
    assert cfg.task.system_prompt.startswith("A conversation between User and Assistant. The user gives a set")
    assert cfg.task.question_template is None
    own = load_config(GRPOConfig, None, ["env.name=countdown", "task.system_prompt=Solve it.", "data.source=x.jsonl"])
    assert (own.task.system_prompt, own.data.source) == ("Solve it.", "x.jsonl")


@pytest.mark.slow
def test_grpo_on_countdown_scores_each_row_by_the_rule(tmp_path):
    from flows.grpo import grpo
    from storage.trajectories import TrajectoryStore

    summary = grpo(
        overrides=[
            "run_id=cd",
            f"runs_dir={tmp_path / 'runs'}",
            "progress=false",
            "iterations=1",
            "data.prompts_per_iteration=2",
            "data.group_size=2",
            "rollout.max_new_tokens=48",
            "rollout.dtype=float32",
            "env.name=countdown",
            "env.args.num_count=3",
            "env.args.max_number=20",
            "final_eval.questions=0",
        ]
    )
    assert summary["published_version"] == 1
    rows = TrajectoryStore(tmp_path / "runs" / "trajectories").read_records("cd", version=0)
    assert len(rows) == 4
    train = countdown_rows("countdown:train", {"num_count": 3, "max_number": 20})
    parser = CountdownRewardParser()
    for r in rows:
        entry = train[int(r.prompt_id)]  # the prompt id is the row's index in the train split
        user = next(m["content"] for m in r.messages if m["role"] == "user")
        assert user == entry["question"]
        assert r.messages[0]["content"].startswith("A conversation between User and Assistant.")
        expected = parser.score(r.messages[-1]["content"], entry["answer"])
        assert r.reward == pytest.approx(expected["reward"]), (r.messages[-1]["content"], entry["answer"])
        assert r.reward_components["reward_answer"] == expected["reward_answer"]
    stored = json.loads((tmp_path / "runs" / "cd" / "config.json").read_text())
    assert stored["env"]["name"] == "countdown" and stored["env"]["options"] == {"num_count": 3, "max_number": 20}


def test_held_out_problems_are_played_in_the_runs_env():
    from tasks.evaluate import env_scoring

    assert env_scoring({"name": "countdown", "options": {"num_count": 3}}) == "episode"
