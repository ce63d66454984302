"""LLMEnv (text/token completion env on ChatEnv) and LLMHashingEnv (hash-identified token chains)."""

from __future__ import annotations

import pytest
import torch

from llmrl_core.envs import DataLoadingPrimer, LLMEnv, LLMHashingEnv


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


def test_llm_env_text_mode_appends_and_stops_on_eos(tokenizer):
    env = LLMEnv(tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id)
    out = env.reset(["2+2=", "Hi"])
    assert out["text", "prompt"] == ["2+2=", "Hi"] and not out["done"].any()
    out = env.step(["4", " there"])
    assert out["text", "prompt"] == ["2+2=4", "Hi there"] and not out["done"].any()
    out = env.step(["<|im_end|>", "!"])
    assert out["done"].reshape(-1).tolist() == [True, False]
    assert out["terminated"].reshape(-1).tolist() == [True, False]
    out = env.step([None, "?"])  # a finished slot takes no action
    assert out["text", "prompt"] == ["2+2=4<|im_end|>", "Hi there!?"]
    # the conversation behind the observation: the prompt as the user's turn, each answer as the policy's
    assert out["history", "prompt"][1].role == ["user", "assistant", "assistant", "assistant"]


def test_llm_env_token_mode_keeps_ids_and_max_length(tokenizer):
    env = LLMEnv(from_text=False, tokenizer=tokenizer, eos_token_id=2, max_length=5)
    out = env.reset([torch.tensor([5, 6]), [7]])
    assert [t.tolist() for t in out.get(("tokens", "prompt"), as_list=True)] == [[5, 6], [7]]
    out = env.step([torch.tensor([8, 2]), torch.tensor([9])])
    assert [t.tolist() for t in out.get(("tokens", "prompt"), as_list=True)] == [[5, 6, 8, 2], [7, 9]]
    assert out["done"].reshape(-1).tolist() == [True, False]
    out = env.step([None, torch.tensor([10, 11, 12, 13])])
    assert out.get(("tokens", "prompt"), as_list=True)[1].tolist() == [7, 9, 10, 11, 12, 13]
    assert out["truncated"].reshape(-1).tolist() == [False, True]
    with pytest.raises(ValueError, match="needs a tokenizer"):
        LLMEnv(from_text=False)
    with pytest.raises(ValueError, match="eos_token_id is set but text actions come without tokens"):
        e = LLMEnv(eos_token_id=2)
        e.reset(["a"])
        e.step(["b"])


def test_llm_env_from_primer():
    primer = DataLoadingPrimer([{"query": "a"}, {"query": "b"}], batch_size=2, shuffle=False)
    env = LLMEnv(primer=primer, str_key="query")
    assert env.reset_batch()["text", "prompt"] == ["a", "b"]


def test_llm_env_from_an_endless_loader_as_torchrl():
    """TorchRL's ``LLMEnv.from_dataloader`` over an endless iterator of string batches (never materialised); an
    empty TensorDict reset draws the next prompts and fills it in TorchRL's layout."""
    from tensordict import TensorDict

    class Words:
        def __init__(self):
            self.n = 0

        def __iter__(self):
            return self

        def __next__(self):
            self.n += 1
            return [f"w{self.n}"]

    loader = Words()
    env = LLMEnv.from_dataloader(loader, batch_size=2, repeats=2)  # group_repeats=True: 2 prompts x 2 copies
    assert env.batch_size == (4,) and loader.n == 0
    out = env.reset_batch()
    assert out["text", "prompt"] == ["w1", "w1", "w2", "w2"] and out["group_id"] == [0, 0, 1, 1] and loader.n == 2
    td = env.reset(TensorDict())
    assert td.batch_size == (4,) and td["text"].prompt == ["w3", "w3", "w4", "w4"]
    assert "history" not in td.keys()  # a text-mode env hands out the text prompt only, as TorchRL's
    assert env.slots[0].history.messages[0].role == "user"
    with pytest.raises(ValueError, match="primers= takes TorchRL specs"):
        LLMEnv.from_dataloader(loader, primers={"x": 1})


def position_weighted_sum(x: torch.Tensor) -> torch.Tensor:
    """The probe's deterministic hashing module (``scripts/torchrl_goldens.py``): entries times their position."""
    return (x.long() * torch.arange(1, x.shape[-1] + 1)).sum(-1)


