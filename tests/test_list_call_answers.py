"""llmrl's list calls (``reset(prompts)``, ``reset_slots``, ``step(answers)``) answer a TensorDict: TorchRL's layout
of every slot with llmrl's per-row entries (``tensordict_io.slots_view``), no dataclass."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDictBase

from llmrl_core.data.llm_data import LLMData
from llmrl_core.envs import ChatEnv
from llmrl_core.envs.tensordict_io import active_rows


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


ROWS = [
    {"query": "2+2?", "answer": "4", "key": 7},
    {"query": "3+3?", "answer": "6", "key": 8, "note": "only here"},
]


def _env(mode: str, tokenizer) -> ChatEnv:
    return ChatEnv(tokenizer=tokenizer, input_mode=mode, system_prompt="Be brief.", max_turns=2)


@pytest.mark.parametrize("mode", ["history", "text", "tokens"])
def test_a_list_call_answers_torchrls_layout_with_the_rows_entries(mode, tokenizer):
    env = _env(mode, tokenizer)
    out = env.reset(ROWS)
    assert isinstance(out, TensorDictBase) and out.batch_size == torch.Size([2])
    keys = set(out.keys(include_nested=True))
    prompt_keys = {("history", "prompt"), ("text", "prompt"), ("tokens", "prompt")} & keys
    assert (
        prompt_keys
        == {
            "history": {("history", "prompt")},
            "text": {("history", "prompt"), ("text", "prompt")},
            "tokens": {("history", "prompt"), ("text", "prompt"), ("tokens", "prompt")},
        }[mode]
    )
    for flag in ("done", "terminated", "truncated"):
        assert out[flag].shape == (2, 1) and out[flag].dtype == torch.bool and not out[flag].any()
    assert out["reward"].shape == (2, 1) and out["reward"].dtype == torch.float32
    assert out["turn"].tolist() == [0, 0] and out["sample_index"].tolist() == [0, 0]
    assert out["prompt_id"] == [0, 1] and out["group_id"] == [None, None]  # no GRPO group given
    assert out["answer"] == ["4", "6"] and out["key"].tolist() == [7, 8]
    assert out["note"] == [None, "only here"]  # a field some rows lack is None there
    assert out["info"][0] is env.slots[0].info  # the episode's own info dict
    assert out["history", "prompt"][1].role == ["system", "user"]
    assert out["history", "prompt"][1][-1].content == "3+3?"
    if mode == "tokens":
        ids = out.get(("tokens", "prompt"), as_list=True)
        assert [t.tolist() for t in ids] == [s.all_tokens().tolist() for s in env.slots]

    out = env.step(["4", "I think"])
    assert out["turn"].tolist() == [1, 1] and active_rows(out) == [0, 1]
    assert out["history", "prompt"][0].role == ["system", "user", "assistant"]
    assert out["history", "prompt"][0][-1].content == "4"
    assert out["reward_components"] == [{}, {}]

    out = env.step(["again", "6"])  # the turn limit ends both
    assert out["truncated"].flatten().tolist() == [True, True] and active_rows(out) == []


def test_reset_slots_answers_every_slot_and_llm_data_reads_the_answer(tokenizer):
    env = _env("tokens", tokenizer)
    env.reset(ROWS)
    out = env.reset_slots([1], [{"query": "new?", "answer": "x"}])
    assert out.batch_size == torch.Size([2]) and out["answer"] == ["4", "x"]
    assert out["history", "prompt"][1][-1].content == "new?"
    data = LLMData.from_tensordict(out)
    assert [c.messages[-1].text for c in data.history] == ["2+2?", "new?"]
    assert [t.tolist() for t in data.tokens] == [s.all_tokens().tolist() for s in env.slots]
    assert data.text == [s.prompt_text for s in env.slots]
    assert LLMData.from_tensordict(out, with_history=False).history is None
