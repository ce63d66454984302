"""ChatEnv's TensorDict door (TorchRL's calls): reset from a TensorDict of queries, step from a TensorDict of
answers, TorchRL's keys and shapes, and the documented errors."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from llmrl_core.collectors import LLMCollector
from llmrl_core.collectors.tensordict_batches import rows as episodes
from llmrl_core.data import History, LLMData
from llmrl_core.data.tensor_specs import Unbounded
from llmrl_core.envs import ChatEnv
from llmrl_core.envs.transforms.td_base import Transform as TensorDictTransform
from llmrl_core.modules.policies import ChatHistory
from tests.torchrl_layout_probes import (
    env_specs,
    ifeval_scorer_layout,
    library,
    reset_layout,
    reward_parser_done,
    reward_parser_layout,
    step_layout,
    template_choice,
    tool_transform_turns,
)

SYSTEM = "You are a helpful assistant."


def test_reset_gives_torchrl_layout():
    env = ChatEnv(system_prompt=SYSTEM, input_mode="history", batch_size=(2,))
    obs = env.reset(TensorDict({"query": ["Hello", "Bye"]}, batch_size=(2,)))
    assert obs.batch_size == torch.Size([2])
    assert obs["done"].shape == (2, 1) and obs["done"].dtype == torch.bool and not obs["done"].any()
    assert obs["terminated"].shape == (2, 1) and "truncated" not in obs.keys()
    prompt = obs["history"].prompt
    assert isinstance(prompt, History) and prompt.shape == torch.Size([2, 2])
    assert list(prompt[1].content) == [SYSTEM, "Bye"] and list(prompt[0].role) == ["system", "user"]
    assert list(obs["query"]) == ["Hello", "Bye"]


def test_step_with_full_history_continues_the_conversation():
    env = ChatEnv(system_prompt=SYSTEM, input_mode="history")
    obs = env.reset(TensorDict({"query": "Hello, how are you?"}, batch_size=(1,)))
    full = obs["history"].prompt.append(
        History(role=["assistant"], content=["Fine, thanks."], batch_size=(1,)), inplace=False
    )
    stepped = env.step(obs.set("history", ChatHistory(prompt=obs["history"].prompt, full=full, batch_size=(1,))))
    nxt = stepped["next"]
    assert "reward" not in nxt.keys() and "truncated" not in nxt.keys()  # as TorchRL's: no reward source, no limit
    assert list(nxt["history"].prompt[0].role) == ["system", "user", "assistant"]
    assert list(nxt["history"].prompt[0].content)[-1] == "Fine, thanks."


def test_step_with_a_bare_history_as_the_docs_show():
    env = ChatEnv(system_prompt=SYSTEM, input_mode="history")
    env.reset(TensorDict({"query": "Hello, how are you?"}, batch_size=(1,)))
    chat = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hello, how are you?"},
        {"role": "assistant", "content": "I'm doing well, thank you!"},
    ]
    next_obs = env.step(TensorDict({"history": History.from_chats([chat])}, batch_size=(1,)))
    assert list(next_obs["history"].prompt[0].content) == [m["content"] for m in chat]
    assert list(next_obs["next", "history"].prompt[0].role) == ["system", "user", "assistant"]


def test_text_mode_renders_the_prompt(default_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    env = ChatEnv(system_prompt=SYSTEM, input_mode="text", tokenizer=tokenizer, batch_size=[1])
    obs = env.reset(TensorDict({"query": ["Hi"]}, batch_size=(1,)))
    assert obs["text"].prompt[0].endswith("Hi<|im_end|>\n<|im_start|>assistant\n")
    stepped = env.step(obs.set(("text", "response"), ["Hello!"]))
    assert stepped["next", "text"].prompt[0].count("Hello!") == 1


def test_tokens_mode_gives_ragged_prompt_ids(default_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    env = ChatEnv(system_prompt=SYSTEM, input_mode="tokens", tokenizer=tokenizer, batch_size=(2,))
    obs = env.reset(TensorDict({"query": ["Hi", "What is the capital of France?"]}, batch_size=(2,)))
    ids = obs.get(("tokens", "prompt"), as_list=True)
    assert [len(i) for i in ids][0] < [len(i) for i in ids][1]
    rendered = [tokenizer.decode(i) for i in ids]
    assert rendered[1].endswith("What is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    assert rendered == [slot.prompt_text for slot in env.slots]
    assert "text" not in obs.keys() and "history" not in obs.keys()  # TorchRL: the tokens-mode prompt only


@pytest.mark.parametrize("pad_output", [False, True])
def test_a_tokens_mode_policy_steps_the_env_with_its_exact_ids(hf_model_fp32, pad_output):
    """A tokens-mode ``TransformersWrapper`` writes only ``("tokens", "response")`` (no text): the env decodes it and
    the next prompt's ids are the prompt's, then the sampled ids as they are (padding removed), then the template's
    glue. (TorchRL 0.14.1's own ChatEnv fails at this reset: "Failed to stack tensors within a tensordict".)"""
    from llmrl_core.modules import TransformersWrapper

    model, tokenizer = hf_model_fp32
    env = ChatEnv(system_prompt=SYSTEM, input_mode="tokens", tokenizer=tokenizer, batch_size=(2,))
    obs = env.reset(TensorDict({"query": ["Hi", "What is the capital of France?"]}, batch_size=(2,)))
    prompts = [p.clone() for p in obs.get(("tokens", "prompt"), as_list=True)]
    policy = TransformersWrapper(
        model,
        tokenizer=tokenizer,
        input_mode="tokens",
        generate=True,
        return_log_probs=True,
        pad_output=pad_output,
        generate_kwargs={"max_new_tokens": 5, "do_sample": False},
    )
    out = env.step(policy(obs))
    sampled = out.get(("tokens", "response"), as_list=True)
    following = out.get(("next", "tokens", "prompt"), as_list=True)
    for prompt, ids, nxt in zip(prompts, sampled, following, strict=True):
        ids = ids[ids.ne(tokenizer.pad_token_id)] if pad_output else ids
        assert nxt[: len(prompt)].tolist() == prompt.tolist()
        assert nxt[len(prompt) : len(prompt) + len(ids)].tolist() == ids.tolist()
        answer = tokenizer.decode(ids.tolist(), skip_special_tokens=True)
    assert env.slots[-1].history.messages[-1].content == answer


def test_an_answer_marked_incomplete_stays_incomplete():
    """TorchRL's next prompt is the action's ``("history", "full")`` as it is: a last message marked
    ``is_complete=False`` (cut by the token limit) keeps that mark."""
    env = ChatEnv(system_prompt=SYSTEM, batch_size=(1,))
    obs = env.reset(TensorDict({"query": ["Count to ten."]}, batch_size=(1,)))
    chat = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Count to ten."},
        {"role": "assistant", "content": "One, two, thr", "is_complete": False},
    ]
    obs.set("history", ChatHistory(prompt=obs["history"].prompt, full=History.from_chats([chat]), batch_size=(1,)))
    out = env.step(obs)
    assert list(out["next", "history"].prompt[0].is_complete) == [True, True, False]


