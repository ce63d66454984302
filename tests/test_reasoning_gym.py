"""reasoning-gym datasets as an env (``env.name: reasoning_gym``): rows, splits, the dataset's own scorer as the
reward, config errors before anything starts, and GRPO + the evaluate flow end to end on several datasets."""

from __future__ import annotations

import json

import pytest

rg = pytest.importorskip("reasoning_gym", reason="the optional 'reasoning-gym' extra is not installed")

from llmrl_core.builtin_data.reasoning_gym_data import (  # noqa: E402
    ReasoningGymRows,
    ReasoningGymSpec,
    score_entry,
)
from llmrl_core.builtin_data.sources import load_source_rows, resolve_source  # noqa: E402
from llmrl_core.pipeline.config_io import ConfigError, load_config  # noqa: E402
from llmrl_core.pipeline.grpo_config import GRPOConfig  # noqa: E402

CHAIN = {"dataset": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 2}}


def test_rows_are_the_datasets_entries_and_the_splits_use_disjoint_seeds():
    spec = ReasoningGymSpec.from_options(CHAIN)
    train, test = ReasoningGymRows(spec, "train"), ReasoningGymRows(spec, "test", n=50)
    direct_train = rg.create_dataset("chain_sum", seed=0, size=10_000, **CHAIN["config"])
    direct_test = rg.create_dataset("chain_sum", seed=spec.split_seed("test"), size=2_000, **CHAIN["config"])
    assert len(test) == 50 and len(train) == 10_000
    for i in (0, 7, 9_999):
        assert train[i]["question"] == direct_train[i]["question"] and train[i]["answer"] == direct_train[i]["answer"]
        assert train[i]["rg_index"] == i and train[i]["rg_split"] == "train"
    assert [r["question"] for r in test] == [direct_test[i]["question"] for i in range(50)]
    assert spec.split_seed("train") != spec.split_seed("test")
    assert [r["question"] for r in train[:50]] != [r["question"] for r in test]
    with pytest.raises(IndexError):
        test[50]


def test_an_entry_without_an_answer_stores_an_empty_answer_not_the_word_none(monkeypatch):
    """Open-ended reasoning-gym tasks give ``answer=None`` (their scorer checks the metadata): the row's answer is
    '' (it read "None" before, a string a reward or report could mistake for an answer)."""
    from llmrl_core.builtin_data import reasoning_gym_data

    entries = [{"question": "q0", "answer": None, "metadata": {}}, {"question": "q1", "answer": 7, "metadata": {}}]
    monkeypatch.setattr(reasoning_gym_data, "_cached_dataset", lambda *args: entries)
    rows = ReasoningGymRows(ReasoningGymSpec.from_options(CHAIN), "test")
    assert [r["answer"] for r in rows] == ["", "7"]


def test_sources_resolve_through_the_runs_env_args():
    rows = load_source_rows("reasoning_gym:test", limit=3, env_options=CHAIN)
    assert len(rows) == 3 and all(r["rg_split"] == "test" for r in rows)
    assert len(resolve_source("reasoning_gym:train", CHAIN)) == 10_000
    with pytest.raises(ValueError, match="env.args.dataset"):
        resolve_source("reasoning_gym:train", None)
    with pytest.raises(ValueError, match="reasoning_gym:train or reasoning_gym:test"):
        resolve_source("reasoning_gym:valid", CHAIN)


@pytest.mark.parametrize("name", ["chain_sum", "spell_backward", "gcd", "leg_counting"])
def test_the_reward_is_the_datasets_own_score(name):
    from llmrl_core.envs.reasoning_gym_env import ReasoningGymReward

    spec = ReasoningGymSpec.from_options({"dataset": name})
    reward = ReasoningGymReward(spec, format_reward=0.1, correct_reward=1.0)
    row = ReasoningGymRows(spec, "train")[3]
    entry = rg.create_dataset(name, seed=0, size=10_000)[3]
    right = reward.score_row(f"<think>ok</think><answer>{entry['answer']}</answer><|im_end|>", row)
    assert right["success"] is True and right["reward"] == pytest.approx(1.0)
    wrong_answer = "zzz-not-it"
    expected = rg.create_dataset(name, seed=0, size=10_000).score_answer(wrong_answer, entry)
    wrong = reward.score_row(f"<answer>{wrong_answer}</answer>", row)
    assert wrong["success"] is False
    assert wrong["reward"] == pytest.approx(max(expected, 0.1))
    assert score_entry(spec, row, wrong_answer) == pytest.approx(expected)
    missing = reward.score_row(entry["answer"], row)  # no answer tag: nothing
    assert missing == {"reward_answer": 0.0, "reward_think": 0.0, "reward_right": 0.0, "reward": 0.0, "success": False}


def test_a_row_whose_dataset_changed_is_refused():
    spec = ReasoningGymSpec.from_options(CHAIN)
    row = dict(ReasoningGymRows(spec, "train")[0], question="something else")
    with pytest.raises(ValueError, match="config or seed changed"):
        score_entry(spec, row, "1")


