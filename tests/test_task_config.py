"""The recipe building blocks: generated arithmetic with a held-out split, few-shot turns, the task config
shared by rollouts and evaluation, and the per-iteration rollout health metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from llmrl_core.builtin_data.arithmetic import arithmetic_rows, parse_arithmetic_source, problem_split
from llmrl_core.builtin_data.sources import load_source_rows, resolve_source
from llmrl_core.envs.transforms import FewShotExamples
from llmrl_core.evaluation.rollout_health import rollout_health
from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.pipeline.task_config import TaskConfig, make_task_env

ROOT = Path(__file__).resolve().parents[1]


def _key(row: dict) -> str:
    return row["question"]


def test_arithmetic_splits_are_disjoint_deterministic_and_correct():
    train = arithmetic_rows("arithmetic:train")
    test = arithmetic_rows("arithmetic:test")
    assert len(train) + len(test) == 90 * 90  # every ordered pair of 10..99 once
    assert not {_key(r) for r in train} & {_key(r) for r in test}
    assert 0.07 < len(test) / (len(train) + len(test)) < 0.13
    assert arithmetic_rows("arithmetic:test?n=20") == test[:20]  # same seed, same order
    assert arithmetic_rows("arithmetic:test?n=20&seed=1") != test[:20]
    for row in test[:50] + train[:50]:
        a, op, b = row["question"].removeprefix("What is ").removesuffix("?").split()
        assert op == "+" and row["answer"] == f"#### {int(a) + int(b)}"
        assert problem_split(int(a), op, int(b)) in ("train", "test")
    mixed = arithmetic_rows("arithmetic:train?ops=+-*&low=2&high=9")
    assert {r["question"].split()[3] for r in mixed} == {"+", "-", "*"}
    assert "What is 9 - 2?" in {r["question"] for r in mixed} | {
        r["question"] for r in arithmetic_rows("arithmetic:test?ops=+-*&low=2&high=9")
    }


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("arithmetic:valid", "split must be one of"),
        ("arithmetic:train?ops=/", "ops must be"),
        ("arithmetic:train?low=x", "low must be an integer"),
        ("arithmetic:train?colour=red", "unknown setting 'colour'"),
        ("arithmetic:test?low=50&high=10", "low <= high"),
        ("arithmetic:test?n=100000", "the split has"),
    ],
)
def test_arithmetic_bad_sources_say_what_is_wrong(source, message):
    with pytest.raises(ValueError, match=message):
        arithmetic_rows(parse_arithmetic_source(source) if "n=" not in source else source)


def test_sources_resolve_by_name_or_path(tmp_path):
    assert resolve_source("gsm8k:test").endswith("test.jsonl")
    assert resolve_source("arithmetic:test?n=3") == arithmetic_rows("arithmetic:test?n=3")
    with pytest.raises(FileNotFoundError, match="no such file"):
        resolve_source(str(tmp_path / "missing.jsonl"))
    good = tmp_path / "qa.jsonl"
    good.write_text("\n".join(json.dumps({"question": f"q{i}", "answer": f"#### {i}"}) for i in range(5)))
    assert load_source_rows(str(good), limit=2) == [
        {"question": "q0", "answer": "#### 0"},
        {"question": "q1", "answer": "#### 1"},
    ]
    assert len(load_source_rows("gsm8k:test", limit=7)) == 7
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "q", "answer": "1"}))
    with pytest.raises(ValueError, match=r"bad.jsonl: missing field\(s\) \['question'\]"):
        load_source_rows(str(bad))


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    return AutoTokenizer.from_pretrained(default_model_path)


def test_few_shot_turns_come_before_the_question_under_the_same_template(tokenizer):
    task = TaskConfig(
        system_prompt="Be brief.",
        question_template="Q: {question}",
        few_shot=[{"question": "What is 1 + 1?", "response": "<answer>2</answer>"}],
        format_reward=0.0,
    )
    env = make_task_env(task, tokenizer, input_mode="history")
    out = env.reset([{"query": "What is 2 + 3?", "answer": "#### 5"}])
    history = out["history", "prompt"][0]
    messages = list(zip(history.role, history.content, strict=True))
    assert messages == [
        ("system", "Be brief."),
        ("user", "Q: What is 1 + 1?"),
        ("assistant", "<answer>2</answer>"),
        ("user", "Q: What is 2 + 3?"),
    ]
    # the reward: right answer 1.0; a tag with a wrong answer earns nothing when format_reward is 0
    from llmrl_core.data import Response

    scored = env.step([Response(text="<answer>5</answer>")])
    assert scored["reward"].reshape(-1).tolist() == [1.0]
    env.reset([{"query": "What is 2 + 3?", "answer": "#### 5"}])
    assert env.step([Response(text="<answer>6</answer>")])["reward"].reshape(-1).tolist() == [0.0]


def test_few_shot_and_task_config_reject_malformed_input():
    with pytest.raises(ValueError, match="few-shot example 0"):
        FewShotExamples([{"question": "q"}])
    with pytest.raises(ValueError, match=r"task.few_shot\[1\]"):
        TaskConfig(few_shot=[{"question": "q", "response": "r"}, {"q": "x"}])
    with pytest.raises(ValueError, match="must contain"):
        TaskConfig(question_template="no placeholder")
    with pytest.raises(ValueError, match="unknown key"):
        TaskConfig.from_dict({"system_prompt": None, "fewshot": []})


def test_the_arithmetic_recipe_config_loads():
    cfg = load_config(GRPOConfig, str(ROOT / "recipes" / "arithmetic" / "grpo.yaml"), ["train.lr=2e-5"])
    assert cfg.task.format_reward == 0.0 and cfg.task.few_shot and cfg.train.skip_zero_signal_groups
    assert cfg.task.eval_source.startswith("arithmetic:test") and cfg.data.source.startswith("arithmetic:train")
    assert cfg.train.lr == 2e-5
    train_q = {r["question"] for r in resolve_source(cfg.data.source)}
    assert not train_q & {r["question"] for r in resolve_source(cfg.task.eval_source)}
    # the examples are not held-out problems either
    assert not {e["question"] for e in cfg.task.few_shot} & {
        r["question"] for r in resolve_source(cfg.task.eval_source)
    }


def test_rollout_health_by_hand():
    health = rollout_health(
        texts=["a", "a ", "b", "c", "c", "c"],
        group_ids=[0, 0, 0, 1, 1, 1],
        correct=[True, False, False, True, True, True],
        has_answer=[True, True, False, True, True, True],
        num_tokens=[3, 4, 5, 6, 6, 6],
        truncated=[False, False, True, False, False, False],
    )
    assert health["accuracy"] == pytest.approx(4 / 6)
    assert health["answer_rate"] == pytest.approx(5 / 6)
    assert health["distinct_responses"] == pytest.approx((2 / 3 + 1 / 3) / 2)  # "a" and "a " are the same text
    assert health["identical_groups"] == pytest.approx(0.5)
    assert (health["response_tokens_min"], health["response_tokens_max"]) == (3.0, 6.0)
    assert health["response_tokens_mean"] == pytest.approx(30 / 6)
    assert health["truncated_rate"] == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="correct has 1 items"):
        rollout_health(["a", "b"], [0, 0], [True], [True, True], [1, 1], [False, False])


def test_skip_zero_signal_groups_keeps_only_groups_whose_rewards_differ():
    from types import SimpleNamespace

    from runtime.trainer_actor import signal_rows

    rows = [
        SimpleNamespace(group_id=g, reward=r) for g, r in [("a", 1.0), ("a", 1.0), ("b", 0.0), ("b", 1.0), ("c", 0.0)]
    ]
    assert [(r.group_id, r.reward) for r in signal_rows(rows)] == [("b", 0.0), ("b", 1.0)]
    assert signal_rows(rows[:2]) == []


def test_exact_skip_trains_every_row_where_the_skipped_groups_have_a_gradient():
    """With a KL or entropy term the all-equal groups still pull the weights: exact means training them."""
    from runtime.trainer_actor import skips_groups

    recipe = str(ROOT / "recipes" / "arithmetic" / "grpo.yaml")
    assert skips_groups(load_config(GRPOConfig, recipe, ["train.exact_skip=true"]).train)
    assert skips_groups(load_config(GRPOConfig, recipe, ["train.kl_coef=0.05"]).train)  # the old skip: left out
    for setting in ("train.kl_coef=0.05", "train.entropy_coeff=0.01"):
        assert not skips_groups(load_config(GRPOConfig, recipe, ["train.exact_skip=true", setting]).train)
    assert not skips_groups(load_config(GRPOConfig, recipe, ["train.skip_zero_signal_groups=false"]).train)


def _factory_returning_a_number(tokenizer=None, input_mode="tokens"):
    return 5


def _factory_that_raises(tokenizer=None, input_mode="tokens"):
    raise RuntimeError("the dataset is not there")


def _factory_with_a_tensordict_reward(tokenizer=None, input_mode="tokens"):
    """A TorchRL user's reward: a TensorDict transform that pays 1 for an answer containing the row's ``answer``."""
    from llmrl_core.envs import ChatEnv
    from llmrl_core.envs.transforms.td_base import Transform

    class ContainsAnswer(Transform):
        def _step(self, tensordict, next_tensordict):
            texts = tensordict.get(("text", "response")).tolist()
            answers = tensordict.get("answer").tolist()
            right = [[float(str(a) in t)] for t, a in zip(texts, answers, strict=True)]
            return next_tensordict.set("reward", torch.tensor(right))  # the env itself has no reward source

    env = ChatEnv(tokenizer=tokenizer, input_mode=input_mode, system_prompt="Answer.", max_turns=1)
    return env.append_transform(ContainsAnswer())


def test_a_factory_env_with_a_tensordict_reward_scores_the_flows_slot_steps(tokenizer):
    """The flows step a factory's env slot by slot in tokens mode: its TensorDict reward transform still scores
    each answer (sampled ids and all), with the prompt row's fields beside it."""
    from llmrl_core.data.llm_data import Response
    from llmrl_core.pipeline.env_config import EnvConfig

    env = make_task_env(
        TaskConfig(),
        tokenizer,
        env=EnvConfig(factory=f"tests.test_task_config:{_factory_with_a_tensordict_reward.__name__}"),
    )
    env.reset([{"query": "3+4?", "answer": 7}, {"query": "2+2?", "answer": 4}])
    answers = ["It is 7.<|im_end|>", "It is 5.<|im_end|>"]
    ids = [tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]
    out = env.step(
        [
            Response(a, token_ids=i, log_probs=[-0.5] * len(i), finish_reason="stop")
            for a, i in zip(answers, ids, strict=True)
        ]
    )
    assert out["reward"].reshape(-1).tolist() == [1.0, 0.0] and out["done"].reshape(-1).tolist() == [True, True]
    assert out["reward_components"] == [{"ContainsAnswer": 1.0}, {}]


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("_factory_returning_a_number", "env.factory 'tests.test_task_config:_factory_returning_a_number' returned"),
        ("_factory_that_raises", "raised RuntimeError: the dataset is not there"),
    ],
)
def test_a_failing_env_factory_is_named_as_the_users_code(tokenizer, factory, message):
    """The user's env factory fails on the rollout worker: an EnvFactoryError naming the setting, which the command
    line prints in one line (runtime/console.py, llmrl_cli/run_more.py) and the rollout task does not retry."""
    from llmrl_core.pipeline.env_config import EnvConfig, EnvFactoryError
    from tasks.grpo_stages import retry_unless_user_error

    cfg = EnvConfig(factory=f"tests.test_task_config:{factory}")
    with pytest.raises(EnvFactoryError, match=message) as caught:
        make_task_env(TaskConfig(), tokenizer, env=cfg)

    class Failed:
        def result(self):
            raise caught.value

    assert retry_unless_user_error(None, None, Failed()) is False