def test_torchrl_argument_errors():
    with pytest.raises(ValueError, match="at least one dimension"):
        ChatEnv(batch_size=())
    env = ChatEnv(system_prompt=SYSTEM, batch_size=torch.Size([1]), device="cpu")
    assert env.batch_size == (1,) and env.device == torch.device("cpu")
    with pytest.raises(KeyError, match="'query'"):
        env.reset(TensorDict({"prompt": ["x"]}, batch_size=(1,)))
    env.reset(TensorDict({"query": ["x"]}, batch_size=(1,)))
    with pytest.raises(KeyError, match="no answer found"):
        env.step(TensorDict({}, batch_size=(1,)))


def test_tensordict_transforms_run_on_the_tensordict_calls():
    """A TorchRL TensorDict transform appended to a ChatEnv runs as in a TransformedEnv: ``_reset`` on reset(td),
    ``_inv_call`` on the action, ``_step`` on the "next" data; the list calls run ``_reset`` and ``_step``."""
    calls = []

    class Tag(TensorDictTransform):
        def _reset(self, tensordict, tensordict_reset):
            calls.append("reset")
            return tensordict_reset.set("tag", torch.ones(tensordict_reset.batch_size[0], 1))

        def _inv_call(self, tensordict):
            calls.append("inv")
            return tensordict

        def _step(self, tensordict, next_tensordict):
            calls.append("step")
            zero = torch.zeros(next_tensordict.batch_size[0], 1)  # a bare env writes no reward (TorchRL's)
            return next_tensordict.set("reward", next_tensordict.get("reward", zero) + 1)

    tag = Tag()
    env = ChatEnv(batch_size=(2,)).append_transform(tag)
    assert tag.parent is env and env.td_transforms == [tag]
    obs = env.reset(TensorDict({"query": ["a", "b"]}, batch_size=(2,)))
    assert obs["tag"].shape == (2, 1)
    action = obs.clone()
    action.set("text_response", ["x", "y"])
    out = env.step(action)
    assert calls == ["reset", "inv", "step"] and out["next", "reward"].tolist() == [[1.0], [1.0]]

    # the list calls (the collector's and the flows') run the same hooks once each: no _inv_call (the answers are
    # given), the reward written back becomes the slots' and is kept as the transform's component
    calls.clear()
    env.reset(["a", "b"])
    out = env.step(["x", "y"])
    assert calls == ["reset", "step"] and out["reward"].reshape(-1).tolist() == [1.0, 1.0]
    assert out["reward_components"] == [{"Tag": 1.0}, {"Tag": 1.0}]
    calls.clear()  # TorchRL's step_and_maybe_reset: each hook once (the inner partial reset adds no second _reset)
    env.step_and_maybe_reset(TensorDict({"text_response": ["x", "y"]}, batch_size=(2,)))
    assert calls == ["inv", "step", "reset"]


class AnswerCheck(TensorDictTransform):
    """A TorchRL user's reward: 1 when the answer equals the row's ``answer`` field, which ends the episode;
    -0.01 per character of the answer's text otherwise (reads ``("history", "response")`` and ``("text", ...)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict] = []

    def _step(self, tensordict, next_tensordict):
        answers = [h.to_messages()[-1].text for h in tensordict["history"].response.unbind(0)]
        expected = tensordict.get("answer").tolist()
        text = tensordict.get(("text", "response"), None)  # text-mode envs only
        self.seen.append({"answers": answers, "text": None if text is None else text.tolist()})
        right = torch.tensor([[a == e] for a, e in zip(answers, expected, strict=True)])
        penalty = torch.tensor([[-0.01 * len(a)] for a in answers])
        reward = next_tensordict.get("reward", torch.zeros(len(answers), 1))  # none from a bare env, as TorchRL's
        next_tensordict.set("reward", reward + torch.where(right, 1.0, penalty))
        next_tensordict.set("terminated", next_tensordict["terminated"] | right)
        return next_tensordict.set("done", next_tensordict["done"] | right)


def test_the_ported_torchrl_import_of_transform_is_torchrls_transform():
    """``from torchrl.envs import Transform, Compose`` ported by the import rule gives TorchRL's TensorDict transform:
    a subclass's ``_step`` runs on the env's step; it is the one kind of env transform. A subclass that defines the
    hooks of llmrl's former per-conversation transforms (``step_slot``, ``on_step``, ...) is refused with the fix,
    not silently skipped."""
    import llmrl_core.envs as envs
    import llmrl_core.envs.transforms as transforms

    assert envs.Transform is transforms.Transform is TensorDictTransform
    assert envs.Compose is transforms.Compose
    with pytest.raises(AttributeError):
        envs.NoSuchName  # noqa: B018

    class Double(envs.Transform):
        def _step(self, tensordict, next_tensordict):
            return next_tensordict.set("reward", torch.full((next_tensordict.batch_size[0], 1), 2.0))

    env = ChatEnv(batch_size=(1,)).append_transform(envs.Compose(Double()))
    obs = env.reset(TensorDict({"query": ["a"]}, batch_size=(1,)))
    out = env.step(obs.clone().set("text_response", ["x"]))
    assert out["next", "reward"].tolist() == [[2.0]]

    class OldStyle(envs.Transform):
        def step_slot(self, slot):
            slot.add_reward(1.0)

    with pytest.raises(TypeError, match=r"OldStyle defines step_slot: .*Write it as TorchRL's Transform: _step"):
        ChatEnv(batch_size=(1,)).append_transform(OldStyle())
    with pytest.raises(TypeError, match=r"expects a Transform \(TorchRL's TensorDict transform\), got object"):
        ChatEnv(batch_size=(1,)).append_transform(object())


def test_a_tensordict_reward_transform_rewards_and_ends_episodes_under_the_collector():
    """LLMCollector steps the env with list calls: a TorchRL-style ``_step`` transform still decides the reward and
    when an episode ends, with the prompt row's fields beside the answer."""
    check = AnswerCheck()
    env = ChatEnv(batch_size=2, chat_template_name="chatml", max_turns=3).append_transform(check)
    replies = iter([["7", "no"], ["4"]])

    def policy(data: LLMData) -> LLMData:
        text = next(replies)
        return LLMData(text_response=text, finish_reasons=["stop"] * len(text))

    prompts = [{"query": "3+4?", "answer": "7"}, {"query": "2+2?", "answer": "4"}]
    collector = LLMCollector(env, policy, prompts=prompts, total_trajectories=2, rolling_reset=True)
    trajectories = sorted(episodes(collector.collect()), key=lambda t: t.data["query"])
    assert [(t.data["query"], t.num_turns, round(t.reward, 4)) for t in trajectories] == [
        ("2+2?", 2, round(-0.02 + 1.0, 4)),
        ("3+4?", 1, 1.0),
    ]
    assert check.seen[0] == {"answers": ["7", "no"], "text": ["7", "no"]}
    assert check.seen[1]["answers"] == ["4"]  # only the slot still running is stepped


