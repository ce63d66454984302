"""``env.rewards``' functions as the TensorDict transform ``RewardFunctions``: called once per episode, when it
ends, with the question the episode answers (not an earlier user turn of its prompt), its last answer and the row;
``env_reward: false`` replaces the env's reward and its parts; a per-token reward takes the functions' value on its
last token; TorchRL's TensorDict call in tokens mode pays too."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from llmrl_core.data.tensor_specs import Unbounded
from llmrl_core.envs import ChatEnv, GSM8KRewardParser, Transform
from llmrl_core.pipeline.env_config import RewardFunctionConfig
from llmrl_core.pipeline.reward_functions import RewardFunctions

CALLS: list[tuple[str, str, dict]] = []


def record(prompt, completion, row):
    CALLS.append((prompt, completion, dict(row)))
    return float(len(completion))


@pytest.fixture(autouse=True)
def _fresh_calls():
    CALLS.clear()


def _functions(**kwargs) -> RewardFunctions:
    return RewardFunctions([RewardFunctionConfig(function=f"{__name__}:record", weight=0.5, name="len")], **kwargs)


def test_paid_once_at_the_episode_end_with_the_question_it_answers():
    env = ChatEnv(chat_template_name="chatml", max_turns=2, batch_size=2).append_transform(_functions())
    assert isinstance(env.td_transforms[0], Transform)
    shown = [{"role": "user", "content": "example q"}, {"role": "assistant", "content": "example a"}]
    env.reset(
        [
            {"query": [*shown, {"role": "user", "content": "real q"}], "answer": "x"},
            {"query": "plain q", "answer": "y"},
        ]
    )
    out = env.step(["first", "one"])
    assert CALLS == [] and out["reward"].reshape(-1).tolist() == [0.0, 0.0] and out["reward_components"] == [{}, {}]
    out = env.step(["second!", "two"])  # the turn limit ends both episodes: the functions pay now
    assert [(p, c, r["answer"]) for p, c, r in CALLS] == [("real q", "second!", "x"), ("plain q", "two", "y")]
    assert out["reward"].reshape(-1).tolist() == [3.5, 1.5]
    assert out["reward_components"] == [{"len": 3.5}, {"len": 1.5}]
    assert [s.episode_reward for s in env.slots] == [3.5, 1.5]


def test_without_the_env_reward_only_the_functions_pay():
    kept = ChatEnv(chat_template_name="chatml", max_turns=1, batch_size=1)
    kept.append_transform(GSM8KRewardParser()).append_transform(_functions())
    dropped = ChatEnv(chat_template_name="chatml", max_turns=1, batch_size=1)
    dropped.append_transform(GSM8KRewardParser()).append_transform(_functions(keep_env_reward=False))
    rows = [{"query": "2+2?", "answer": "#### 4"}]
    answer = ["<answer>4</answer>"]
    kept.reset(rows)
    dropped.reset(rows)
    paid_too, only = kept.step(answer), dropped.step(answer)
    function = 0.5 * len("<answer>4</answer>")
    assert paid_too["reward"].reshape(-1).tolist() == [pytest.approx(1.0 + function)]
    parts = paid_too["reward_components"][0]
    assert parts["reward_right"] == 1.0 and parts["len"] == function
    assert only["reward"].reshape(-1).tolist() == [pytest.approx(function)]
    assert only["reward_components"] == [{"len": function}]
    assert only["done"].reshape(-1).tolist() == [True]  # the parser still ends and judges
    assert only["info"][0]["success"] is True


def test_a_per_token_reward_takes_the_functions_value_on_its_last_token():
    class PerToken(Transform):
        def transform_reward_spec(self, reward_spec):
            reward_spec["reward"] = Unbounded(shape=(*reward_spec.shape, 1))
            return reward_spec

        def _step(self, tensordict, next_tensordict):
            return next_tensordict.set("reward", torch.full((next_tensordict.batch_size[0], 3, 1), 0.25))

    env = ChatEnv(chat_template_name="chatml", max_turns=1, batch_size=1)
    env.append_transform(PerToken()).append_transform(_functions())
    td = env.reset(TensorDict({"query": ["q"]}, batch_size=(1,)))
    reward = env.step(td.set("text_response", ["abcd"]))["next", "reward"]
    assert reward.shape == (1, 3, 1) and reward.flatten().tolist() == [0.25, 0.25, 0.25 + 2.0]


def test_torchrls_call_in_tokens_mode_pays(default_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    env = ChatEnv(tokenizer=tokenizer, input_mode="tokens", max_turns=1, batch_size=(2,))
    env.append_transform(_functions())
    assert env.full_reward_spec["reward"].shape == (2, 1)
    td = env.reset(TensorDict({"query": ["q1", "q2"], "answer": ["a", "b"]}, batch_size=(2,)))
    nxt = env.step(td.set("text_response", ["abc<|im_end|>", "a<|im_end|>"]))["next"]
    assert nxt["reward"].tolist() == [[1.5], [0.5]] and nxt["done"].all()
    assert [(p, c, r["answer"]) for p, c, r in CALLS] == [("q1", "abc", "a"), ("q2", "a", "b")]
