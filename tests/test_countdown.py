"""Countdown (``CountdownEnv``, ``CountdownRewardParser``) against TorchRL 0.14.1 run on the same cases
(``scripts/torchrl_countdown_goldens.py`` -> ``goldens/torchrl/countdown.json``): the same problems for the same
seeds, the same prompts, the same step outputs for each response, the same verdicts on expressions; and where llmrl
departs on purpose (the expression is parsed, never run), checked by hand."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
import torch

from llmrl_core.data import History
from llmrl_core.envs import CountdownEnv as FromEnvs
from llmrl_core.envs.countdown import CountdownProblems, evaluate_arithmetic, parse_ground_truth
from llmrl_core.envs.datasets.countdown import CountdownEnv
from llmrl_core.envs.reward.countdown import CountdownRewardParser

GOLDEN = json.loads((Path(__file__).parent / "goldens" / "torchrl" / "countdown.json").read_text())
_spec = importlib.util.spec_from_file_location(
    "countdown_cases", Path(__file__).parents[1] / "scripts" / "torchrl_countdown_goldens.py"
)
CASES = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(CASES)


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(default_model_path)


def test_the_names_import_by_the_porting_rule():
    assert FromEnvs is CountdownEnv
    assert CountdownEnv.SYSTEM_PROMPT.startswith("A conversation between User and Assistant.")


@pytest.mark.parametrize("name", sorted(CASES.RESETS))
def test_the_same_seed_gives_torchrls_problems_and_prompts(name, tokenizer):
    case = CASES.RESETS[name]
    env = CountdownEnv(tokenizer=tokenizer, **case["kwargs"])
    for i, theirs in enumerate(GOLDEN["resets"][name]):
        td = env.reset()
        prompt = td["history", "prompt"]
        assert prompt.role == theirs["roles"], (name, i)
        assert prompt.content == theirs["contents"], (name, i)
        assert list(td["answer"]) == theirs["answers"], (name, i)


@pytest.mark.parametrize("index", range(len(CASES.RESPONSES)))
def test_each_response_is_scored_as_torchrl_scores_it(index, tokenizer):
    env = CountdownEnv(tokenizer=tokenizer, seed=3)
    td = env.reset()
    assert td["answer"][0] == GOLDEN["problem"]["answer"]
    theirs = GOLDEN["responses"][index]
    text = CASES.fill(CASES.RESPONSES[index], td["answer"][0])
    assert text == theirs["text"]
    reply = History(role="assistant", content=text, batch_size=(1,)).unsqueeze(-1)
    td["history", "full"] = td["history", "prompt"].extend(reply, inplace=False, dim=-1)
    td["history", "response"] = reply
    out = env.step(td)["next"]
    for key in ("reward", "reward_answer", "reward_think", "reward_right", "success", "done", "terminated"):
        expected = torch.tensor(theirs[key])
        assert out[key].shape == expected.shape and out[key].dtype == expected.dtype, (key, out[key])
        torch.testing.assert_close(out[key], expected, msg=f"{key} for {text!r}")


@pytest.mark.parametrize("index", range(len(CASES.EXPRESSIONS)))
def test_expressions_get_torchrls_verdicts(index):
    theirs = GOLDEN["expressions"][index]
    assert CASES.EXPRESSIONS[index] == [theirs["expression"], theirs["target"], theirs["numbers"]]
    got = CountdownRewardParser.validate_expression(theirs["expression"], theirs["target"], theirs["numbers"])
    assert got is theirs["valid"], theirs


def test_the_expression_is_parsed_never_run():
    """TorchRL evaluates the text with ``eval``; here only numbers, + - * / and parentheses are evaluated, so a power
    tower that would never finish is a wrong answer at once, and ``**`` / ``//`` are wrong (the prompt allows
    + - * / only)."""
    start = time.perf_counter()
    assert not CountdownRewardParser.validate_expression("9**9**9**9", 9, [9, 9, 9, 9])
    assert time.perf_counter() - start < 1.0
    assert not CountdownRewardParser.validate_expression("2**3", 8, [2, 3])
    assert not CountdownRewardParser.validate_expression("7 // 2", 3, [7, 2])
    assert evaluate_arithmetic("(25 + 3) * 4") == 112
    assert evaluate_arithmetic("-(3 - 10) / 2") == 3.5
    for bad in ("__import__('os')", "1 if 1 else 2", "[1]", "8 / 0", "(1", "2 ** 3"):
        assert evaluate_arithmetic(bad) is None, bad


def test_the_parser_pays_llmrls_reward_values_and_reads_the_answer_field():
    parser = CountdownRewardParser(format_reward=0.2, correct_reward=2.0)
    answer = "target=6, numbers=1,2,3"
    assert parser.score("<think>t</think><answer>1 + 2 + 3</answer>", answer)["reward"] == 2.0
    assert parser.score("<answer>3 + 3</answer>", answer)["reward"] == 0.2  # 3 given once, used twice
    assert parser.score("no tags", answer)["reward"] == 0.0
    assert parse_ground_truth(answer) == (6, [1, 2, 3])
    with pytest.raises(ValueError, match=r"target=T, numbers=a,b"):
        parse_ground_truth("42")


def test_problems_reach_their_targets_and_stay_in_range():
    problems = CountdownProblems(num_count=3, max_number=9, max_target=50, seed=0)
    for _ in range(200):
        row = next(problems)
        target, numbers = parse_ground_truth(row["answer"])
        assert len(numbers) == 3 and all(1 <= n <= 9 for n in numbers)
        assert 1 <= target <= 50 and str(numbers) in row["query"] and f"equals {target}." in row["query"]
    with pytest.raises(ValueError, match="num_count must be a positive int"):
        CountdownProblems(num_count=0)


def test_a_restored_env_continues_the_same_stream(tokenizer):
    env = CountdownEnv(tokenizer=tokenizer, seed=9, num_envs=2)
    env.reset()
    state = env.state_dict()
    expected = list(env.reset()["answer"])
    again = CountdownEnv(tokenizer=tokenizer, seed=9, num_envs=2)
    again.load_state_dict(state)
    assert list(again.reset()["answer"]) == expected


def test_groups_repeat_one_problem(tokenizer):
    env = CountdownEnv(tokenizer=tokenizer, seed=1, num_envs=4, repeats=2, group_repeats=True)
    answers = list(env.reset()["answer"])
    assert answers[0] == answers[1] and answers[2] == answers[3] and answers[0] != answers[2]
