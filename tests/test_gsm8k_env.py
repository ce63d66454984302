"""GSM8K: the reward parser on tricky responses (TorchRL reference values) and the env on the packaged test set."""

from __future__ import annotations

import json

import pytest
import torch

from llmrl_core.builtin_data import gsm8k_gold, gsm8k_path
from llmrl_core.data import Response
from llmrl_core.envs import GSM8KEnv, GSM8KPrepareQuestion, GSM8KRewardParser, make_gsm8k_env
from llmrl_core.envs.gsm8k_reward import normalize_answer

GSM8K_TEST = gsm8k_path("test")  # the copy shipped in the package, so the tests run from any checkout

# Expected values from TorchRL 0.14.1: GSM8KRewardParser(eos_token="<|im_end|>") -- extract_tags on the response
# without its EOS, then _single_correctness_reward(gold, answer, think) with gold = "x\n#### <gold>".split("#### ")[1].
# Columns: response, gold, reward, reward_answer, reward_think, success.
CASES = [
    ("<think>16-3-4=9, 9*2=18</think> <answer>18</answer>", "18", 1.0, 1.0, 1.0, True),
    ("<answer>18</answer>", "18", 1.0, 1.0, 0.0, True),
    ("<answer>$18</answer><|im_end|>", "18", 1.0, 1.0, 0.0, True),
    ("<answer>18.00</answer>", "18", 1.0, 1.0, 0.0, True),
    ("<answer>18.</answer>", "18", 1.0, 1.0, 0.0, True),
    ("<answer>1,000</answer>", "1000", 1.0, 1.0, 0.0, True),
    ("<answer>50%</answer>", "50", 1.0, 1.0, 0.0, True),
    ("<answer> 18 </answer>", "18", 1.0, 1.0, 0.0, True),
    ("<answer>18 dollars</answer>", "18", 0.1, 1.0, 0.0, False),
    ("<answer>19</answer>", "18", 0.1, 1.0, 0.0, False),
    ("<answer>17</answer> <answer>18</answer>", "18", 0.1, 1.0, 0.0, False),
    ("<answer>18</answer> <answer>17</answer>", "18", 1.0, 1.0, 0.0, True),
    ("The answer is 18.", "18", 0.0, 0.0, 0.0, False),
    ("<answer></answer>", "18", 0.0, 0.0, 0.0, False),
    ("<answer>   </answer>", "18", 0.0, 0.0, 0.0, False),
    ("<answer>18", "18", 0.0, 0.0, 0.0, False),
    ("<ANSWER>18</ANSWER>", "18", 0.0, 0.0, 0.0, False),
    ("<think></think><answer>18</answer>", "18", 1.0, 1.0, 0.0, True),
    ("<think>reasoning</think>", "18", 0.0, 0.0, 1.0, False),
    ("<answer>\n18\n</answer>", "18", 1.0, 1.0, 0.0, True),
    ("<answer>0.5</answer>", ".5", 0.1, 1.0, 0.0, False),
    ("<answer>1.50</answer>", "1.5", 1.0, 1.0, 0.0, True),
    ("<answer>-3</answer>", "-3", 1.0, 1.0, 0.0, True),
    ("<answer>3</answer>", "-3", 0.1, 1.0, 0.0, False),
    ("<answer>100.0</answer>", "100", 1.0, 1.0, 0.0, True),
    ("<answer>10</answer>", "100", 0.1, 1.0, 0.0, False),
    ("<answer>$1,234.50</answer>", "1234.5", 1.0, 1.0, 0.0, True),
    ("<answer>18</answer><|im_end|>", "18", 1.0, 1.0, 0.0, True),
    ("<think>a <answer>5</answer> b</think><answer>18</answer>", "18", 0.1, 1.0, 1.0, False),
    ("<answer>0</answer>", "0", 1.0, 1.0, 0.0, True),
    ("<answer>0.0</answer>", "0", 1.0, 1.0, 0.0, True),
    ("<answer>7/2</answer>", "3.5", 0.1, 1.0, 0.0, False),
]


@pytest.mark.parametrize(("response", "gold", "reward", "has_answer", "has_think", "success"), CASES)
def test_reward_parser_matches_torchrl(response, gold, reward, has_answer, has_think, success):
    out = GSM8KRewardParser(eos_token="<|im_end|>").score(response, f"x\n#### {gold}")
    assert out["reward"] == pytest.approx(reward, abs=1e-6)
    assert out["reward_right"] == pytest.approx(reward, abs=1e-6)
    assert out["reward_answer"] == has_answer and out["reward_think"] == has_think and out["success"] is success