def test_config_names_the_env_and_fills_its_own_defaults():
    cfg = load_config(
        GRPOConfig, None, ["env.name=reasoning_gym", "env.args.dataset=chain_sum", "env.args.config.max_terms=2"]
    )
    assert cfg.env.options == {"dataset": "chain_sum", "config": {"max_terms": 2}}
    assert (cfg.data.source, cfg.task.eval_source) == ("reasoning_gym:train", "reasoning_gym:test")
    assert cfg.task.question_template is None and "<answer>" in cfg.task.system_prompt
    kept = load_config(
        GRPOConfig, None, ["env.name=reasoning_gym", "env.args.dataset=gcd", "task.eval_source=reasoning_gym:train"]
    )
    assert kept.task.eval_source == "reasoning_gym:train"  # what the user set stays


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.args.dataset=chain_summ"], r"env.args.dataset: 'chain_summ' is not a reasoning-gym dataset; did you"),
        (["env.args.dataset=chain_sum", "env.args.config.bogus=1"], r"env.args.config: .*bogus"),
        (["env.args.dataset=chain_sum", "env.args.config.min_terms=9"], r"env.args.config: .*max_terms"),
        (["env.args.datset=chain_sum"], r"env.args: unknown key\(s\) \['datset'\]"),
        ([], r"env.args.dataset: name a reasoning-gym dataset"),
        (["env.args.dataset=gcd", "env.options.dataset=lcm"], "env.args and env.options are the same setting"),
        # a bare AssertionError of the dataset's own config check is named as one
        (["env.args.dataset=composite"], r"refused its config \(AssertionError: Must specify at least one dataset"),
    ],
)
def test_bad_settings_fail_before_anything_starts(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(GRPOConfig, None, ["env.name=reasoning_gym", *overrides])


def test_a_dataset_that_is_not_deterministic_is_refused_before_anything_starts(monkeypatch):
    """A dataset whose entry for an index changes from one read to the next (reasoning-gym 0.1.x's list_functions
    draws from more than its per-index seed) could not score a stored row: refused when the config loads."""
    import itertools

    from llmrl_core.builtin_data import reasoning_gym_data

    class Drifting(list):
        draws = itertools.count()

        def __getitem__(self, index):
            return {"question": f"q{index}-{next(self.draws)}", "answer": "1", "metadata": {}}

    monkeypatch.setattr(reasoning_gym_data, "_cached_dataset", lambda *args: Drifting([None] * 4))
    with pytest.raises(ConfigError, match=r"env.args.dataset: reasoning-gym's 'chain_sum' gives two different"):
        load_config(GRPOConfig, None, ["env.name=reasoning_gym", "env.args.dataset=chain_sum"])


def test_the_cli_main_job_gives_another_env_its_own_prompts(tmp_path, monkeypatch):
    import yaml

    from llmrl_cli.run import MAIN_JOB, main_job_for

    monkeypatch.setenv("LLMRL_HOME", str(tmp_path))
    assert main_job_for(["train.lr=1e-6"]) == MAIN_JOB
    path = main_job_for(["env.name=reasoning_gym", "env.args.dataset=gcd"])
    derived, main = yaml.safe_load(path.read_text()), yaml.safe_load(MAIN_JOB.read_text())
    assert "task" not in derived and "source" not in derived["data"]
    assert derived["iterations"] == main["iterations"] and derived["final_eval"] == main["final_eval"]
    cfg = load_config(GRPOConfig, path, ["env.name=reasoning_gym", "env.args.dataset=gcd"])
    assert cfg.data.source == "reasoning_gym:train" and cfg.task.few_shot == []


def _grpo(tmp_path, run_id, dataset, *extra):
    from flows.grpo import grpo

    return grpo(
        overrides=[
            f"run_id={run_id}",
            f"runs_dir={tmp_path / 'runs'}",
            "progress=false",
            "iterations=1",
            "data.prompts_per_iteration=2",
            "data.group_size=2",
            "rollout.max_new_tokens=24",
            "rollout.dtype=float32",
            "env.name=reasoning_gym",
            f"env.args.dataset={dataset}",
            *extra,
        ]
    )


@pytest.mark.slow
@pytest.mark.isolated
def test_grpo_trains_on_a_reasoning_gym_dataset_and_the_evaluate_flow_reports_it(tmp_path):
    """One GRPO iteration on ``chain_sum``: every stored row is the dataset's own entry, scored by the dataset's own
    rule, and the run's final evaluation ran the evaluate flow on held-out seeds. (Datasets of other kinds, words as
    well as numbers, are scored by their own rules through the same reward: test_the_reward_is_the_datasets_own_score.)
    """
    from storage.trajectories import TrajectoryStore

    store = TrajectoryStore(tmp_path / "runs" / "trajectories")
    dataset, run_id = "chain_sum", "rg-chain-sum"
    summary = _grpo(tmp_path, run_id, dataset, "final_eval.questions=4")
    assert summary["published_version"] == 1
    rows = store.read_records(run_id, version=0)
    assert len(rows) == 4
    direct = rg.create_dataset(dataset, seed=0, size=10_000)  # the dataset, asked independently
    for r in rows:
        entry = direct[int(r.prompt_id)]  # the prompt id is the row's index in the train split
        user = next(m["content"] for m in r.messages if m["role"] == "user")
        assert user == entry["question"]
        reply = r.messages[-1]["content"]
        if "</answer>" not in reply:
            assert r.reward == 0.0 and r.reward_components["reward_answer"] == 0.0
        else:
            answer = reply.split("<answer>")[1].split("</answer>")[0].strip()
            score = direct.score_answer(answer, entry) if answer else 0.0
            assert r.reward == pytest.approx(max(score, 0.1) if answer else 0.0), (reply, entry["answer"])
    final = summary["final_eval"]  # the evaluate flow ran as the run's final evaluation, on held-out seeds
    assert "reasoning_gym:test" in final["line"]
    report = {(row["version"], row["mode"]) for row in final["rows"]}
    assert report == {(0, "greedy"), (1, "greedy")}
    assert all(row["num_questions"] == 4 for row in final["rows"])
    stored = json.loads((tmp_path / "runs" / run_id / "config.json").read_text())
    assert stored["env"]["options"]["dataset"] == "chain_sum"