def test_what_a_tensordict_transform_writes_on_step_td_becomes_the_slots():
    """TorchRL's own call, ``step(td)``: the reward and end flags a ``_step`` transform writes under "next" are the
    env's too (its slots' reward, components and done), as on the list calls; a row done before the step keeps
    its state."""
    check = AnswerCheck()
    env = ChatEnv(batch_size=(2,), chat_template_name="chatml", max_turns=3).append_transform(check)

    def answered(td, texts):  # what a history-mode policy writes: ("history", "prompt"/"response"/"full")
        prompt = td["history"].prompt
        full = prompt.append(History(role=["assistant"] * 2, content=texts, batch_size=(2,)), inplace=False)
        return td.set("history", ChatHistory(prompt=prompt, response=full[..., -1:], full=full, batch_size=(2,)))

    td = env.reset(TensorDict({"query": ["3+4?", "2+2?"], "answer": ["7", "4"]}, batch_size=(2,)))
    out = env.step(answered(td, ["7", "no"]))
    assert out["next", "reward"].flatten().tolist() == pytest.approx([1.0, -0.02])
    assert out["next", "done"].tolist() == [[True], [False]]
    right, wrong = env.slots
    assert right.done and right.reward == 1.0 and right.reward_components == {"AnswerCheck": 1.0}
    assert not wrong.done and wrong.reward == pytest.approx(-0.02) and wrong.episode_reward == pytest.approx(-0.02)
    nxt = out["next"].clone().set("answer", td["answer"])  # the row's field, carried over as step_mdp does
    env.step(answered(nxt, ["ignored", "4"]))
    assert right.episode_reward == 1.0 and right.turn == 1
    assert wrong.done and wrong.episode_reward == pytest.approx(0.98)
    assert wrong.reward_components == {"AnswerCheck": 1.0}


class Pays(TensorDictTransform):
    """A reward source: adds ``amount`` to every row's reward (kept as the reward part ``name`` when given). It
    declares ``reward`` in its reward spec, so the env's step data carries one (a bare env's has none)."""

    def __init__(self, amount: float = 0.0, name: str | None = None) -> None:
        super().__init__()
        self.amount, self.name = amount, name

    def transform_reward_spec(self, reward_spec):
        reward_spec["reward"] = Unbounded(shape=(*reward_spec.shape, 1))
        return reward_spec

    def _step(self, tensordict, next_tensordict):
        if self.name is not None:
            for i in range(next_tensordict.batch_size[0]):
                self._note_row(i, reward_components={self.name: self.amount})
        return next_tensordict.set("reward", next_tensordict["reward"] + self.amount)


def ZeroReward() -> Pays:  # noqa: N802 (reads as the class it makes)
    """A reward source that pays 0: the env's step data then carries a ``reward`` (a bare env's has none)."""
    return Pays(0.0)


def test_a_per_token_reward_counts_as_its_sum_and_a_lost_reward_is_named():
    class PerToken(TensorDictTransform):
        def _step(self, tensordict, next_tensordict):
            return next_tensordict.set("reward", torch.full((next_tensordict.batch_size[0], 3, 1), 0.5))

    env = ChatEnv(batch_size=1, chat_template_name="chatml", max_turns=1).append_transform(PerToken())
    env.reset(["q"])
    assert env.step(["a"])["reward"].reshape(-1).tolist() == [1.5]

    class Drops(TensorDictTransform):
        def _step(self, tensordict, next_tensordict):
            return next_tensordict.exclude("reward")

    env = ChatEnv(batch_size=1, chat_template_name="chatml").append_transform(ZeroReward()).append_transform(Drops())
    env.reset(["q"])
    with pytest.raises(KeyError, match="no 'reward' after Drops._step"):
        env.step(["a"])


def test_retrieve_kl_appended_to_a_chat_env(hf_model_fp32):
    """TorchRL's RetrieveKL inside the env: the step's "next" data carries the per-token KL (0 here: the same
    weights generate and score)."""
    from llmrl_core.envs.transforms.kl import RetrieveKL
    from llmrl_core.modules import TransformersWrapper

    model, tokenizer = hf_model_fp32
    gen = TransformersWrapper(
        model, tokenizer=tokenizer, generate=False, pad_output=True, log_probs_key="gen_log_probs"
    )
    ref = TransformersWrapper(
        model, tokenizer=tokenizer, generate=False, pad_output=True, log_probs_key="ref_log_probs"
    )
    env = ChatEnv(batch_size=(2,), tokenizer=tokenizer)
    env.append_transform(RetrieveKL(gen, ref, assistant_only=True, tokenizer=tokenizer, add_to_reward=False))
    obs = env.reset(TensorDict({"query": ["What is 2+3?", "Name a colour."]}, batch_size=(2,)))
    policy = TransformersWrapper(
        model, tokenizer=tokenizer, input_mode="history", generate=True, generate_kwargs={"max_new_tokens": 6}
    )
    out = env.step(policy(obs))
    kl = out["next", "kl_penalty"]
    assert kl.shape[0] == 2 and kl.ndim == 2 and float(kl.abs().max()) < 1e-4


def test_a_reward_widened_to_tokens_changes_the_slot_by_the_per_token_differences():
    """A transform that spreads the answer's reward over its tokens and takes a penalty from each (as TorchRL's KL
    transforms do: reward - coeff * kl per token) changes the slot's reward by the sum of those differences, not by
    the number of tokens times the reward; what it adds to the "next" data is kept per slot."""

    class PerToken(TensorDictTransform):
        def _step(self, tensordict, next_tensordict):
            reward = next_tensordict["reward"]  # (B, 1): one value per answer
            penalty = torch.full((reward.shape[0], 3), 0.1)
            next_tensordict.set("penalty", penalty)
            return next_tensordict.set("reward", (reward - penalty).unsqueeze(-1))  # per token: (B, 3, 1)

    env = ChatEnv(batch_size=2, chat_template_name="chatml").append_transform(Pays(1.0, "answer"))
    env.append_transform(PerToken())
    env.reset(["q1", "q2"])
    out = env.step(["a", "b"])
    assert out["reward"].reshape(-1).tolist() == pytest.approx([0.7, 0.7])
    assert out["reward_components"][0] == pytest.approx({"answer": 1.0, "PerToken": -0.3})
    assert env.slots[1].episode_reward == pytest.approx(0.7)
    assert [slot.next_fields["penalty"].tolist() for slot in env.slots] == [pytest.approx([0.1] * 3)] * 2
    assert out["penalty"].tolist() == [pytest.approx([0.1] * 3)] * 2