def test_hashing_env_matches_torchrls(tokenizer):
    """TorchRL 0.14.1's ``LLMHashingEnv`` on the same ids (``api_probes.json`` ``hashing_env``): the reset's and the
    step's keys, shapes, dtypes, text and ids; the hashes equal with the same hashing module."""
    import json
    from pathlib import Path

    from tensordict import TensorDict

    golden = json.loads((Path(__file__).parent / "goldens/torchrl/api_probes.json").read_text())["hashing_env"]
    ids = torch.tensor(golden["prompt"])
    assert ids.tolist() == tokenizer(["Check out TorchRL!", "Well, hello there you!"])["input_ids"]

    def layout(td):
        return {str(k): [list(td[k].shape), str(td[k].dtype)] for k in sorted(td.keys(True, True), key=str)}

    for label, kwargs in (("weighted", {"hashing_module": position_weighted_sum}), ("default", {})):
        env = LLMHashingEnv(tokenizer=tokenizer, **kwargs)
        assert env.vocab_size == tokenizer.vocab_size
        reset = env.reset(TensorDict(observation=ids, batch_size=[2]))
        stepped = env.step(reset.clone().set("action", torch.tensor([[28], [29]])))
        expected = golden[label]
        assert sorted(reset.keys()) == expected["reset_keys"] and layout(reset) == expected["reset_layout"]
        assert list(reset["text"]) == expected["reset_text"]
        assert sorted(stepped["next"].keys()) == expected["step_next_keys"]
        assert layout(stepped["next"]) == expected["step_layout"]
        assert list(stepped["next", "text"]) == expected["step_text"]
        assert stepped["next", "observation"].tolist() == expected["step_observation"]
        if label == "weighted":
            assert reset["hashing"].tolist() == expected["reset_hashing"]
            assert stepped["next", "hashing"].tolist() == expected["step_hashing"]


def test_hashing_env_default_hash_is_stable_and_tells_chains_apart(tokenizer):
    from tensordict import TensorDict

    from llmrl_core.envs.hashing_env import blake2b_rows

    env = LLMHashingEnv(tokenizer=tokenizer)
    prompt = torch.tensor([tokenizer("Check out llmrl", add_special_tokens=False)["input_ids"]] * 2)
    reset = env.reset(TensorDict(observation=prompt, batch_size=[2]))
    assert reset["hashing"][0] == reset["hashing"][1]  # same ids, same hash
    stepped = env.step(reset.set("action", torch.tensor([[5], [6]])))
    assert stepped["next", "hashing"][0] != stepped["next", "hashing"][1]  # different token, different hash
    # by hand: BLAKE2b-64 of [previous hash, token] as int64 bytes
    import hashlib

    row = torch.tensor([int(reset["hashing"][0]), 5], dtype=torch.int64).numpy().tobytes()
    by_hand = int.from_bytes(hashlib.blake2b(row, digest_size=8).digest(), "little", signed=True)
    assert int(stepped["next", "hashing"][0]) == by_hand == int(blake2b_rows(torch.tensor([[reset["hashing"][0], 5]])))
    single = env.make_tensordict("Check out llmrl")
    assert single.batch_size == () and single["hashing"].shape == (1,) and single["text"] == "Check out llmrl"
    assert int(single["hashing"]) == int(reset["hashing"][0])


def test_hashing_env_errors():
    from tensordict import TensorDict

    with pytest.raises(TypeError, match="vocab_size integer if tokenizer is `None`"):
        LLMHashingEnv()
    env = LLMHashingEnv(10)  # text_output=True without a tokenizer fails when there is text to decode
    with pytest.raises(ValueError, match="needs a tokenizer"):
        env.reset(TensorDict(observation=torch.tensor([[1, 2]]), batch_size=[1]))
    quiet = LLMHashingEnv(10, text_output=False)
    reset = quiet.reset(TensorDict(observation=torch.tensor([[1, 2]]), batch_size=[1]))
    assert "text" not in reset.keys()
    with pytest.raises(RuntimeError, match="requires a prompt"):
        quiet.reset(TensorDict(batch_size=[1]))
    with pytest.raises(KeyError, match="no 'action'"):
        quiet.step(reset)


def test_as_llm_data_is_refused_by_name():
    LLMEnv(as_llm_data=False)  # TorchRL's default, accepted
    with pytest.raises(ValueError, match=r"as_llm_data=True\) .* is not supported"):
        LLMEnv(as_llm_data=True)
