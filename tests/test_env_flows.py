"""The ``env`` section end to end: tool-using multi-turn GRPO, a user's own env factory and reward function,
IFEval and a Gymnasium-style game through the GRPO flow; and the env config's early errors."""

from __future__ import annotations

import json
import math
import sys
import textwrap

import pytest
from cli_runs import cli_env

from llmrl_core.pipeline.config_io import ConfigError, load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig


def _run(tmp_path, run_id, *extra):
    from flows.grpo import grpo

    overrides = [
        f"run_id={run_id}",
        f"runs_dir={tmp_path / 'runs'}",
        "progress=false",
        "iterations=2",
        "data.prompts_per_iteration=2",
        "data.group_size=2",
        "rollout.max_new_tokens=32",
        "rollout.dtype=float32",
        "train.lr=1e-5",
        *extra,
    ]
    grpo(overrides=overrides)
    from storage.trajectories import TrajectoryStore

    return TrajectoryStore(tmp_path / "runs" / "trajectories")


PYTHON_SHOT = '[{question: "What is 23 + 45?", response: "```python\\nprint(23 + 45)\\n```"}]'


@pytest.mark.slow
def test_grpo_with_the_python_tool_stores_tool_turns_and_trains_on_the_policy_mask(tmp_path):
    from llmrl_core.trainer.batch import pack_samples
    from runtime.records import record_to_sample

    store = _run(
        tmp_path,
        "tool",
        "env.name=arithmetic_python",
        "env.max_turns=2",
        "data.source=arithmetic:train",
        "task.question_template=null",
        f"task.few_shot={PYTHON_SHOT}",
    )
    assert store.versions("tool") == [0, 1]
    rows = [r for v in (0, 1) for r in store.read_records("tool", version=v)]
    with_tool = [r for r in rows if r.num_tool_calls > 0]
    assert with_tool, "no rollout called the interpreter"
    import json

    v0 = store.read_records("tool", version=0)
    published = json.loads((tmp_path / "runs" / "tool" / "state" / "published-v1.json").read_text())
    metrics = published.get("metrics", published)
    if any(r.num_tool_calls for r in v0):  # the per-version tool metrics, recomputed from the stored rows
        assert metrics["tool_call_rate"] == pytest.approx(sum(r.num_tool_calls > 0 for r in v0) / len(v0))
        calls = [c for r in v0 for c in r.tool_calls]
        assert metrics["tool_success_rate"] == pytest.approx(1 - sum(c["error"] for c in calls) / len(calls))
    for r in with_tool:
        assert any(m["role"] == "tool" for m in r.messages)
        assert len(r.tool_calls) == r.num_tool_calls
        call = r.tool_calls[0]
        assert call["name"] == "python" and "print" in call["arguments"]
        assert call["result"].startswith("Code block 1")
        assert False in r.response_mask  # the tool's tokens are in the response, masked out
    for r in rows:
        for m, lp in zip(r.response_mask, r.sampler_logprobs, strict=True):
            assert m == math.isfinite(lp)  # sampler log-probs exactly on the policy's own tokens
        sample = record_to_sample(r)
        batch = pack_samples([sample])
        trained = batch.mask & batch.sampler_log_probs.isfinite()  # what GRPOLoss trains on
        assert trained[0, : len(r.response_mask)].tolist() == list(r.response_mask)