def test_few_shot_examples_are_a_tensordict_reset_transform_that_prepares_new_episodes_only():
    """TorchRL's ``reset(td)`` and llmrl's partial reset both put the examples before the question once, in the new
    conversations only."""
    from tensordict import TensorDict

    from llmrl_core.envs import ChatEnv
    from llmrl_core.envs.transforms import Transform

    shots = FewShotExamples([{"question": "1 + 1?", "response": "<answer>2</answer>"}])
    assert isinstance(shots, Transform)
    env = ChatEnv(batch_size=2, system_prompt="S").append_transform(shots)
    reset = env.reset(TensorDict({"query": ["2 + 2?", "3 + 3?"]}, batch_size=(2,)))
    roles = [[m.role for m in c.messages] for c in reset["history", "prompt"].to_conversations()]
    assert roles == [["system", "user", "assistant", "user"]] * 2
    env.step(["<answer>4</answer>", "<answer>6</answer>"])
    out = env.reset_slots([1], ["4 + 4?"])
    assert out["history", "prompt"][1].content == ["S", "1 + 1?", "<answer>2</answer>", "4 + 4?"]
    assert out["history", "prompt"][0].content == [
        "S",
        "1 + 1?",
        "<answer>2</answer>",
        "2 + 2?",
        "<answer>4</answer>",
    ]
