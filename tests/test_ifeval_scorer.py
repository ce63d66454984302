"""IFEval scoring: strict and loose evaluation, the four metrics, the reward, and IfEvalScorer on its own."""

from __future__ import annotations

import pytest
import torch

from llmrl_core.builtin_data.ifeval_data import load_ifeval
from llmrl_core.envs.ifeval import (
    IFEvalScoreData,
    IfEvalScorer,
    InstructionArgumentError,
    UnknownInstructionError,
    ifeval_reward,
    loose_variants,
    score_response,
    summarize_scores,
)

ROWS = {row["key"]: row for row in load_ifeval()}

# Expected values from TorchRL 0.14.1: torchrl.envs.llm.reward.ifeval._process_results on the first answer block
# and IfEvalScorer().default_reward_aggregator (langdetect seeded 0), on the shipped rows with these keys.
# (key, response, prompt strict, inst strict, prompt loose, inst loose, reward)
TORCHRL_CASES = [
    (142, '<think>A joke.</think>\n<answer>"Why did the cat knock twice? Knock knock, morphology!"</answer>',
     True, [True, True, True], True, [True, True, True], 1.15),
    (142, '<think>x</think><answer>Here is one:\n"Why did the cat knock? Knock."</answer>',
     False, [False, True, True], True, [True, True, True], 0.65),
    (1739, "<answer>Chúng tôi có thể cải thiện mô hình của mình để có hiệu suất tốt hơn</answer>",
     True, [True, True], True, [True, True], 1.1),
    (2422, "<think>t</think><answer><<DOG FOOD SONG>>\nOUR STARTUP SELLS FOOD FOR DOGS AND THE DOGS LOVE IT</answer>",
     False, [False, True], False, [False, True], 0.35),
    (2422, "<think>t</think><answer>**<<Dog Food Song>>**\n"
           "Our startup sells food for dogs and the dogs love it</answer>",
     False, [False, True], False, [False, True], 0.35),
    (1000, "<think>s</think><think>t</think><answer>*one* **two** *three* short text</answer>",
     False, [True, True, False], False, [True, True, False], 0.366667),
    (1001, "<think>plan</think> Thou shalt go to Tokyo", False, [False], False, [False], 0.05),
    (1001, "<answer>no commas here</answer><answer>a, b</answer>", True, [True], True, [True], 1.0),
    (2395, '<answer>```json\n{"post": "Come to the market on Sunday"}\n```</answer>',
     False, [True, False], True, [True, True], 0.55),
    (1843, '<think>name</think><answer>"sunny shores estates"</answer>', True, [True, True], True, [True, True], 1.15),
    (1843, '<answer>Sure:\n"sunny shores estates"</answer>', False, [False, False], True, [True, True], 0.4),
    (1609, '<answer>"Weekend plans are fun.\n\nAsk her kindly.\n\nBe yourself.\n\nGood luck."</answer>',
     True, [True, True], True, [True, True], 1.1),
]  # fmt: skip


@pytest.mark.parametrize(("key", "response", "p_strict", "i_strict", "p_loose", "i_loose", "reward"), TORCHRL_CASES)
def test_scorer_matches_torchrl(key, response, p_strict, i_strict, p_loose, i_loose, reward):
    row = ROWS[key]
    score, got = IfEvalScorer().score_text(response, row["instruction_id_list"], row["kwargs"])
    assert score.prompt_level_strict_acc.tolist() == [p_strict]  # TorchRL's shape: (1,) for one row
    assert score.inst_level_strict_acc.tolist() == i_strict
    assert score.prompt_level_loose_acc.tolist() == [p_loose]
    assert score.inst_level_loose_acc.tolist() == i_loose
    assert got == pytest.approx(reward, abs=1e-6)


def test_loose_variants_are_ifevals_eight():
    text = "Sure, here:\n**Body** line\nHope it helps"
    assert loose_variants(text) == [
        text,
        "Sure, here:\nBody line\nHope it helps",
        "**Body** line\nHope it helps",
        "Sure, here:\n**Body** line",
        "**Body** line",
        "Body line\nHope it helps",
        "Sure, here:\nBody line",
        "Body line",
    ]


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "response"),
    [
        # a preamble line: only the variants without the first line pass
        ("startend:quotation", {}, 'Sure, here it is:\n"The whole answer."'),
        # a closing remark: only the variants without the last line pass
        ("detectable_format:json_format", {}, '{"a": 1}\nHope this helps!'),
        # both: only the variant without first and last line passes
        ("startend:quotation", {}, 'Sure:\n"All of it."\nBye!'),
        # markdown emphasis: only the variants with '*' removed pass
        (
            "startend:end_checker",
            {"end_phrase": "Is there anything else I can help with?"},
            "Done.\n**Is there anything else I can help with?**",
        ),  # fmt: skip
        (
            "length_constraints:nth_paragraph_first_word",
            {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "summary"},
            "Intro text.\n\n**Summary** of it.",
        ),  # fmt: skip
    ],
)
def test_loose_forgives_what_strict_does_not(instruction_id, kwargs, response):
    score = score_response([instruction_id], [kwargs], response)
    assert score.inst_level_strict_acc.tolist() == [False]
    assert score.inst_level_loose_acc.tolist() == [True]
    assert not score.prompt_level_strict_acc and score.prompt_level_loose_acc


