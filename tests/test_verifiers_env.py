"""The verifiers route (``env.verifiers``, docs/verifiers.md) without the GRPO flow: config errors said before any
engine starts, the ``verifiers:train`` / ``verifiers:eval`` rows of an environment's own datasets, and episodes of a
``vf.SingleTurnEnv`` and a ``vf.ToolEnv`` (tests/verifiers_envs, written with verifiers' public API) run against a
real engine's endpoint, scored by their rubrics. The flow run is tests/test_verifiers_flow.py."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from llmrl_core.pipeline.config_io import ConfigError, load_config
from llmrl_core.pipeline.env_config import EnvConfig
from llmrl_core.pipeline.grpo_config import GRPOConfig

ENVS = Path(__file__).parent / "verifiers_envs"
NEEDS_VERIFIERS = "the optional 'verifiers' extra is not installed (pip install 'llmrl[verifiers]')"


@pytest.fixture
def vf_envs(monkeypatch):
    pytest.importorskip("verifiers", reason=NEEDS_VERIFIERS)
    monkeypatch.syspath_prepend(str(ENVS))
    yield
    for name in ("vf_tiny_echo", "vf_tiny_tools"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("verifiers", "extra", "message"),
    [
        ("vf-tiny-echo", {}, r"env.verifiers must be a mapping \{id: <installed env id>"),
        ({"id": ""}, {}, "env.verifiers.id: name an installed verifiers environment"),
        ({"id": "vf-tiny-echo", "argz": {}}, {}, r"env.verifiers: unknown key\(s\) \['argz'\]"),
        ({"id": "vf-tiny-echo", "args": [1]}, {}, "env.verifiers.args must be a mapping"),
        ({"id": "vf-tiny-echo"}, {"factory": "json:dumps"}, "env.factory does not apply with env.verifiers"),
        ({"id": "vf-tiny-echo"}, {"agent": "json:dumps"}, "env.verifiers and env.agent are two routes"),
    ],
)
def test_the_shape_of_env_verifiers_is_checked_without_importing_anything(verifiers, extra, message):
    with pytest.raises(ValueError, match=message):
        EnvConfig(verifiers=verifiers, **extra)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.verifiers.id=no-such-vf-env"], r"env.verifiers.id: no installed verifiers environment 'no-such-vf-env'"),
        (
            ["env.verifiers.id=vf-tiny-echo", "env.verifiers.args.n_trian=2"],
            r"env.verifiers.args: unknown argument\(s\) \['n_trian'\] for 'vf-tiny-echo'",
        ),
        (
            ["env.verifiers.id=vf-tiny-echo", "env.verifiers.args.n_train=two"],
            r"env.verifiers.args: verifiers environment 'vf-tiny-echo' failed to load with args \{'n_train': 'two'\}",
        ),
    ],
)
def test_unknown_ids_and_bad_args_fail_before_anything_starts(vf_envs, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(GRPOConfig, None, overrides)


def test_the_environment_brings_its_rows_and_the_agent(vf_envs):
    from llmrl_core.agents.verifiers_agent import AGENT_PATH, rollout_input
    from llmrl_core.builtin_data.sources import load_source_rows

    cfg = load_config(GRPOConfig, None, ["env.verifiers.id=vf-tiny-echo", "env.verifiers.args.n_train=3"])
    assert cfg.env.agent == AGENT_PATH
    assert (cfg.data.source, cfg.task.eval_source) == ("verifiers:train", "verifiers:eval")
    train = load_source_rows(cfg.data.source, env_options=cfg.env.options)
    held_out = load_source_rows(cfg.task.eval_source, env_options=cfg.env.options)
    assert [r["answer"] for r in train] == ["apple", "river", "cloud"]
    assert [r["answer"] for r in held_out] == ["stone", "cloud"]  # the env's own eval split
    item = rollout_input(train[0])
    assert item["prompt"] == [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Say the word apple."},
    ]
    assert train[0]["question"] == "Say the word apple." and item["answer"] == "apple"


def _rollout(engine, spec: dict, sampling_seed: int):
    from transformers import AutoTokenizer

    from llmrl_core.agents import run_agent_rollout
    from llmrl_core.builtin_data.sources import load_source_rows
    from llmrl_core.envs.types import PromptRow
    from llmrl_core.modules.backends.types import SamplingConfig

    env = EnvConfig(verifiers=spec)
    data = load_source_rows("verifiers:train", limit=2, env_options=env.options)
    rows = [PromptRow(dict(d), f"p{g}", g, i) for g, d in enumerate(data) for i in range(2)]
    worker = types.SimpleNamespace(llm=engine, policy_version=1, config=types.SimpleNamespace(max_model_len=2048))
    tokenizer = AutoTokenizer.from_pretrained(engine.llm_engine.model_config.model)
    result = run_agent_rollout(
        worker,
        env.agent,
        rows,
        SamplingConfig(max_new_tokens=24, temperature=1.0, seed=sampling_seed),
        tokenizer=tokenizer,
        concurrency=4,
        timeout_s=120.0,
    )
    assert not result.failures, [(o.error, o.detail) for o in result.failures]
    assert len(result.rows) == 4
    return result, tokenizer


def test_a_single_turn_env_is_scored_by_its_rubric(vf_envs, vllm_engine_fp32):
    import vf_tiny_echo

    result, tokenizer = _rollout(vllm_engine_fp32, {"id": "vf-tiny-echo"}, 5)
    for row in result.rows:
        reply = row.messages[-1]
        assert reply["role"] == "assistant" and row.num_turns == 1
        completion = [{"role": "assistant", "content": reply["content"]}]
        says, brevity = vf_tiny_echo.says_answer(completion, row.data["answer"]), vf_tiny_echo.brevity(completion)
        assert row.reward_components["says_answer"] == says
        assert row.reward_components["brevity"] == pytest.approx(brevity)
        assert row.reward == pytest.approx(says + 0.5 * brevity)  # the rubric's weighted sum
        sampled = row.tokens[row.policy_mask.bool()].tolist()
        assert tokenizer.decode(sampled, skip_special_tokens=True) == reply["content"]  # the engine's own ids


def test_a_tool_env_runs_its_own_turns(vf_envs, vllm_engine_fp32):
    result, _ = _rollout(vllm_engine_fp32, {"id": "vf-tiny-tools", "args": {"max_turns": 2}}, 7)
    for row in result.rows:
        assert 1 <= row.num_turns <= 2  # verifiers' own max_turns
        components = row.reward_components
        assert row.reward == pytest.approx(components["correct"] + 0.1 * components["length_penalty"])
        assert components["length_penalty"] <= -1.0
