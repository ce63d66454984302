"""IFEvalEnv: prompts from the shipped file (or a Hugging Face dataset), one scored batch through reset/step."""

from __future__ import annotations

import pytest
import torch

from llmrl_core.builtin_data.ifeval_data import load_ifeval
from llmrl_core.envs.ifeval import (
    IFEVAL_QUESTION_TEMPLATE,
    IFEVAL_SYSTEM_PROMPT,
    IFEvalEnv,
    IfEvalScorer,
    InstructionArgumentError,
    UnknownInstructionError,
)

ROWS = {row["key"]: row for row in load_ifeval()}


def _rows(*keys):
    return [dict(ROWS[k]) for k in keys]


def test_one_scored_batch_goes_through_the_env():
    env = IFEvalEnv(_rows(142, 1001), batch_size=2, repeats=2, group_repeats=True, shuffle=False)
    out = env.reset_batch()
    assert out.batch_size[0] == 4
    assert out["prompt_id"] == [142, 142, 1001, 1001] and out["group_id"] == [0, 0, 1, 1]
    assert out["sample_index"].tolist() == [0, 1, 0, 1]
    for i, key in enumerate(out["prompt_id"]):
        history = out["history", "prompt"][i]
        assert history.role == ["system", "user"]
        assert history[0].content == IFEVAL_SYSTEM_PROMPT
        assert history[1].content == IFEVAL_QUESTION_TEMPLATE.format(question=ROWS[key]["prompt"])
    responses = [
        '<think>A joke.</think>\n<answer>"Why did the cat knock twice? Knock knock, morphology!"</answer>',
        '<think>x</think><answer>Here is one:\n"Why did the cat knock? Knock."</answer>',
        "<think>plan</think> Thou shalt go to Tokyo",
        "<answer>no commas here</answer><answer>a, b</answer>",
    ]
    out = env.step(responses)
    # expected rewards from TorchRL 0.14.1 (the same responses in tests/test_ifeval_scorer.py::TORCHRL_CASES)
    assert out["reward"].reshape(-1).tolist() == pytest.approx([1.15, 0.65, 0.05, 1.0], abs=1e-6)
    assert out["done"].all()
    assert out["terminated"].reshape(-1).tolist() == [True, True, False, True]  # no answer block: cut by max_turns
    assert out["truncated"].reshape(-1).tolist() == [False, False, True, False]
    assert out["reward_components"][1] == {
        "prompt_level_strict_acc": 0.0,
        "inst_level_strict_acc": pytest.approx(2 / 3),
        "prompt_level_loose_acc": 1.0,
        "inst_level_loose_acc": 1.0,
        "answer_block": 1.0,
        "think_block": 1.0,
    }
    score = out["info"][1]["ifeval_score"]
    assert score.instruction_id_list == list(ROWS[142]["instruction_id_list"])
    assert score.inst_level_strict_acc.tolist() == [False, True, True]
    assert env.scorer is not None and isinstance(env.scorer, IfEvalScorer)


def test_default_env_reads_the_shipped_prompts_in_seeded_order():
    env = IFEvalEnv(batch_size=3, seed=5)
    keys = env.reset_batch()["prompt_id"]
    assert len(set(keys)) == 3 and set(keys) <= set(ROWS)
    again = IFEvalEnv(batch_size=3, seed=5)
    assert again.reset_batch()["prompt_id"] == keys
    state = env.state_dict()
    resumed = IFEvalEnv(batch_size=3, seed=5)
    resumed.load_state_dict(state)
    assert resumed.reset_batch()["prompt_id"] == env.reset_batch()["prompt_id"]


def test_plain_ifeval_evaluation_mode_scores_the_whole_response():
    env = IFEvalEnv(_rows(1001), shuffle=False, system_prompt=None, question_template=None, answer_only=False)
    out = env.reset_batch()
    assert out["history", "prompt"][0].content == [ROWS[1001]["prompt"]]
    out = env.step(["Thou shalt go to Tokyo and then to Kyoto"])
    assert out["reward"].reshape(-1).tolist() == pytest.approx([1.0])  # all four metrics, no format bonus
    assert out["truncated"].reshape(-1).tolist() == [True]