def test_empty_response_follows_nothing_even_negative_instructions():
    ids = ["punctuation:no_comma", "keywords:forbidden_words"]
    kwargs = [{}, {"forbidden_words": ["rock"]}]
    for response in ("", "  \n "):
        score = score_response(ids, kwargs, response)
        assert score.inst_level_strict_acc.tolist() == score.inst_level_loose_acc.tolist() == [False, False]
    assert score_response(ids, kwargs, "No rocks.").inst_level_strict_acc.tolist() == [True, True]


def test_summary_pools_instruction_level_over_instructions():
    scores = [
        IFEvalScoreData(False, [True, True, False], True, [True, True, True], ["a", "b", "c"], batch_size=()),
        IFEvalScoreData(True, [True], True, [True], ["a"], batch_size=()),
    ]
    summary = summarize_scores(scores)
    # by hand: prompt level = mean over 2 prompts; instruction level = 3 of 4 (pooled), not mean(2/3, 1)
    assert summary == {
        "prompt_level_strict_acc": 0.5,
        "inst_level_strict_acc": 0.75,
        "prompt_level_loose_acc": 1.0,
        "inst_level_loose_acc": 1.0,
    }
    assert scores[0].to_plain() == {
        "instruction_id_list": ["a", "b", "c"],
        "prompt_level_strict_acc": False,
        "inst_level_strict_acc": [True, True, False],
        "prompt_level_loose_acc": True,
        "inst_level_loose_acc": [True, True, True],
    }
    with pytest.raises(ValueError, match="at least one"):
        summarize_scores([])


def test_reward_weights_and_format_bonus_by_hand():
    score = IFEvalScoreData(
        False, [True, False, False, False], True, [True, True, False, True], ["a", "b", "c", "d"], batch_size=()
    )
    # 0.4*0 + 0.3*0.25 + 0.2*1 + 0.1*0.75 = 0.35
    assert ifeval_reward(score) == pytest.approx(0.35)
    assert ifeval_reward(score, ["t"], ["a"]) == pytest.approx(0.5)
    assert ifeval_reward(score, ["t", "t2"], ["a"]) == pytest.approx(0.45)  # two think blocks: no think bonus
    assert ifeval_reward(score, ["t"], ["a", "b"]) == pytest.approx(0.4)  # two answers: no answer bonus
    assert ifeval_reward(score, weights=(1, 0, 0, 0)) == 0.0
    with pytest.raises(ValueError, match="4 entries"):
        ifeval_reward(score, weights=(1, 0))


def test_scorer_options():
    row = ROWS[1001]  # punctuation:no_comma
    plain = "Thou shalt go to Tokyo"
    seen = {}

    def aggregator(score, think_blocks, answer_blocks, complete):
        seen.update(think=think_blocks, answer=answer_blocks)
        return 7.0

    _, reward = IfEvalScorer(aggregate_reward=aggregator).score_text(
        f"<think>a</think><answer>{plain}</answer>", *_row(row)
    )
    assert reward == 7.0 and seen == {"think": ["a"], "answer": [plain]}
    assert IfEvalScorer(aggregate_reward=False).score_text(f"<answer>{plain}</answer>", *_row(row))[1] == 0.0
    # answer_only=False scores the whole message (plain IFEval evaluation): strict and loose both pass
    score, reward = IfEvalScorer(answer_only=False).score_text(plain, *_row(row))
    assert score.prompt_level_strict_acc and reward == pytest.approx(1.0)
    assert IfEvalScorer(format_weights=(0, 0, 0, 1)).score_text(f"<answer>{plain}</answer>", *_row(row))[1] == 1.1
    with pytest.raises(ValueError, match="4 entries"):
        IfEvalScorer(format_weights=[1.0])


def test_scorer_errors_name_the_instruction():
    with pytest.raises(UnknownInstructionError, match="'detectable_format:tittle'"):
        IfEvalScorer().score_text("<answer>x</answer>", ["detectable_format:tittle"], [{}])
    with pytest.raises(InstructionArgumentError, match="keywords:existence: missing kwarg"):
        IfEvalScorer().score_text("<answer>x</answer>", ["keywords:existence"], [{}])


def _row(row):
    return row["instruction_id_list"], row["kwargs"]