@pytest.mark.parametrize("gen", ["wrapper", "from_collector"])
def test_retrieve_kl_in_a_collectors_env_hands_out_the_kl_and_takes_it_from_the_reward(hf_model_fp32, gen):
    """TorchRL's RetrieveKL (its default add_to_reward=True) in the env of an LLMCollector: every dialog-turn row
    carries the per-token ("next", "kl_penalty") and the ref log-probs, and the row's reward is the answer's reward
    minus the summed KL (0 - sum(kl) here: the env's reward source pays 0; with no reward entry at all, TorchRL's
    KL transforms, and llmrl's, leave the reward out and only write the KL). With ``gen_model="from_collector"`` (its
    default) the scoring copy of the policy comes from the collector the env was registered with. TorchRL 0.14.1's
    own collector refuses this env (its spec check does not know ("log_probs", "full"); "The collector is not set"
    with "from_collector"); RetrieveKL's documentation is the spec."""
    import copy

    from llmrl_core.envs.transforms.kl import RetrieveKL
    from llmrl_core.modules import TransformersWrapper

    model, tokenizer = hf_model_fp32
    ref_model = copy.deepcopy(model)
    with torch.no_grad():
        ref_model.model.norm.weight.mul_(1.05)  # another model: the KL is not 0
    env = ChatEnv(batch_size=2, tokenizer=tokenizer, system_prompt="Be brief.", max_turns=1)
    env.append_transform(ZeroReward())
    env.append_transform(
        RetrieveKL(
            TransformersWrapper(model, tokenizer=tokenizer, generate=False, pad_output=False)
            if gen == "wrapper"
            else "from_collector",
            TransformersWrapper(
                ref_model, tokenizer=tokenizer, generate=False, pad_output=False, log_probs_key="ref_log_probs"
            ),
            assistant_only=True,
            tokenizer=tokenizer,
        )
    )
    rows = [{"query": "What is 2+3?"}, {"query": "Name a colour."}]
    policy = TransformersWrapper(
        model, tokenizer=tokenizer, input_mode="history", generate=True, generate_kwargs={"max_new_tokens": 5}
    )
    collector = LLMCollector(env, policy=policy, prompts=rows, dialog_turns_per_batch=2, total_dialog_turns=2)
    assert env.collector is collector and policy.collector is collector
    batch = next(iter(collector))
    assert batch.batch_size == (2, 1)  # (env slots, steps), as TorchRL's collector hands dialog turns out
    batch = batch.view(-1)
    for i in range(2):
        kl = batch[i]["next", "kl_penalty"]
        assert kl.ndim == 1 and kl.abs().sum() > 1e-4  # per token of the whole conversation, 0 off the answer
        assert batch[i]["next", "ref_log_probs", "full"].shape == kl.shape
        reward = float(batch[i]["next", "reward"].sum())
        assert reward == pytest.approx(-float(kl.sum()), abs=1e-4)
        assert batch[i]["reward_components"] == pytest.approx({"RetrieveKL": reward}, abs=1e-6)


def test_an_episode_a_tensordict_transform_ends_keeps_no_next_prompt_ids(default_model_path):
    """Tokens mode: ended by a TensorDict transform or by the turn limit, an episode's ids end with the sampled ids
    (the template's glue for a next turn is not kept)."""
    from transformers import AutoTokenizer

    from llmrl_core.data.llm_data import Response

    class Stop(TensorDictTransform):
        def _step(self, tensordict, next_tensordict):
            next_tensordict.set("terminated", torch.ones_like(next_tensordict["terminated"]))
            return next_tensordict.set("done", torch.ones_like(next_tensordict["done"]))

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    ids = tokenizer("Hello<|im_end|>", add_special_tokens=False)["input_ids"]
    ends = []
    for env in (
        ChatEnv(tokenizer=tokenizer, input_mode="tokens", max_turns=1),
        ChatEnv(tokenizer=tokenizer, input_mode="tokens", max_turns=5).append_transform(Stop()),
    ):
        env.reset(["Hi"])
        out = env.step([Response("Hello<|im_end|>", token_ids=ids, log_probs=[-0.1] * len(ids), finish_reason="stop")])
        prompt_ids = out.get(("tokens", "prompt"), as_list=True)[0]
        assert out["done"].reshape(-1).tolist() == [True] and prompt_ids[-len(ids) :].tolist() == ids
        ends.append((prompt_ids.tolist(), out["text", "prompt"][0], env.slots[0].segment_is_policy))
    assert ends[0] == ends[1]


def test_a_bare_reset_answers_torchrls_tensordict(default_model_path):
    """``env.reset()`` (TorchRL's call on an env fed by a DataLoader) returns a TensorDict laid out as TorchRL
    0.14.1's (``api_probes.json`` ``reset_layout``, recorded by ``scripts/torchrl_goldens.py``): the same keys (the
    prompt only in the env's input mode), batch size, ``done``/``terminated`` shapes and dtypes, rows, roles and the
    text-mode prompt (the same probe, ``tests/torchrl_layout_probes.py``, run on both libraries)."""
    from transformers import AutoTokenizer

    ours = reset_layout(_llmrl_library(), AutoTokenizer.from_pretrained(default_model_path))
    golden = _api_golden("reset_layout")
    for mode in ("history", "text"):
        # TorchRL answers a lazy stack of the rows, llmrl one TensorDict; the rest is equal (in text mode the prompt
        # is TorchRL's template choice: ChatML, not SmolLM2's own template with its default system turn)
        assert golden[mode].pop("type") == "LazyStackedTensorDict" and ours[mode].pop("type") == "TensorDict"
        assert ours[mode] == golden[mode]


def test_env_specs_are_torchrls(default_model_path):
    """``observation_spec``, ``action_spec``, ``state_spec``, ``reward_spec``, ``done_spec`` and the ``*_keys`` of a
    ``ChatEnv`` in each input mode, and its reward spec with a ``GSM8KRewardParser``, equal TorchRL 0.14.1's
    (``api_probes.json`` ``env_specs``: the same probe run there): leaves' classes, shapes (-1 for ragged) and dtypes,
    the composites' tensorclasses, the sorted key lists and which shortcut answers a leaf."""
    from transformers import AutoTokenizer

    ours = env_specs(_llmrl_library(), AutoTokenizer.from_pretrained(default_model_path))
    assert ours == _api_golden("env_specs")


