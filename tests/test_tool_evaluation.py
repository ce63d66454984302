"""Tool-using episodes outside training: few-shot examples that show a tool round trip, the context guard of a
tokens-mode env, the tool metrics of an evaluation, and the evaluate flow's choice of how to score a run."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from llmrl_core.data.llm_data import Response
from llmrl_core.evaluation.results import ModeResult, QuestionOutcome, SampleOutcome
from llmrl_core.pipeline.env_config import EnvConfig, build_env
from llmrl_core.pipeline.task_config import TaskConfig

TOOL_SHOT = {
    "question": "What is 7341 - 2958?",
    "turns": [
        {"role": "assistant", "content": "```python\nprint(7341 - 2958)\n```"},
        {"role": "tool", "content": "Code block 1 executed successfully:\n4383\n"},
        {"role": "assistant", "content": "<answer>4383</answer>"},
    ],
}
TASK = TaskConfig(system_prompt="Solve it.", question_template=None, few_shot=[TOOL_SHOT], format_reward=0.0)


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


def test_a_few_shot_example_can_show_a_tool_round_trip(tokenizer):
    env = build_env(EnvConfig(name="arithmetic_python"), TASK, tokenizer, input_mode="history")
    try:
        out = env.reset([{"query": "What is 12 * 13?", "answer": "#### 156"}])
        history = out["history", "prompt"][0]
        assert history.role == ["system", "user", "assistant", "tool", "assistant", "user"]
        assert history[3].content.endswith("4383\n")
        assert history[-1].content == "What is 12 * 13?"
    finally:
        env.close()


@pytest.mark.parametrize(
    ("example", "message"),
    [
        ({"question": "q", "turns": [{"role": "tool", "content": "x"}]}, "last of 'turns' must be an assistant"),
        ({"question": "q", "response": "a", "turns": []}, "one of 'response' or 'turns'"),
        ({"question": "q", "turns": [{"role": "assistant"}]}, "turns[0]: expected a {role, content}"),
        ({"question": "", "response": "a"}, "non-empty 'question'"),
    ],
)
def test_bad_few_shot_examples_name_the_example(example, message):
    with pytest.raises(ValueError, match=r"task\.few_shot\[1\]") as err:
        TaskConfig(few_shot=[{"question": "ok", "response": "fine"}, example])
    assert message in str(err.value)


def test_a_conversation_that_outgrows_the_context_is_truncated_not_sent(tokenizer):
    env = build_env(EnvConfig(name="arithmetic_python"), TASK, tokenizer, input_mode="tokens")
    row = {"query": "What is 12 * 13?", "answer": "#### 156"}
    flood = Response("```python\nprint('1234567890 ' * 400)\n```")  # ~4 KB of tool output
    try:
        prompt_len = len(env.reset([row]).get(("tokens", "prompt"), as_list=True)[0])
        out = env.step([flood])
        assert not out["done"][0]  # no limit: the episode goes on with the long tool message
        env.max_prompt_tokens = prompt_len + 200
        env.reset([row])
        out = env.step([flood])
        assert out["done"][0] and out["truncated"][0] and not out["terminated"][0]
        assert env.slots[0].info["context_full"] is True
        assert env.slots[0].info["num_tool_calls"] == 1
    finally:
        env.close()


def _sample(correct: bool, calls: int, errors: int) -> SampleOutcome:
    extra = {"tool_call_rate": float(calls > 0), "tool_calls": float(calls), "tool_errors": float(errors), "turns": 2.0}
    return SampleOutcome("t", "", correct, True, float(correct), 10, "stop", extra)


def test_tool_success_rate_is_over_all_calls():
    mode = ModeResult(
        "sampled",
        2,
        0.7,
        [
            QuestionOutcome(0, "1", [_sample(True, 1, 0), _sample(False, 3, 2)]),
            QuestionOutcome(1, "2", [_sample(False, 0, 0), _sample(True, 2, 0)]),
        ],
    )
    metrics = mode.metrics([1])
    assert metrics["tool_success_rate"] == pytest.approx(1 - 2 / 6)
    assert metrics["tool_call_rate"] == pytest.approx((1.0 + 0.5) / 2)  # per-question means, then their mean
    assert metrics["tool_calls"] == pytest.approx((2.0 + 1.0) / 2)
    none = ModeResult("greedy", 1, 0.0, [QuestionOutcome(0, "1", [_sample(True, 0, 0)])])
    assert math.isnan(none.metrics()["tool_success_rate"])


def test_the_evaluate_flow_plays_tool_and_game_envs_and_batches_single_turn_ones():
    from tasks.evaluate import env_scoring

    assert env_scoring({}) == "single_turn"
    assert env_scoring({"name": "arithmetic"}) == "single_turn"
    assert env_scoring({"name": "ifeval"}) == "ifeval"
    for env in (
        {"name": "arithmetic_python"},
        {"name": "arithmetic_mcp"},
        {"name": "guess_number"},
        {"factory": "pkg:make"},
        {"name": "gsm8k", "transforms": [{"python_interpreter": {}}]},
        {"name": "gsm8k", "max_turns": 3},
    ):
        assert env_scoring(env) == "episode", env


@pytest.mark.slow
def test_evaluate_env_executes_the_tool_and_scores_every_episode(vllm_engine_fp32, tokenizer):
    from llmrl_core.evaluation.env_eval import evaluate_env
    from llmrl_core.modules import vLLMWrapper
    from llmrl_core.modules.backends.types import SamplingConfig

    # The real shared engine; the namespace stands in for what the episode loop reads of a vLLMWorker: its config,
    # policy version and policy (TorchRL's vLLMWrapper on the engine).
    def policy(input_mode: str, sampling: SamplingConfig, progress: bool = False) -> vLLMWrapper:
        wrapper = vLLMWrapper(vllm_engine_fp32, input_mode=input_mode, generate_kwargs=sampling.as_kwargs())
        wrapper.progress = progress
        return wrapper

    worker = SimpleNamespace(config=SimpleNamespace(max_model_len=2048), policy_version=0, policy=policy)
    env = build_env(EnvConfig(name="arithmetic_python"), TASK, tokenizer, input_mode="tokens")
    rows = [{"question": f"What is {a} * {b}?", "answer": f"#### {a * b}"} for a, b in ((123, 45), (601, 72))]
    try:
        result = evaluate_env(
            worker, env, rows, n_samples=2, k_values=[1, 2], sampling=SamplingConfig(max_new_tokens=48, seed=0)
        )
    finally:
        env.close()
    assert set(result.modes) == {"greedy", "sampled"}
    assert [len(q.samples) for q in result.modes["sampled"].questions] == [2, 2]
    samples = [s for mode in result.modes.values() for q in mode.questions for s in q.samples]
    called = [s for s in samples if s.extra["tool_calls"] > 0]
    assert called, "the model never called the interpreter after a shown round trip"
    for s in called:
        assert "[tool] Code block 1" in s.text and s.extra["turns"] >= 2
    for q, row in zip(result.modes["greedy"].questions, rows, strict=True):
        s = q.samples[0]
        gold = row["answer"].removeprefix("#### ")
        assert s.correct == (f"<answer>{gold}</answer>" in s.text)  # the env's own verdict, checked by hand
        assert s.reward == float(s.correct)
    summary = result.summary()
    assert 0.0 <= summary["greedy/tool_call_rate"] <= 1.0 and "sampled/tool_success_rate" in summary