def test_scorer_takes_torchrl_keywords_and_logs_when_verbose(caplog):
    scorer = IfEvalScorer(prompt_key="prompt", response_column=("text", "response"), verbose=True)
    assert scorer.prompt_key == "prompt" and scorer.response_key == ("text", "response") and scorer.verbose
    assert IfEvalScorer().prompt_key == "text" and IfEvalScorer().response_key == "text_response"
    from llmrl_core.envs import ChatEnv

    row = ROWS[1001]
    env = ChatEnv().append_transform(scorer)
    env.reset([{"query": row["prompt"], "instruction_id_list": row["instruction_id_list"], "kwargs": row["kwargs"]}])
    with caplog.at_level("INFO", logger="llmrl_core.envs.ifeval"):
        out = env.step(["<answer>Go forth to Kyoto</answer>"])
    assert out["reward"].reshape(-1).tolist() == pytest.approx([1.1])
    assert any("IfEvalScorer: slot 0" in r.getMessage() for r in caplog.records)


def test_the_score_is_torchrls_tensorclass_so_a_torchrl_aggregator_runs_on_it():
    """TorchRL's ``IFEvalScoreData``: bool tensors, prompt-level ``(1,)``, instruction-level one per instruction, a
    missing metric filled with zeros; an aggregator written for TorchRL (tensor arithmetic on the fields) runs as
    ``aggregate_reward`` and its value is the reward."""
    from tensordict import TensorClass

    empty = IFEvalScoreData(None, None, None, None, batch_size=())
    assert isinstance(empty, TensorClass) and empty.prompt_level_loose_acc.shape == (1,)
    assert not empty.inst_level_strict_acc.any()
    batched = IFEvalScoreData(
        torch.tensor([True, False]), torch.tensor([[True, False], [False, False]]), None, None, batch_size=(2,)
    )
    assert batched.prompt_level_strict_acc.shape == (2, 1) and batched[1].inst_level_strict_acc.tolist() == [False] * 2

    def torchrl_style(score, think_blocks=None, answer_blocks=None, complete=None):
        score = score.to(torch.get_default_dtype())  # as TorchRL's default aggregator starts
        return float(score.prompt_level_strict_acc.sum(-1) + score.inst_level_loose_acc.mean(-1))

    row = ROWS[1843]
    response = '<answer>Sure:\n"sunny shores estates"</answer>'
    score, reward = IfEvalScorer(aggregate_reward=torchrl_style).score_text(
        response, row["instruction_id_list"], row["kwargs"]
    )
    assert reward == pytest.approx(0.0 + 1.0)  # strict fails (the preamble), both instructions pass loosely
    assert score.to_plain()["inst_level_loose_acc"] == [True, True]


def test_the_step_tensordict_and_the_collectors_rows_carry_the_score_as_torchrl_writes_it():
    """TorchRL's ``IfEvalScorer`` writes the score under ``("next", score_key)``: here too, stacked over the slots
    (instruction-level flags ragged: one per instruction of each row), equal to the score the slot keeps; a slot
    that was done before the step gets a zeroed score, and each collector dialog-turn row carries its own."""
    from tensordict import TensorDict

    from llmrl_core.collectors import LLMCollector
    from llmrl_core.data import LLMData
    from llmrl_core.envs import ChatEnv

    rows = [ROWS[1001], ROWS[142]]
    prompts = [
        {"query": r["prompt"], "instruction_id_list": r["instruction_id_list"], "kwargs": r["kwargs"]} for r in rows
    ]
    env = ChatEnv(batch_size=(2,), chat_template_name="chatml").append_transform(IfEvalScorer())
    env.reset_batch(prompts)
    first = env.step(TensorDict({("text", "response"): ["<answer>Go forth to Kyoto</answer>", "no tags"]}, (2,)))
    score = first["next", "ifeval_score"]
    assert isinstance(score, IFEvalScoreData) and score.batch_size == (2,)
    assert score.prompt_level_strict_acc.tolist() == [[True], [False]]
    assert [t.tolist() for t in score.get("inst_level_strict_acc", as_list=True)] == [[True], [False] * 3]
    assert first["next", "reward"].flatten().tolist() == pytest.approx([1.1, 0.0])
    assert first["next", "done"].flatten().tolist() == [True, False]  # an answer ends the episode
    second = env.step(TensorDict({("text", "response"): ["unused", "<answer>still no joke</answer>"]}, (2,)))
    score = second["next", "ifeval_score"]
    assert score[0].prompt_level_loose_acc.tolist() == [False] and not score[0].inst_level_loose_acc.any()  # done
    assert score[1].inst_level_loose_acc.tolist() == env.slots[1].info["ifeval_score"].inst_level_loose_acc.tolist()

    def answers(data: LLMData) -> LLMData:
        return LLMData(text_response=["<answer>Go forth</answer>"] * data.batch_size, finish_reasons=["stop"] * 2)

    env = ChatEnv(batch_size=(2,), chat_template_name="chatml").append_transform(IfEvalScorer())
    collector = LLMCollector(env, answers, prompts=prompts * 2, dialog_turns_per_batch=2, total_dialog_turns=4)
    batch = next(iter(collector)).view(-1)
    scores = batch["next", "ifeval_score"]
    assert scores.batch_size == (2,) and scores.prompt_level_strict_acc.tolist() == [[True], [False]]
    assert [len(t) for t in scores.get("inst_level_strict_acc", as_list=True)] == [1, 3]