def test_spec_zero_examples_and_the_env_limits():
    """The specs build zero examples as TorchRL's do (ragged dimensions as 1, tensorclasses from ``data_cls``), nest
    by tuple keys, and the done spec gains ``truncated`` once the env can cut an episode short (llmrl's step writes
    it then); a reward transform's spec shape follows its ``reward_shape``."""
    from llmrl_core.data.tensor_specs import Categorical, Composite, NonTensor, Unbounded
    from llmrl_core.modules.policies.common import Tokens

    spec = Composite(
        a=Unbounded(shape=(2, 1)), b=Composite(c=Categorical(2, shape=(2, 1), dtype=torch.bool), shape=(2,)), shape=(2,)
    )
    assert list(spec.keys(True, True)) == ["a", ("b", "c")] and list(spec.keys(True)) == ["a", ("b", "c"), "b"]
    zero = spec.zero()
    assert zero["b", "c"].dtype == torch.bool and zero["a"].shape == (2, 1) and not zero["b", "c"].any()
    assert type(Unbounded(shape=(1,), dtype=torch.bool)).__name__ == "UnboundedDiscrete"
    assert NonTensor(shape=(2,), example_data="x").zero().data == "x"
    tokens = Tokens.default_spec(shape=(2,), keys=["prompt"]).zero()
    assert isinstance(tokens, Tokens) and tokens.prompt.shape == (2, 1) and tokens.padded is False
    with pytest.raises(ValueError, match="unknown keys"):
        Tokens.default_spec(shape=(2,), keys=["answer"])

    env = ChatEnv(batch_size=(3,), max_turns=2).append_transform(ZeroReward())
    assert env.done_keys == ["done", "terminated", "truncated"] and env.reward_keys == ["reward"]
    assert env.reward_spec.shape == (3, 1) and env.observation_spec.shape == (3,)
    assert ChatEnv(batch_size=(3,)).reward_spec.is_empty()

    class ReadsTheBaseEnv(TensorDictTransform):  # as TorchRL's KL transforms find their action key
        def _step(self, tensordict, next_tensordict):
            seen.append((self.parent.base_env.input_mode, self.parent.action_keys[0]))
            return next_tensordict

    seen: list = []
    env = ChatEnv(batch_size=(1,)).append_transform(ReadsTheBaseEnv())
    env.step(env.reset(TensorDict({"query": ["a"]}, batch_size=(1,))).set("text_response", ["x"]))
    assert seen == [("history", ("history", "full", "content"))]


def test_slot_next_fields_stack_as_torchrl_writes_them():
    """``stack_next_fields``: equal-shaped tensors stack, ragged ones become one nested tensor (TorchRL's KL layout),
    a slot without the entry gets zeros of another slot's shape, and non-tensor entries stay out."""
    from llmrl_core.envs.tensordict_io import stack_next_fields

    rows = [
        {"score": torch.tensor([1.0]), "kl": torch.ones(3), "note": "kept in info"},
        {"kl": torch.full((5,), 2.0)},
        {"score": torch.tensor([3.0]), "kl": torch.zeros(2)},
    ]
    stacked = stack_next_fields(rows)
    assert set(stacked) == {"score", "kl"}
    assert torch.equal(torch.stack(list(stacked["score"].unbind(0))), torch.tensor([[1.0], [0.0], [3.0]]))
    kl = stacked["kl"]
    assert kl.is_nested and [tuple(t.shape) for t in kl.unbind()] == [(3,), (5,), (2,)]
    assert torch.equal(kl.unbind()[1], torch.full((5,), 2.0))
    td = TensorDict({"a": torch.arange(2)}, batch_size=())
    both = stack_next_fields([{"td": td}, {}])
    assert both["td"].batch_size == torch.Size([2])
    assert torch.equal(both["td"]["a"][1], torch.zeros(2, dtype=torch.long))


def _llmrl_library():
    from llmrl_core.envs.reward import GSM8KRewardParser, IfEvalScorer
    from llmrl_core.modules.policies import Text

    def limit_turns(env, turns):  # llmrl's turn limit is the env's own max_turns (TorchRL: a StepCounter)
        env.max_turns = turns
        return env

    return library(
        ChatEnv,
        History,
        ChatHistory,
        Text,
        GSM8KRewardParser,
        IfEvalScorer,
        Transform=TensorDictTransform,
        limit_turns=limit_turns,
    )


def _api_golden(name: str) -> dict:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parent / "goldens/torchrl/api_probes.json").read_text())[name]


def test_a_bare_step_answers_torchrls_tensordict(default_model_path):
    """A step of a bare ``ChatEnv`` (no transform, no turn limit) is laid out as TorchRL 0.14.1's
    (``api_probes.json`` ``step_layout``, the same probe run there): the same keys at the top and under ``"next"``
    (no ``reward`` and no ``truncated``: nothing rewards or cuts short), ``done``/``terminated`` shapes and dtypes,
    and the next prompt (history mode: the conversation with the answer). One departure, recorded here: in text mode
    TorchRL's next prompt is the full text as the policy wrote it; llmrl renders the conversation again, with the
    generation prompt of the next turn after it (what a policy answering the next turn needs)."""
    from transformers import AutoTokenizer

    ours = step_layout(_llmrl_library(), AutoTokenizer.from_pretrained(default_model_path))
    golden = _api_golden("step_layout")
    assert ours["history"] == golden["history"]
    text, expected = dict(ours["text"]), golden["text"]
    generation_prompt = "\n<|im_start|>assistant\n"
    assert text.pop("next_prompt_text") == [prompt + generation_prompt for prompt in expected["next_prompt_text"]]
    assert text == {key: value for key, value in expected.items() if key != "next_prompt_text"}