def test_normalisation_rules():
    assert normalize_answer(" $1,234.500 ") == "1234.5"
    assert normalize_answer("50%") == "50" and normalize_answer("18.") == "18" and normalize_answer("120.0") == "120"
    assert normalize_answer("100") == "100"  # trailing zeros of integers stay


def test_custom_reward_values_and_gold_without_marker():
    parser = GSM8KRewardParser(format_reward=0.2, correct_reward=2.0)
    assert parser.score("<answer>3</answer>", "3")["reward"] == 2.0  # a bare gold value works too
    assert parser.score("<answer>4</answer>", "3")["reward"] == 0.2


def test_every_packaged_test_gold_answer_scores_as_correct():
    rows = [json.loads(line) for line in GSM8K_TEST.read_text().splitlines() if line.strip()]
    assert len(rows) == 1319
    parser = GSM8KRewardParser()
    wrong = [
        i
        for i, r in enumerate(rows)
        if not parser.score(f"<answer>{gsm8k_gold(r['answer'])}</answer>", r["answer"])["success"]
    ]
    assert wrong == []
    off_by_one = [
        r
        for r in rows
        if parser.score(f"<answer>{int(gsm8k_gold(r['answer']).replace(',', '')) + 1}</answer>", r["answer"])["success"]
    ]
    assert off_by_one == []


def test_gsm8k_env_on_the_packaged_test_set():
    env = make_gsm8k_env(
        str(GSM8K_TEST), batch_size=3, repeats=2, group_repeats=True, seed=0, chat_template_name="chatml"
    )
    out = env.reset_batch()
    assert out.batch_size[0] == 6 and out["group_id"] == [0, 0, 1, 1, 2, 2]
    history = out["history", "prompt"]
    user = history[0][1].content
    assert history[0][0].role == "system" and "<answer>" in history[0][0].content
    question = out["query"][0]
    assert user.startswith(question) and "<answer></answer>" in user
    golds = [gsm8k_gold(answer) for answer in out["answer"]]
    responses = [
        f"<think>work</think> <answer>{golds[0]}</answer><|im_end|>",  # right
        "<answer>-1</answer>",  # wrong number
        "I do not know.",  # no tag
        f"<answer>${golds[3]}.00</answer>",  # right after normalisation
        "<answer></answer>",  # empty tag
        Response(f"<answer>{golds[5]}", finish_reason="length"),  # cut before the closing tag
    ]
    out = env.step(responses)
    assert out["reward"].reshape(-1).tolist() == pytest.approx([1.0, 0.1, 0.0, 1.0, 0.0, 0.0])
    assert [i["success"] for i in out["info"]] == [True, False, False, True, False, False]
    assert out["terminated"].reshape(-1).tolist() == [True, True, False, True, False, False]  # done once answered
    assert out["done"].all()  # the others hit max_turns=1
    assert out["reward_components"][0] == {"reward_answer": 1.0, "reward_think": 1.0, "reward_right": 1.0}