@pytest.mark.extended  # the long tier: pytest -m extended (README "Tests")
@pytest.mark.slow
def test_grpo_with_a_users_env_factory_and_reward_function(tmp_path, monkeypatch):
    """A factory env with a TorchRL-style TensorDict reward transform and a TorchRL-style tool (two turns), plus
    reward functions (one failing once): the tool's message sits between the answers in each stored row, its ids in
    the response outside the policy mask (the trainer's agreement check passes on those ids)."""
    module = tmp_path / "my_env_pkg.py"
    module.write_text(
        textwrap.dedent(
            """
            import torch

            from llmrl_core.envs import ChatEnv
            from llmrl_core.envs.transforms.td_base import Transform
            from llmrl_core.envs.transforms.tools import ToolTransformBase

            CALLS = []

            class Bonus(Transform):  # a TorchRL-style reward: a quarter point for every answer with sampled ids
                def _step(self, tensordict, next_tensordict):
                    sampled = [len(t.response) > 0 for t in tensordict["tokens"].unbind(0)]
                    bonus = torch.tensor([[0.25 * s] for s in sampled])
                    reward = next_tensordict.get("reward", torch.zeros_like(bonus))  # the reward functions' sum
                    return next_tensordict.set("reward", reward + bonus)

            class Clock(ToolTransformBase):  # a TorchRL-style tool: every answer gets the time back
                def _process_batch_item(self, content, index):
                    return ["It is noon."]

            def make_env(tokenizer=None, input_mode="history", max_turns=1, greeting="Say hi"):
                env = ChatEnv(tokenizer=tokenizer, input_mode=input_mode, system_prompt=greeting, max_turns=2)
                return env.append_transform(Bonus()).append_transform(Clock())

            def short_answer(prompt, completion, row):
                return 1.0 if len(completion) < 40 else 0.0

            def first_fails(prompt, completion, row):  # the worker's first episode fails, the others pay 0.5
                CALLS.append(row)
                if len(CALLS) == 1:
                    raise RuntimeError("the first call fails")
                return 0.5
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    store = _run(
        tmp_path,
        "custom",
        "iterations=1",
        "env.factory=my_env_pkg:make_env",
        "env.options={greeting: Answer in one word.}",
        "env.rewards=[{function: 'my_env_pkg:short_answer', weight: 2.0}, {function: 'my_env_pkg:first_fails'}]",
        "env.reward_errors=skip",
    )
    rows = store.read_records("custom", version=0)
    assert len(rows) == 3  # of 4 episodes: the one whose reward function raised is counted, not stored
    published = json.loads((tmp_path / "runs" / "custom" / "state" / "published-v1.json").read_text())
    assert published.get("metrics", published)["reward_errors"] == 1.0
    assert rows[0].messages[0] == {"role": "system", "content": "Answer in one word."}
    from transformers import AutoTokenizer

    from llmrl_core.model_store import ensure_default_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_default_model())
    noon = "<|im_start|>tool\nIt is noon.<|im_end|>"
    for r in rows:
        assert [m["role"] for m in r.messages] == ["system", "user", "assistant", "tool", "assistant"]
        completion = r.messages[-1]["content"]
        short = 2.0 * (len(completion) < 40)
        assert r.reward_components == {"short_answer": short, "first_fails": 0.5, "Bonus": 0.5}  # Bonus: per turn
        assert r.reward == pytest.approx(short + 0.5 + 0.5)
        policy = [t for t, m in zip(r.response_tokens, r.response_mask, strict=True) if m]
        env_ids = [t if not m else -1 for t, m in zip(r.response_tokens, r.response_mask, strict=True)]
        assert noon in tokenizer.decode(r.response_tokens) and noon not in tokenizer.decode(policy)
        assert noon in tokenizer.decode([t for t in env_ids if t >= 0])
    sys.modules.pop("my_env_pkg", None)


@pytest.mark.slow
def test_grpo_on_ifeval(tmp_path):
    store = _run(tmp_path, "ife", "iterations=1", "env.name=ifeval", "data.source=ifeval")
    rows = store.read_records("ife", version=0)
    assert len(rows) == 4
    import json

    from llmrl_core.builtin_data.ifeval_data import ifeval_path

    shipped = [json.loads(line)["prompt"] for line in ifeval_path().read_text().splitlines() if line.strip()]
    for r in rows:
        user = next(m["content"] for m in r.messages if m["role"] == "user")
        assert any(p in user for p in shipped)  # an IFEval prompt, under IFEval's template
        assert 0.0 <= r.reward <= 1.15  # 0.4 + 0.3 + 0.2 + 0.1 for the checks, + 0.1 / 0.05 for the format
        assert {"prompt_level_strict_acc", "inst_level_loose_acc"} <= set(r.reward_components)

    # the evaluate flow reads the run's env and reports IFEval's four metrics per version
    import subprocess
    from pathlib import Path

    from llmrl_core.envs.ifeval.evaluation import score_response
    from llmrl_core.envs.ifeval.reward import extract_blocks
    from llmrl_core.evaluation import load_result
    from tasks.evaluate import ifeval_rows

    # in its own process: an in-process engine's shutdown tears down vLLM's parallel state for the session's engine
    kwargs = dict(versions=[0, 1], runs_dir=str(tmp_path / "runs"), n_questions=3, n_samples=1, max_new_tokens=24)
    script = (
        "import json, sys\nfrom flows.evaluate import evaluate\n"
        "out = evaluate('ife', dtype='float32', log_mlflow=False, **json.loads(sys.argv[1]))\n"
        "print('RESULT ' + json.dumps(out, default=str))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(kwargs)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=Path(__file__).resolve().parents[1],
        env=cli_env(),  # records into this process's Prefect API instead of starting one of its own
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = json.loads([x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1].removeprefix("RESULT "))
    metrics = ("prompt_level_strict_acc", "inst_level_strict_acc", "prompt_level_loose_acc", "inst_level_loose_acc")
    assert {(r["version"], r["mode"]) for r in out["rows"]} == {
        (0, "greedy"),
        (1, "greedy"),
        (0, "sampled"),
        (1, "sampled"),
    }
    rows3 = ifeval_rows("ifeval", 3)
    for row in out["rows"]:
        assert all(m in row and f"{m}_se" in row for m in metrics)
    result = load_result(out["results"]["0"])
    for q in result.modes["greedy"].questions:  # independent re-score of the stored response
        sample = q.samples[0]
        blocks = extract_blocks(sample.text, "answer")
        row = rows3[q.index]
        scored = score_response(row["instruction_id_list"], row["kwargs"], blocks[0] if blocks else "")
        assert sample.correct == bool(scored.prompt_level_strict_acc)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.name=chess", "env.name must be one of"),
        ("env.factory=no_such_module_xyz:make", "env.factory: cannot import module 'no_such_module_xyz'"),
        ("env.factory=json:no_such_function", "env.factory: module 'json' has no attribute 'no_such_function'"),
        ("env.factory=json", "must look like 'module:function'"),
        ("env.transforms=[{sandbox: {}}]", r"env.transforms\[0\]: unknown transform 'sandbox'"),
        ("env.transforms=[{python_interpreter: {persistant: true}}]", r"unknown option\(s\) \['persistant'\]"),
        ("env.transforms=[{add_thinking_prompt: {}}]", r"env.transforms\[0\].add_thinking_prompt: the flows run"),
        ("env.rewards=[{function: 'json:nope'}]", r"env.rewards\[0\].function: module 'json' has no attribute"),
        ("env.rewards=[{function: 'json:dumps', weight: x}]", r"env.rewards\[0\].weight: expected float"),
        ("env.rewards=[{function: 'math:sqrt'}]", r"must accept \(prompt, completion, row\)"),
        ("env.max_turns=0", "env.max_turns must be >= 1"),
        (("env.name=countdown", "env.args.numbers=3"), r"env.args: unknown key\(s\) \['numbers'\] for countdown"),
        (("env.name=countdown", "env.args.max_number=0"), "env.args.max_number: expected a positive int"),
        ("env.env_reward=false", "nothing would pay"),
    ],
)
def test_bad_env_settings_fail_before_anything_starts(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(GRPOConfig, None, [override] if isinstance(override, str) else list(override))


def test_env_section_defaults_keep_the_task_section_working():
    cfg = load_config(GRPOConfig, None, [])
    assert cfg.env.name == "gsm8k" and cfg.env.prompt_field == "question"
    assert load_config(GRPOConfig, None, ["env.name=ifeval"]).env.prompt_field == "prompt"


@pytest.mark.slow
def test_grpo_on_a_gymnasium_style_game_through_the_mlgym_wrapper(tmp_path):
    store = _run(
        tmp_path,
        "game",
        "iterations=1",
        "env.name=guess_number",
        "env.max_turns=3",
        "data.source=guess_number:train",
        "rollout.max_new_tokens=16",
    )
    rows = store.read_records("game", version=0)
    assert len(rows) == 4
    by_group: dict[str, set] = {}
    for r in rows:
        first_user = next(m["content"] for m in r.messages if m["role"] == "user")
        assert "guess" in first_user.lower() or "number" in first_user.lower(), first_user
        assert r.reward in (0.0, 1.0)
        assert r.turn == sum(m["role"] == "assistant" for m in r.messages) - 1
        if r.turn > 0:  # the game's replies are user turns inside the response, outside the policy mask
            assert False in r.response_mask
        by_group.setdefault(r.group_id, set()).add(first_user)
    assert all(len(prompts) == 1 for prompts in by_group.values())  # a GRPO group plays one game


@pytest.mark.parametrize("name", ["gsm8k", "ifeval", "guess_number", "countdown"])
def test_the_flows_built_in_envs_render_with_the_models_own_template(name, default_model_path):
    """A flow's built-in env renders its prompts with the model's own chat template (SmolLM2's adds its default
    system turn when a chat has none), not with the choice a bare ``ChatEnv`` makes as TorchRL does (ChatML);
    ``env.args.chat_template_name`` still picks another."""
    from transformers import AutoTokenizer

    from llmrl_core.data.chat_templates import NAMED_TEMPLATES
    from llmrl_core.data.conversation import Conversation, Message
    from llmrl_core.pipeline.env_config import EnvConfig, build_env
    from llmrl_core.pipeline.task_config import TaskConfig

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    env = build_env(EnvConfig(name=name), TaskConfig(system_prompt=None), tokenizer, input_mode="tokens")
    try:
        assert env._template.template == tokenizer.chat_template
        rendered = env._render(Conversation([Message("user", "Hi")]), add_generation_prompt=True)
        assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    finally:
        env.close()
    named = build_env(EnvConfig(name=name, options={"chat_template_name": "chatml"}), TaskConfig(), tokenizer)
    assert named._template.template == NAMED_TEMPLATES["chatml"].template
    named.close()


def test_the_readme_example_env_builds_and_pays(tmp_path, monkeypatch, default_model_path):
    """The "Your own environment" code and YAML of docs/environments.md, as a user would copy them."""
    import re
    from pathlib import Path

    import yaml
    from transformers import AutoTokenizer

    from llmrl_core.data.llm_data import Response
    from llmrl_core.pipeline.config_io import build
    from llmrl_core.pipeline.env_config import EnvConfig, build_env, validate_env_config
    from llmrl_core.pipeline.task_config import TaskConfig

    readme = (Path(__file__).resolve().parents[1] / "docs" / "environments.md").read_text()
    section = readme.split("## Your own environment", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    config = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    (tmp_path / "my_env.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    env_cfg = build(EnvConfig, config["env"], "env")
    validate_env_config(env_cfg)
    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    env = build_env(env_cfg, TaskConfig(), tokenizer, input_mode="history")
    try:
        out = env.reset([{"query": "What is the capital of France?"}, {"query": "Name a colour."}])
        assert out["history", "prompt"][0][0].content == "Answer in capitals, briefly."
        out = env.step([Response("PARIS"), Response("I think the colour is blue, " + "really " * 20)])
        assert out["reward_components"][0] == {"Shout": 1.0, "brevity": 0.5}
        assert out["reward_components"][1] == {"brevity": 0.0}  # a transform's zero is no change: no component
        assert out["reward"].reshape(-1).tolist() == [1.5, 0.0] and out["done"].reshape(-1).tolist() == [True, True]
    finally:
        env.close()
    sys.modules.pop("my_env", None)


def test_the_shipped_recipe_configs_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "recipes"
    ifeval = load_config(GRPOConfig, root / "ifeval" / "grpo.yaml")
    assert ifeval.env.name == "ifeval" and ifeval.env.prompt_field == "prompt" and ifeval.data.source == "ifeval"
    tool = load_config(GRPOConfig, root / "arithmetic-tool" / "grpo.yaml")
    assert tool.env.name == "arithmetic_python" and tool.env.prompt_field == "question"
    assert [set(e) for e in tool.task.few_shot] == [{"question", "response"}, {"question", "turns"}]
    arithmetic = load_config(GRPOConfig, root / "arithmetic" / "grpo.yaml")
    assert arithmetic.env.name == "gsm8k" and arithmetic.train.mixed_precision == "auto"