def test_the_env_picks_the_chat_template_as_torchrl_does(default_model_path):
    """The prompt a ``ChatEnv`` renders in text and tokens modes equals TorchRL 0.14.1's (``api_probes.json``
    ``template_choice``) for each way of picking the template: TorchRL's automatic choice (ChatML for SmolLM2, whose
    own template lacks generation markers: no default system turn), ``template_kwargs`` naming ``chatml_format`` or
    ``qwen``, or handing the tokenizer's own template, and the Qwen family rule; ``chat_template_name="tokenizer"``
    (llmrl's, the flows' envs) renders with the model's own template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    golden = _api_golden("template_choice")
    assert template_choice(_llmrl_library(), tokenizer) == golden
    own = ChatEnv(batch_size=(1,), tokenizer=tokenizer, input_mode="text", chat_template_name="tokenizer")
    td = own.reset(TensorDict(query=["Name a color."], batch_size=(1,)))
    assert td["text", "prompt"][0] == golden["the tokenizer's own | text | system=None"]
    assert "named SmolLM" in td["text", "prompt"][0]


def test_a_step_carries_reward_and_truncated_when_the_env_has_their_sources():
    """``reward`` appears under ``"next"`` once a transform may reward (TorchRL's reward transforms add it), and
    ``truncated`` once the env can cut episodes short (``max_turns``, as TorchRL's ``StepCounter``); a transform
    that only shapes prompts adds neither."""

    class Shapes(TensorDictTransform):  # declares no reward
        def _step(self, tensordict, next_tensordict):
            return next_tensordict

    def step_once(env):
        td = env.reset(TensorDict({"query": ["Hi"]}, batch_size=(1,)))
        answer = History(role=[["assistant"]], content=[["yo"]], batch_size=(1, 1))
        full = td["history"].prompt.extend(answer, inplace=False, dim=-1)
        return env.step(td.set("history", ChatHistory(prompt=td["history"].prompt, full=full, batch_size=(1,))))

    shaped = ChatEnv(input_mode="history", batch_size=(1,))
    shaped.append_transform(Shapes())
    assert sorted(step_once(shaped)["next"].keys()) == ["done", "history", "terminated"]
    paid = ChatEnv(input_mode="history", batch_size=(1,), max_turns=1)
    paid.append_transform(Pays(2.0))
    nxt = step_once(paid)["next"]
    assert nxt["reward"].tolist() == [[2.0]] and nxt["truncated"].tolist() == [[True]]


def test_a_text_full_action_needs_its_prompt():
    """A text-mode action given as ``("text", "full")`` is cut after ``("text", "prompt")``; without the prompt, or
    with a full text that does not start with it, the step says so."""
    from llmrl_core.modules.policies import Text

    env = ChatEnv(input_mode="text", batch_size=(1,), chat_template_name="chatml")
    td = env.reset(TensorDict({"query": ["Hi"]}, batch_size=(1,)))
    prompt = list(td["text", "prompt"])
    with pytest.raises(ValueError, match=r"row 0: \('text', 'full'\) does not start"):
        env.step(td.clone().set("text", Text(prompt=prompt, full=["other" + prompt[0]], batch_size=(1,))))
    with pytest.raises(KeyError, match=r"without \('text', 'prompt'\)"):
        env.step(td.clone().set("text", Text(full=[prompt[0] + "yo"], batch_size=(1,))))
    out = env.step(td.set("text", Text(prompt=prompt, full=[prompt[0] + "yo"], batch_size=(1,))))
    assert env.slots[0].history.messages[-1].text == "yo" and "next" in out.keys()


def test_an_ifeval_scorer_step_answers_torchrls_layout(default_model_path):
    """``IfEvalScorer`` on an env fed by a DataLoader of IFEval rows (prompt under ``text``, history mode), stepped
    with an answer that keeps its instruction and one that breaks it: the keys under ``"next"`` (the score, the
    reward ``(B, 1, 1)``, ``done``/``terminated``, the rows' fields, ``text`` among them), every tensor's shape, dtype
    and value, and the score's four metrics per slot equal TorchRL 0.14.1's (``api_probes.json``
    ``ifeval_scorer_layout``, the same probe run there)."""
    from transformers import AutoTokenizer

    ours = ifeval_scorer_layout(_llmrl_library(), AutoTokenizer.from_pretrained(default_model_path))
    golden = _api_golden("ifeval_scorer_layout")
    assert ours == golden
    assert golden["next_tensors"]["reward"][0] == [2, 1, 1]
    assert golden["score_fields"]["prompt_level_strict_acc"][2] == [[True], [False]]


def test_a_gsm8k_reward_parser_step_answers_torchrls_layout(default_model_path):
    """``ChatEnv.from_dataloader`` with ``GSM8KRewardParser`` appended, stepped with TorchRL's call, writes under
    ``"next"`` what TorchRL 0.14.1 does (``api_probes.json`` ``reward_parser_layout``, the same probe run there): the
    primer's row fields, the ``(B, 1, 1)`` reward and its parts with their values, the done flags (an answer ends
    the episode)."""
    from transformers import AutoTokenizer

    ours, env = reward_parser_layout(_llmrl_library(), AutoTokenizer.from_pretrained(default_model_path))
    golden = _api_golden("reward_parser_layout")
    assert ours["next_keys"] == golden["next_keys"] and ours["next_answer"] == golden["next_answer"]
    assert ours["next_tensors"].keys() == golden["next_tensors"].keys()
    for key, (shape, dtype, values) in golden["next_tensors"].items():
        assert ours["next_tensors"][key][:2] == [shape, dtype], key
        assert torch.allclose(torch.tensor(ours["next_tensors"][key][2]).float(), torch.tensor(values).float()), key
    # the slots agree with the step data: the parser's reward is theirs, its parts are their components
    assert [slot.reward for slot in env.slots] == pytest.approx([1.0, 0.1])
    assert env.slots[1].reward_components["reward_think"] == 0.0


def test_gsm8k_reward_parser_ends_an_episode_only_on_a_valid_answer_tag_as_torchrl(default_model_path):
    """Without a turn limit, an answer with no answer tag (or an empty, unclosed or upper-case one) leaves the
    episode running, as TorchRL 0.14.1's parser does (it ends one only when ``reward_answer > 0``): a multi-turn
    episode may continue. With a one-turn limit every answer ends it. Both against ``api_probes.json``
    ``reward_parser_done`` (the same probe run on TorchRL, its limit a ``StepCounter``); ``truncated`` is left out:
    TorchRL's ``StepCounter`` writes it, a bare llmrl env with ``max_turns`` does too, as the list calls read it."""
    from transformers import AutoTokenizer

    ours = reward_parser_done(_llmrl_library(), AutoTokenizer.from_pretrained(default_model_path))
    golden = _api_golden("reward_parser_done")
    assert ours.keys() == golden.keys()
    for limit, answers in golden.items():
        for answer, flags in answers.items():
            assert ours[limit][answer]["done"] == flags["done"], (limit, answer)
            assert ours[limit][answer]["terminated"] == flags["terminated"], (limit, answer)
            assert ours[limit][answer]["reward"] == pytest.approx(flags["reward"]), (limit, answer)
    assert golden["max_turns=None"]["The answer is 4."]["done"] == [False, False]
    assert golden["max_turns=1"]["The answer is 4."]["done"] == [True, True]


def test_a_torchrl_style_tool_transform_extends_the_conversation_as_torchrls_does(default_model_path):
    """A user's tool written as TorchRL writes one (its ``_step`` extends ``("history", "prompt")`` under "next" with a
    ``tool`` message, in place, as TorchRL's tool transforms do): the next prompt carries the tool's output and the
    next turn continues from it; the same probe run on TorchRL 0.14.1 (``api_probes.json`` ``tool_transform_turns``)
    gives the same conversations, turn by turn, and the same rendered prompt."""
    from transformers import AutoTokenizer

    ours = tool_transform_turns(_llmrl_library(), AutoTokenizer.from_pretrained(default_model_path))
    assert ours == _api_golden("tool_transform_turns")
    assert ours["turn 1"]["prompt_roles"][0] == ["system", "user", "assistant", "tool", "assistant"]


class _Adder(TensorDictTransform):
    """TorchRL-style tool: "add A B" gets the sum as a tool message; other answers get none."""

    def _step(self, tensordict, next_tensordict):
        history = next_tensordict["history"].prompt
        answers = [history[i, -1].content for i in range(history.batch_size[0])]
        sums = [str(sum(int(n) for n in a.split()[1:])) if a.startswith("add") else "no call" for a in answers]
        tool = History(role=[["tool"]] * len(sums), content=[[v] for v in sums], batch_size=(len(sums), 1))
        history.extend(tool, dim=-1)
        next_tensordict["history"].prompt = history
        return next_tensordict


@pytest.mark.parametrize("mode", ["text", "tokens"])
def test_a_torchrl_style_tool_runs_on_the_list_calls_of_every_input_mode(default_model_path, mode):
    """The list calls (the collector's and the flows', in tokens mode) hand TensorDict transforms the conversation as
    ``("history", "prompt")`` in every input mode, and what a tool appends joins the slot: the next prompt's text and
    ids carry the tool message after the answer; in tokens mode the ids before it (prompt, sampled answer) stay as
    they were, the tool's ids are not the policy's, and the next answer continues from them."""
    from transformers import AutoTokenizer

    from llmrl_core.data.llm_data import Response

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    env = ChatEnv(tokenizer=tokenizer, input_mode=mode, max_turns=3, system_prompt="Use the adder.")
    env.append_transform(_Adder())
    env.reset(["What is 2 + 3?", "What is 4 + 5?"])
    before = [slot.all_tokens().tolist() for slot in env.slots]
    answers = ["add 2 3<|im_end|>", "It is 9.<|im_end|>"]
    ids = [tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]
    out = env.step([Response(a, token_ids=i, finish_reason="stop") for a, i in zip(answers, ids, strict=True)])
    history = out["history", "prompt"]
    assert [history[i].role[-2:] for i in range(2)] == [["assistant", "tool"]] * 2
    assert [history[i][-1].content for i in range(2)] == ["5", "no call"]
    rendered = [env._render(conv, add_generation_prompt=True) for conv in history.to_conversations()]
    assert out["text", "prompt"] == rendered and "<|im_start|>tool\n5<|im_end|>" in out["text", "prompt"][0]
    if mode == "tokens":
        for slot, start, sampled, text in zip(env.slots, before, ids, rendered, strict=True):
            tokens, mask = slot.all_tokens().tolist(), slot.policy_mask().tolist()
            assert tokens[: len(start) + len(sampled)] == start + sampled  # the ids answered are kept
            assert tokenizer.decode(tokens) == text == slot.prompt_text
            assert sum(mask) == len(sampled) and mask[len(start) : len(start) + len(sampled)] == [True] * len(sampled)
        second = tokenizer("It is 5.<|im_end|>", add_special_tokens=False)["input_ids"]
        prompt_ids = out.get(("tokens", "prompt"), as_list=True)[0].tolist()
        out = env.step([Response("It is 5.<|im_end|>", token_ids=second, finish_reason="stop"), "Done.<|im_end|>"])
        assert env.slots[0].all_tokens().tolist()[: len(prompt_ids) + len(second)] == prompt_ids + second


def test_a_tool_that_rewrites_earlier_messages_is_refused_in_tokens_mode_and_taken_in_history_mode(default_model_path):
    """Tokens mode keeps the ids sampled so far, so a transform that changes a message before the answer is refused
    with a message naming it; in history mode the rewritten conversation is the slot's."""
    from transformers import AutoTokenizer

    class Redact(TensorDictTransform):
        def _step(self, tensordict, next_tensordict):
            history = next_tensordict["history"].prompt
            rows = [[m.to_dict() for m in conv.messages] for conv in history.to_conversations()]
            for row in rows:
                row[0]["content"] = "[redacted]"
            next_tensordict["history"].prompt = History.from_chats(rows)
            return next_tensordict

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    env = ChatEnv(tokenizer=tokenizer, input_mode="tokens", max_turns=3).append_transform(Redact())
    env.reset(["secret"])
    with pytest.raises(ValueError, match=r"TensorDict transforms \(Redact\) changed the conversation up to the answer"):
        env.step(["ok<|im_end|>"])
    env = ChatEnv(tokenizer=tokenizer, input_mode="history", max_turns=3).append_transform(Redact())
    env.reset(["secret"])
    out = env.step(["ok<|im_end|>"])
    assert out["history", "prompt"][0].content == ["[redacted]", "ok"]


@pytest.mark.parametrize("call", ["list", "tensordict", "tensordict_tokens"])
def test_a_prompt_a_reset_transform_rewrites_is_the_slots(default_model_path, call):
    """A ``_reset`` transform that puts an example exchange before the question (few-shot) changes the prompt the
    policy answers, on both calls (the list call in tokens mode renders the ids from the new conversation; TorchRL's
    call in history mode, the mode whose TensorDict carries the history, and in tokens mode, where the conversations
    are lent to the transforms under ``("history", "prompt")`` and the returned ids are the new conversation's)."""
    from transformers import AutoTokenizer

    class FewShot(TensorDictTransform):
        def _reset(self, tensordict, tensordict_reset):
            history = tensordict_reset["history"].prompt
            rows = [[m.to_dict() for m in conv.messages] for conv in history.to_conversations()]
            shot = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]
            tensordict_reset["history"].prompt = History.from_chats([shot + row for row in rows])
            return tensordict_reset

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    mode = "history" if call == "tensordict" else "tokens"
    env = ChatEnv(tokenizer=tokenizer, input_mode=mode, batch_size=(2,)).append_transform(FewShot())
    if call == "list":
        env.reset(["2+2?", "3+3?"])
    else:
        reset = env.reset(TensorDict({"query": ["2+2?", "3+3?"]}, batch_size=(2,)))
    for slot, question in zip(env.slots, ["2+2?", "3+3?"], strict=True):
        assert [m.content for m in slot.history.messages] == ["1+1?", "2", question]
        if mode == "tokens":
            assert tokenizer.decode(slot.all_tokens().tolist()) == env._render(slot.history, add_generation_prompt=True)
    if call == "tensordict_tokens":
        assert "history" not in reset.keys()  # TorchRL's tokens-mode layout: the conversations were only lent
        ids = [row.tolist() for row in reset.get(("tokens", "prompt"), as_list=True)]
        assert ids == [slot.all_tokens().tolist() for slot in env.slots]


def test_an_ended_tokens_mode_episode_takes_no_tool_message_after_its_last_answer(default_model_path):
    """Tokens mode, the turn limit reached: the tool still runs (as in TorchRL), but the episode's messages end with
    its last answer, as its ids do (the row stored is the same either way); in history mode the message is kept."""
    from transformers import AutoTokenizer

    from llmrl_core.data.llm_data import Response

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    ids = tokenizer("add 2 3<|im_end|>", add_special_tokens=False)["input_ids"]
    roles = {}
    for mode in ("tokens", "history"):
        env = ChatEnv(tokenizer=tokenizer, input_mode=mode, max_turns=1).append_transform(_Adder())
        env.reset(["What is 2 + 3?"])
        out = env.step([Response("add 2 3<|im_end|>", token_ids=ids, finish_reason="stop")])
        assert out["done"].reshape(-1).tolist() == [True]
        roles[mode] = list(out["history", "prompt"][0].role)
        if mode == "tokens":
            assert out.get(("tokens", "prompt"), as_list=True)[0][-len(ids) :].tolist() == ids
    assert roles == {"tokens": ["user", "assistant"], "history": ["user", "assistant", "tool"]}


class _EndsAtOnce(TensorDictTransform):
    """A TorchRL-style judge: pays 0.25 and ends every episode at its first answer."""

    def _step(self, tensordict, next_tensordict):
        n = next_tensordict.batch_size[0]
        paid = next_tensordict.get("reward", torch.zeros(n, 1)) + 0.25
        ended = torch.ones(n, 1, dtype=torch.bool)
        return next_tensordict.set("reward", paid).set("terminated", ended).set("done", ended)


def _length_reward(prompt, completion, row):
    return float(len(completion))


@pytest.mark.parametrize("mode", ["tokens", "history"])
def test_env_rewards_appended_after_a_transform_that_ends_the_episode_pay_once(default_model_path, mode):
    """Transforms run in the order appended: ``env.rewards``' functions (a TensorDict transform now), appended to a
    factory env whose transform ends the episode, see that end and pay once, on the episode's last answer; a
    transform appended before it sees no end yet. Both calls: the list call (the flows', tokens mode) and TorchRL's
    TensorDict call, whose "next" data carries the reward."""
    from transformers import AutoTokenizer

    from llmrl_core.pipeline.env_config import RewardFunctionConfig
    from llmrl_core.pipeline.reward_functions import RewardFunctions

    seen = []

    class SeesNoEnd(TensorDictTransform):
        def _step(self, tensordict, next_tensordict):
            seen.extend(next_tensordict["done"].flatten().tolist())
            return next_tensordict

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    env = ChatEnv(tokenizer=tokenizer, input_mode=mode, max_turns=3, batch_size=(2,))
    env.append_transform(SeesNoEnd()).append_transform(_EndsAtOnce())
    specs = [RewardFunctionConfig(function=f"{__name__}:_length_reward", weight=0.5, name="length")]
    env.append_transform(RewardFunctions(specs))
    assert [type(t).__name__ for t in env.td_transforms] == ["SeesNoEnd", "_EndsAtOnce", "RewardFunctions"]
    answers = ["abcd<|im_end|>", "ab<|im_end|>"]
    if mode == "tokens":
        env.reset(["q1", "q2"])
        out = env.step(answers)
        rewards, done = out["reward"].reshape(-1).tolist(), out["done"].reshape(-1).tolist()
        for slot in env.slots:  # an ended episode's ids end with its answer: no next prompt's opening
            assert slot.segment_is_policy[-1] and tokenizer.decode(slot.all_tokens()).endswith("<|im_end|>")
    else:
        td = env.reset(TensorDict({"query": ["q1", "q2"]}, batch_size=(2,)))
        nxt = env.step(td.set("text_response", answers))["next"]
        rewards, done = nxt["reward"].flatten().tolist(), nxt["done"].flatten().tolist()
    assert seen == [False, False]
    assert rewards == [0.25 + 2.0, 0.25 + 1.0] and done == [True, True]
    assert [slot.reward_components for slot in env.slots] == [
        {"_EndsAtOnce": 0.25, "length": 2.0},
        {"_EndsAtOnce": 0.25, "length": 1.0},
    ]
    assert [slot.episode_reward for slot in env.slots] == rewards


def test_what_a_tensordict_transform_notes_about_a_row_reaches_that_slot():
    """``Transform._note_row`` at reset and at step (llmrl's extension): the info entries and reward parts land on
    the slot the row is, also when the list calls hand the transform the active slots only."""
    from llmrl_core.envs import ChatEnv
    from llmrl_core.envs.transforms import Transform

    class Noter(Transform):
        def _reset(self, tensordict, tensordict_reset):
            for i in range(tensordict_reset.batch_size[0]):
                self._note_row(i, info={"started_in": self._slot_of(i)})
            return tensordict_reset

        def _step(self, tensordict, next_tensordict):
            reward = torch.ones(next_tensordict.batch_size[0], 1)
            for i in range(next_tensordict.batch_size[0]):
                self._note_row(i, reward_components={"bonus": 1.0}, info={"stepped_as": self._slot_of(i)})
            return next_tensordict.set("reward", reward)

    env = ChatEnv(batch_size=3).append_transform(Noter())
    out = env.reset(["a", "b", "c"])
    assert [info["started_in"] for info in out["info"]] == [0, 1, 2]
    env.slots[0].terminate()
    out = env.step([None, "x", "y"])
    assert [info.get("stepped_as") for info in out["info"]] == [None, 1, 2]
    assert out["reward_components"][1] == {"bonus": 1.0} and out["reward"].reshape(-1).tolist() == [0.0, 1.0, 1.0]
    out = env.reset_slots([0], ["again"])
    assert out["info"][0]["started_in"] == 0


def test_insert_transform_places_a_transform_in_the_chain_as_torchrls():
    """``insert_transform(index, transform)`` (TorchRL's): the transform runs at that place of the chain; anything
    but a TorchRL transform is refused."""
    order = []

    class Mark(TensorDictTransform):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def _step(self, tensordict, next_tensordict):
            order.append(self.name)
            return next_tensordict

    env = ChatEnv(batch_size=1, chat_template_name="chatml").append_transform(Mark("a")).append_transform(Mark("c"))
    env.insert_transform(1, Mark("b")).insert_transform(0, Mark("first"))
    assert [t.name for t in env.td_transforms] == ["first", "a", "b", "c"]
    assert all(t.parent is env for t in env.td_transforms)
    env.reset(["q"])
    env.step(["x"])
    assert order == ["first", "a", "b", "c"]
    with pytest.raises(TypeError, match=r"insert_transform expects a Transform"):
        env.insert_transform(0, object())


def test_compose_passes_every_spec_through_its_transforms_in_order():
    """TorchRL's ``Compose``: each ``transform_*_spec`` hook hands the spec to the chained transforms' hooks in order
    (each appends its name here); a transform that leaves a hook alone returns the spec unchanged."""
    from llmrl_core.envs.transforms.td_base import Compose

    hooks = ("observation", "reward", "done", "action", "state", "input", "output")

    class Named(TensorDictTransform):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name
            for hook in hooks:
                setattr(self, f"transform_{hook}_spec", lambda spec, name=name: [*spec, name])

    chain = Compose(Named("a"), TensorDictTransform(), Named("b"))
    for hook in hooks:
        assert getattr(chain, f"transform_{hook}_spec")(["start"]) == ["start", "a", "b"], hook