def test_gsm8k_multi_turn_keeps_going_until_an_answer():
    rows = [{"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}]
    env = GSM8KEnv(rows, max_turns=3, chat_template_name="chatml", question_template=None)
    out = env.reset_batch()
    assert out["history", "prompt"][0][1].content == "What is 2+2?"
    out = env.step(["Let me think."])
    assert not out["done"].any() and out["reward"].reshape(-1).tolist() == [0.0]
    out = env.step(["<answer>4</answer>"])
    assert out["terminated"].all() and out["reward"].reshape(-1).tolist() == [1.0]


def test_gsm8k_defaults_and_errors():
    env = GSM8KEnv(batch_size=2)  # the shipped train split
    assert len(env.primer.source) == 7473
    assert env.reset().batch_size == (2,)  # TorchRL's call answers a TensorDict
    with pytest.raises(ValueError, match="must contain '\\{question\\}'"):
        GSM8KPrepareQuestion(template="no placeholder")
    bad = GSM8KEnv([{"question": "q", "solution": "4"}], chat_template_name="chatml")
    bad.reset()
    with pytest.raises(ValueError, match="prompt row has no .answer. field"):
        bad.step(["<answer>4</answer>"])


@pytest.mark.slow
def test_gsm8k_env_with_the_packaged_model(hf_model_fp32):
    """End to end: tokens mode, the real model generates, the env scores the sampled ids (~10 s idle, 70 s loaded)."""
    model, tokenizer = hf_model_fp32
    env = make_gsm8k_env(
        str(GSM8K_TEST), batch_size=1, repeats=2, group_repeats=True, tokenizer=tokenizer, input_mode="tokens", seed=3
    )
    out = env.reset_batch()
    prompts = out.get(("tokens", "prompt"), as_list=True)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding for generation
        ids[i, width - len(p) :] = p
        attn[i, width - len(p) :] = 1
    torch.manual_seed(0)
    with torch.no_grad():
        gen = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=16, do_sample=True, temperature=0.7,
                             pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    responses = []
    for row in gen[:, width:]:
        row = row.tolist()
        if tokenizer.eos_token_id in row:
            row = row[: row.index(tokenizer.eos_token_id) + 1]
            reason = "stop"
        else:
            row = [t for t in row if t != tokenizer.pad_token_id]
            reason = "length"
        responses.append(Response(tokenizer.decode(row), token_ids=torch.tensor(row), finish_reason=reason))
    out = env.step(responses)
    assert out["done"].all()
    for i, slot in enumerate(env.slots):
        assert set(out["reward"].reshape(-1).tolist()) <= {0.0, 0.1, 1.0}
        sampled = slot.all_tokens()[slot.policy_mask()]
        assert sampled.tolist() == responses[i].token_ids.tolist()
        assert slot.all_tokens()[: len(prompts[i])].tolist() == prompts[i].tolist()


# --- TorchRL 0.14.1 argument order ----------------------------------------------------------------------------
def test_reward_parser_accepts_torchrl_positional_order():
    # TorchRL: (tokenizer, in_keys, out_keys, eos_token, set_done_if_answer, input_mode, format_reward, correct_reward)
    parser = GSM8KRewardParser(None, [("history", "full"), "answer"], None, "<|im_end|>", False, "history", 0.2, 2.0)
    assert parser.eos_token == "<|im_end|>" and parser.set_done_if_answer is False and parser.input_mode == "history"
    assert parser.score("<answer>18</answer><|im_end|>", "x\n#### 18")["reward"] == 2.0
    assert parser.score("<answer>17</answer>", "x\n#### 18")["reward"] == 0.2
    gold_field = GSM8KRewardParser(None, [("text", "response"), "gold"])  # the second in_key names the gold field
    assert gold_field.answer_key == "gold"
    env = GSM8KEnv([{"question": "What is 2+2?", "gold": "4"}], chat_template_name="chatml", compute_reward=False)
    env.append_transform(GSM8KRewardParser(None, [("history", "full"), "gold"]))
    env.reset_batch()
    assert env.step(["<answer>4</answer>"])["reward"].reshape(-1).tolist() == [1.0]


def test_reward_parser_refuses_keys_it_cannot_honour():
    with pytest.raises(ValueError, match="out_keys=.*not supported"):
        GSM8KRewardParser(None, None, ["my_reward"])
    with pytest.raises(ValueError, match="in_keys=.*not supported"):
        GSM8KRewardParser(None, [("observation", "x"), "answer"])
    with pytest.raises(ValueError, match="input_mode must be"):
        GSM8KRewardParser(input_mode="images")


def test_prepare_question_accepts_torchrl_keys():
    default = GSM8KPrepareQuestion(["text"], ["text"])
    assert default.in_keys == default.out_keys == ["text"] and "{question}" in default.template
    assert GSM8KPrepareQuestion(None, None, template="Q: {question}").template == "Q: {question}"
    with pytest.raises(ValueError, match="in_keys=\\['query'\\] is not supported"):
        GSM8KPrepareQuestion(["query"])
    with pytest.raises(ValueError, match="out_keys"):
        GSM8KPrepareQuestion(["text"], ["prepared"])


def test_make_gsm8k_env_torchrl_defaults_use_the_shipped_data():
    # TorchRL positional order: dataset, num_envs, repeats, batch_size_dl, seed, group_repeats, tokenizer
    env = make_gsm8k_env("openai/gsm8k", 1, 2, 1, 5, True, None, batch_size=2, chat_template_name="chatml")
    assert len(env.primer.source) == 7473
    out = env.reset_batch()
    assert out.batch_size[0] == 4 and out["group_id"] == [0, 0, 1, 1]
    assert len(make_gsm8k_env(split="test").primer.source) == 1319  # seed=None (TorchRL's default): a random order


def test_the_parser_and_the_question_are_torchrls_tensordict_transforms():
    """``GSM8KRewardParser`` and ``GSM8KPrepareQuestion`` are TensorDict ``Transform``s, as in TorchRL: TorchRL's
    ``in_keys`` once appended, the reward spec's ``(B, 1, 1)`` entries, the prepared question in a text-mode
    ``reset(td)`` (the conversations are lent to the transforms and the prompt text rendered again), TorchRL's text
    step scored under ``"next"``, and a subclass that overrides ``_step`` changes what the list calls pay."""
    from tensordict import TensorDict

    from llmrl_core.envs import Transform

    rows = [{"question": "What is 2 + 2?", "answer": "so #### 4"}, {"question": "What is 3 + 3?", "answer": "#### 6"}]
    env = GSM8KEnv(rows, batch_size=2, input_mode="text", chat_template_name="chatml", shuffle=False)
    parser, prepare = env.td_transforms[-1], env.td_transforms[1]  # after the primer
    assert isinstance(parser, Transform) and isinstance(prepare, Transform)
    assert isinstance(parser, GSM8KRewardParser) and isinstance(prepare, GSM8KPrepareQuestion)
    assert parser.in_keys == [("text", "full"), "answer"] and parser.input_mode == "text"
    spec = env.full_reward_spec
    assert {"reward", "reward_answer", "reward_think", "reward_right", "success"} <= set(spec.keys())
    assert spec["reward"].shape == (*env.batch_size, 1, 1) and spec["success"].dtype == torch.bool

    reset = env.reset(TensorDict(batch_size=()))
    assert "history" not in reset.keys()  # text mode's layout: the conversations were only lent
    prompts = list(reset["text", "prompt"])
    assert all("put only the final number inside <answer></answer>" in p for p in prompts)
    assert "What is 2 + 2?" in prompts[0] and prompts[0].endswith("<|im_start|>assistant\n")
    step = env.step(reset.set(("text", "response"), ["<think>ok</think><answer>4</answer>", "<answer>7</answer>"]))
    nxt = step["next"]
    assert nxt["reward"].shape == (2, 1, 1) and nxt["reward"].flatten().tolist() == pytest.approx([1.0, 0.1])
    assert nxt["reward_think"].flatten().tolist() == [1.0, 0.0] and nxt["success"].flatten().tolist() == [True, False]
    assert nxt["terminated"].flatten().tolist() == [True, True] and nxt["done"].flatten().tolist() == [True, True]
    assert [slot.terminated and not slot.truncated for slot in env.slots] == [True, True]  # the answer, not the limit

    class Doubled(GSM8KRewardParser):
        def _step(self, tensordict, next_tensordict):
            next_tensordict = super()._step(tensordict, next_tensordict)
            return next_tensordict.set("reward", next_tensordict["reward"] * 2)

    env = GSM8KEnv(rows, batch_size=2, compute_reward=False, chat_template_name="chatml", shuffle=False)
    env.append_transform(Doubled())
    out = env.reset_batch()
    assert "<answer></answer>" in out["history", "prompt"][0][-1].content  # prepared on the list call too
    out = env.step(["<answer>4</answer>", "I do not know"])
    assert out["reward"].reshape(-1).tolist() == pytest.approx([2.0, 0.0])
    assert [info["success"] for info in out["info"]] == [True, False]
    assert out["reward_components"][0] == {"reward_answer": 1.0, "reward_think": 0.0, "reward_right": 1.0}
    assert out["terminated"].reshape(-1).tolist() == [True, False]
    assert out["truncated"].reshape(-1).tolist() == [False, True]


def test_a_partial_reset_prepares_the_new_questions_only():
    """TorchRL's ``step_and_maybe_reset`` on a two-turn GSM8K env: the answered row starts a new prepared question,
    the running row's conversation keeps its question templated once (the transforms see TorchRL's ``_reset``
    flags)."""
    from tensordict import TensorDict

    rows = [{"question": f"What is {n} + {n}?", "answer": f"#### {2 * n}"} for n in range(1, 5)]
    env = GSM8KEnv(rows, batch_size=2, max_steps=2, chat_template_name="chatml", shuffle=False)
    reset = env.reset(TensorDict(batch_size=()))
    first = [list(h.to_conversations()[0].messages) for h in (reset["history", "prompt"][i : i + 1] for i in range(2))]
    step, following = env.step_and_maybe_reset(reset.set(("text", "response"), ["<answer>2</answer>", "hmm"]))
    assert step["next", "done"].flatten().tolist() == [True, False]
    conversations = following["history", "prompt"].to_conversations()
    assert conversations[0].messages[-1].text.startswith("What is 3 + 3?")  # the next row, prepared
    assert conversations[0].messages[-1].text.count("<answer></answer>") == 1
    running = [m.text for m in conversations[1].messages]
    assert running[: len(first[1])] == [m.text for m in first[1]] and running[-1] == "hmm"
    assert sum(text.count("<answer></answer>") for text in running) == 1
    assert env.slots[0].history.messages[-1].text == conversations[0].messages[-1].text
