"""A user's reward function that raises or returns a non-number: one line naming the function and the row
(``env.reward_errors: raise``), or that episode failed alone (``skip``); the rollout drops and counts it."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest
import torch

from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.envs.reward_calls import RewardFunctionError, reward_value
from llmrl_core.envs.types import PromptRow
from llmrl_core.pipeline.env_config import RewardFunctionConfig
from llmrl_core.pipeline.reward_functions import RewardFunctions

LABEL = "env.rewards[0].function 'pkg:fn'"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, 1.0), (True, 1.0), (np.float32(0.5), 0.5), (torch.tensor(0.25), 0.25), (torch.tensor([2.0]), 2.0)],
)
def test_numbers_of_every_common_kind_are_rewards(value, expected):
    assert reward_value(lambda p, c, r: value, LABEL, "p", "c", {}, "row 1") == expected


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (lambda p, c, r: 1 / 0, "env.rewards[0].function 'pkg:fn' raised ZeroDivisionError: division by zero"),
        (lambda p, c, r: r["missing"], "raised KeyError: 'missing'"),
        (lambda p, c, r: "1.0", "returned str '1.0' (scoring row prompt_id=7 (group 2, sample 1)); a reward must"),
        (lambda p, c, r: None, "returned NoneType None"),
        (lambda p, c, r: [1.0], "returned list [1.0]"),
        (lambda p, c, r: math.nan, "returned nan (scoring row prompt_id=7 (group 2, sample 1)); a reward must be"),
        (lambda p, c, r: -math.inf, "returned -inf"),
    ],
)
def test_a_failing_function_is_named_with_its_row(fn, says):
    with pytest.raises(RewardFunctionError) as caught:
        reward_value(fn, LABEL, "p", "c", {}, "row prompt_id=7 (group 2, sample 1)")
    assert says in str(caught.value) and "\n" not in str(caught.value)


@pytest.fixture
def picky(tmp_path, monkeypatch):
    (tmp_path / "picky_rewards.py").write_text(
        textwrap.dedent(
            """
            def picky(prompt, completion, row):
                if row["answer"] == "bad":
                    raise ValueError("cannot score " + completion)
                return 1.0 if completion.strip() == row["answer"] else 0.0
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return [RewardFunctionConfig(function="picky_rewards:picky", weight=2.0)]


def _env(specs, on_error):
    env = ChatEnv(input_mode="history", chat_template_name="chatml", max_turns=1)
    env.append_transform(RewardFunctions(specs, on_error=on_error))
    rows = [PromptRow({"query": "q", "answer": a}, prompt_id=f"p{i}", group_id=i) for i, a in enumerate(["4", "bad"])]
    env.reset(rows)
    return env


def test_raise_stops_at_the_first_failing_row_naming_it(picky):
    env = _env(picky, "raise")
    with pytest.raises(RewardFunctionError) as caught:
        env.step(["4<|im_end|>", "5<|im_end|>"])
    assert str(caught.value) == (
        "env.rewards[0].function 'picky_rewards:picky' raised ValueError: cannot score 5 "
        "(scoring row prompt_id='p1' (group 1, sample 0))"
    )


def test_skip_fails_that_episode_alone(picky):
    from runtime.rollout_actor import drop_failed_rewards

    env = _env(picky, "skip")
    out = env.step(["4<|im_end|>", "5<|im_end|>"])
    assert out["reward"].reshape(-1).tolist() == [2.0, 0.0] and out["reward_components"][0] == {"picky": 2.0}
    info = out["info"]
    assert "reward_error" not in info[0]
    assert info[1]["reward_error"].startswith("env.rewards[0].function 'picky_rewards:picky' raised ValueError")

    class Row:  # the collector's episode row, as far as the rollout reads it
        def __init__(self, info):
            self.info = info

    kept, metrics = drop_failed_rewards([Row(i) for i in info], episodes=2)
    assert [r.info for r in kept] == [info[0]]
    assert metrics["reward_errors"] == 1.0 and metrics["reward_error_examples"] == [info[1]["reward_error"]]
    with pytest.raises(RewardFunctionError, match="all 1 episodes' reward functions failed, e.g. env.rewards"):
        drop_failed_rewards([Row(info[1])], episodes=1)


def test_the_setting_takes_raise_or_skip_only():
    from llmrl_core.pipeline.config_io import ConfigError, load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig

    assert load_config(GRPOConfig, None, ["env.reward_errors=skip"]).env.reward_errors == "skip"
    with pytest.raises(ConfigError, match=r"env.reward_errors: must be one of \['raise', 'skip'\], got 'ignore'"):
        load_config(GRPOConfig, None, ["env.reward_errors=ignore"])


def test_the_cli_ends_a_failing_reward_function_with_one_line(capsys):
    import typer

    from llmrl_cli.run_more import run_flow

    line = "env.rewards[0].function 'pkg:fn' raised KeyError: 'x' (scoring row prompt_id=3)"

    def flow(**_):
        raise RewardFunctionError(line)

    with pytest.raises(typer.Exit) as stopped:
        run_flow(flow)
    assert stopped.value.exit_code == 1
    err = capsys.readouterr().err
    assert (
        err.splitlines()[0] == "error: env.rewards[0].function 'pkg:fn' raised KeyError: 'x' (scoring row prompt_id=3)"
    )
    assert "env.reward_errors=skip" in err and "Traceback" not in err