def test_hugging_face_dataset_rows_with_none_kwargs(tmp_path):
    datasets = pytest.importorskip("datasets")
    # google/IFEval on the Hub: every kwargs dict has every field, None where unused (Arrow unifies the structs)
    ds = datasets.Dataset.from_list(_rows(142, 1001, 1739))
    first_kwargs = ds[0]["kwargs"][0]
    assert set(first_kwargs) >= {"keyword", "language", "relation"} and set(first_kwargs.values()) == {None}
    env = IFEvalEnv(ds, batch_size=3, shuffle=False)
    out = env.reset_batch()
    assert out["prompt_id"] == [142, 1001, 1739]
    out = env.step(
        [
            '<think>A joke.</think>\n<answer>"Why did the cat knock twice? Knock knock, morphology!"</answer>',
            "<answer>Thou shalt go, fair traveller</answer>",
            "<answer>Chúng tôi có thể cải thiện mô hình của mình để có hiệu suất tốt hơn</answer>",
        ]
    )
    assert out["reward"].reshape(-1).tolist() == pytest.approx([1.15, 0.1, 1.1], abs=1e-6)


def test_bad_rows_fail_when_the_env_is_built():
    bad_id = _rows(142, 1001)
    bad_id[1]["instruction_id_list"] = ["punctuation:no_commas"]
    with pytest.raises(
        UnknownInstructionError, match=r"row 1 \(key 1001\): unknown IFEval instruction id 'punctuation"
    ):
        IFEvalEnv(bad_id)
    bad_kwargs = _rows(142)
    bad_kwargs[0]["kwargs"] = [{}, {"keyword": "knock"}, {"keywords": ["cat"]}]
    with pytest.raises(InstructionArgumentError, match=r"row 0 \(key 142\): keywords:frequency: missing kwarg"):
        IFEvalEnv(bad_kwargs)
    no_prompt = [{k: v for k, v in ROWS[142].items() if k != "prompt"}]
    with pytest.raises(ValueError, match=r"row 0: missing field\(s\) \['prompt'\]"):
        IFEvalEnv(no_prompt)


def test_text_mode_renders_the_packaged_models_chat_template(default_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    env = IFEvalEnv(_rows(1001), tokenizer=tokenizer, input_mode="text", shuffle=False)
    text = env.reset_batch()["text", "prompt"][0]
    assert ROWS[1001]["prompt"] in text and IFEVAL_SYSTEM_PROMPT in text
    assert text.rstrip().endswith("assistant")  # ends with the generation prompt
    out = env.step(["<answer>Go forth to Kyoto</answer>" + tokenizer.eos_token])
    # the end-of-turn marker is stripped before scoring
    assert out["reward"].reshape(-1).tolist() == pytest.approx([1.1])


@pytest.mark.slow
def test_the_packaged_model_generates_and_the_env_scores_it(hf_model_fp32):
    """End to end with the real model (greedy, 24 new tokens): ~10 s on an idle machine, ~90 s under load."""
    from llmrl_core.modules import TransformersWrapper

    model, tokenizer = hf_model_fp32
    env = IFEvalEnv(_rows(1001, 2422), batch_size=2, shuffle=False)
    policy = TransformersWrapper(model, tokenizer=tokenizer, generate_kwargs={"max_new_tokens": 24, "do_sample": False})
    out = env.reset_batch()
    torch.manual_seed(0)
    generated = policy(out)
    out = env.step(generated)["next"]  # TorchRL's step(td): the outcome under "next"
    assert out["done"].all()
    scorer = IfEvalScorer()
    for slot, reward in zip(env.slots, out["reward"].reshape(-1).tolist(), strict=True):
        text = slot.last_message("assistant").text
        _, expected = scorer.score_text(text, slot.data["instruction_id_list"], slot.data["kwargs"])
        assert reward == pytest.approx(expected) and 0.0 <= reward <= 1.15
        assert slot.info["ifeval_score"].instruction_id_list == list(slot.data["instruction_id_list"])


def test_scorer_on_a_plain_chat_env_and_rows_without_instructions():
    from llmrl_core.envs import ChatEnv

    env = ChatEnv().append_transform(IfEvalScorer(set_done_if_answer=False))
    row = ROWS[1001]
    env.reset([{"query": row["prompt"], "instruction_id_list": row["instruction_id_list"], "kwargs": row["kwargs"]}])
    out = env.step(["<answer>Go forth to Kyoto</answer>"])
    # no max_turns, no termination
    assert out["reward"].reshape(-1).tolist() == pytest.approx([1.1]) and not out["done"].any()
    env.reset([{"query": "Hi", "key": 9}])
    with pytest.raises(ValueError, match=r"slot 0 \(prompt 9\) has no field\(s\) \['instruction_id_list', 'kwargs'\]"):
        env.step(["<answer>x</answer>"])
