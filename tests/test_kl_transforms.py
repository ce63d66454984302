"""KL transforms on TensorDicts (RetrieveLogProb, KLComputation, RetrieveKL, KLRewardTransform) and the pure
KL functions.

The independent reference is a plain forward of one conversation at a time through a tiny randomly initialised
Llama (the packaged tokenizer's vocabulary) followed by ``log_softmax`` by hand; the transforms score padded
batches through ``TransformersWrapper``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict, lazy_stack, set_list_to_stack

from llmrl_core.data.history import History
from llmrl_core.envs.transforms.kl import (
    KLComputation,
    KLRewardTransform,
    RetrieveKL,
    RetrieveLogProb,
    kl_penalties,
    token_kl,
)
from llmrl_core.modules.policies.common import ChatHistory
from llmrl_core.modules.policies.transformers_wrapper import TransformersWrapper

CHATS = [
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello, how are you?"},
        {"role": "assistant", "content": "I'm doing well, thank you!"},
    ],
    [
        {"role": "user", "content": "What's 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "It is 6."},
    ],
]


@pytest.fixture(autouse=True)
def _list_to_stack():
    with set_list_to_stack(True):
        yield


def tiny_llama(seed: int, vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture(scope="module")
def models(tokenizer):
    return tiny_llama(2, len(tokenizer)), tiny_llama(3, len(tokenizer))


@torch.no_grad()
def by_hand(model, ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of every token given those before it (0 for the first): one unpadded forward, log_softmax."""
    logits = model(input_ids=ids[None]).logits[0].float()
    log_probs = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[1:, None]).squeeze(-1)
    return torch.cat([torch.zeros(1), log_probs])


def rendered(tokenizer) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Token ids and assistant masks of CHATS, as the wrappers render them."""
    out = History.from_chats(CHATS).apply_chat_template(
        tokenizer=tokenizer,
        add_generation_prompt=False,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    return list(out.get("input_ids", as_list=True)), [m.bool() for m in out.get("assistant_masks", as_list=True)]


def scorer(model, tokenizer, **kwargs) -> TransformersWrapper:
    return TransformersWrapper(model, tokenizer=tokenizer, input_mode="history", generate=False, **kwargs)


def history_data(with_next: bool = False) -> TensorDict:
    chat = ChatHistory(full=History.from_chats(CHATS))
    data = TensorDict(history=chat, batch_size=(2,))
    if with_next:
        data.set("next", TensorDict(history=ChatHistory(full=History.from_chats(CHATS)), batch_size=(2,)))
    return data


# --- pure functions -------------------------------------------------------------------------------
def test_token_kl_and_penalty_arithmetic():
    lp = [-0.5, -1.0, -2.0, -0.1]
    ref = [-1.0, -1.0, -0.5, -3.0]
    assert token_kl(lp, ref).tolist() == pytest.approx([0.5, 0.0, -1.5, 2.9])
    mask = [True, True, True, False]
    assert token_kl(lp, ref, mask).tolist() == pytest.approx([0.5, 0.0, -1.5, 0.0])
    # the KL a stored row's return loses (train.kl_in=reward): a KLComputation run on its tokens
    assert kl_penalties(KLComputation(coeff=0.1), [lp], [ref], [mask]) == pytest.approx([0.1 * (0.5 + 0.0 - 1.5)])
    assert kl_penalties(KLComputation(), [lp, lp[:2]], [ref, ref[:2]]) == pytest.approx([0.5 - 1.5 + 2.9, 0.5])
    # non-finite tokens (a sampler's -inf, unknown NaN) are left out of the penalty
    lp_bad = [-0.5, float("-inf"), float("nan"), -0.1]
    assert kl_penalties(KLComputation(), [lp_bad], [ref]) == pytest.approx([0.5 + 2.9])
    assert torch.isnan(token_kl(lp_bad, ref)[2])
    tensors = [torch.tensor(lp)], [torch.tensor(ref)], [torch.tensor(mask)]
    assert kl_penalties(KLComputation(coeff=2.0), *tensors) == pytest.approx([-2.0])
    assert kl_penalties(KLComputation(), [[]], [[]]) == [0.0] and kl_penalties(KLComputation(), [], []) == []
    assert kl_penalties(KLComputation(), [[-0.5, None]], [[-1.0, -1.0]]) == pytest.approx([0.5])  # None: left out
    with pytest.raises(ValueError, match="row 0"):
        kl_penalties(KLComputation(), [[0.0]], [[0.0, 1.0]])
    with pytest.raises(ValueError, match="same shape"):
        token_kl([0.0], [0.0, 1.0])
    with pytest.raises(ValueError, match="mask"):
        token_kl([0.0, 1.0], [0.0, 1.0], [True])


# --- KLComputation --------------------------------------------------------------------------------
def test_kl_computation_runs_the_documented_example():
    """TorchRL's own docstring example (``gen_log_probs_key``/``coef`` spellings): KL (2, 10), reward (2, 10, 1)."""
    gen, ref, reward = torch.randn(2, 10), torch.randn(2, 10), torch.randn(2, 10, 1)
    next_td = TensorDict(
        {("gen_log_probs", "full"): gen, ("ref_log_probs", "full"): ref, "reward": reward.clone()}, batch_size=(2,)
    )
    data = TensorDict(next=next_td, batch_size=(2,))
    transform = KLComputation(
        gen_log_probs_key=("gen_log_probs", "full"),
        ref_log_probs_key=("ref_log_probs", "full"),
        kl_key="kl_penalty",
        add_to_reward=True,
        coef=1.0,
    )
    assert transform.in_keys == [("gen_log_probs", "full"), ("ref_log_probs", "full"), "reward"]
    assert transform.out_keys == ["kl_penalty", "reward"]
    result = transform(data)
    kl = result["next"].get("kl_penalty")
    assert kl.shape == torch.Size([2, 10])
    torch.testing.assert_close(kl, gen - ref)
    torch.testing.assert_close(result["next", "reward"], reward - (gen - ref).unsqueeze(-1))
    # TorchRL's own names give the same transform; a conflicting pair of spellings is refused
    same = KLComputation(("gen_log_probs", "full"), coeff=0.5)
    assert same.gen_log_probs_full_key == ("gen_log_probs", "full") and same.coef == 0.5
    with pytest.raises(TypeError, match="got both"):
        KLComputation(("a", "full"), gen_log_probs_key=("b", "full"))


def test_kl_computation_on_ragged_samples_and_its_errors():
    rows = [
        TensorDict(
            {
                ("log_probs", "full"): torch.randn(n),
                ("ref_log_probs", "full"): torch.randn(n),
                "reward": torch.randn(n, 1),
            }
        )
        for n in (3, 5)
    ]
    before = [r.clone() for r in rows]
    out = KLComputation(coeff=2.0)(lazy_stack(rows))
    for got_kl, got_reward, row in zip(
        out.get("kl_penalty", as_list=True), out.get("reward", as_list=True), before, strict=True
    ):
        kl = row["log_probs", "full"] - row["ref_log_probs", "full"]
        torch.testing.assert_close(got_kl, kl)
        torch.testing.assert_close(got_reward, row["reward"] - 2.0 * kl.unsqueeze(-1))
    # no reward in the data: only the KL
    out = KLComputation()(
        TensorDict({("log_probs", "full"): torch.zeros(2, 4), ("ref_log_probs", "full"): torch.ones(2, 4)}, [2])
    )
    assert out["kl_penalty"].eq(-1).all() and "reward" not in out.keys()
    with pytest.raises(ValueError, match="Log-probs not found"):
        KLComputation()(TensorDict({("log_probs", "full"): torch.zeros(2, 4)}, [2]))
    with pytest.raises(ValueError, match="different shapes"):
        KLComputation()(
            TensorDict({("log_probs", "full"): torch.zeros(2, 4), ("ref_log_probs", "full"): torch.zeros(2, 3)}, [2])
        )
    with pytest.raises(ValueError, match="one more dimension"):
        data = TensorDict(
            {
                ("log_probs", "full"): torch.zeros(2, 4),
                ("ref_log_probs", "full"): torch.zeros(2, 4),
                "reward": torch.zeros(2, 1),
            },
            [2],
        )
        KLComputation()(data)


# --- RetrieveLogProb ------------------------------------------------------------------------------
@pytest.mark.parametrize("pad_output", [True, False])
def test_retrieve_log_prob_matches_a_forward_by_hand(tokenizer, models, pad_output):
    policy, _ = models
    transform = RetrieveLogProb(scorer(policy, tokenizer, pad_output=pad_output), assistant_only=True)
    assert transform.in_keys == [("history", "full")] and transform.out_keys == [("log_probs", "full")]
    result = transform(history_data())
    ids, masks = rendered(tokenizer)
    got = result.get(("log_probs", "full"), as_list=True)
    if pad_output:
        dense = result.get(("log_probs", "full"))
        assert dense.shape == (2, max(len(i) for i in ids)) and dense.dtype == torch.float32
        got = [row[row.numel() - len(i) :] for row, i in zip(dense, ids, strict=True)]  # left padding
        assert dense[1, : dense.shape[1] - len(ids[1])].eq(0).all()
    for row, seq, mask, chat in zip(got, ids, masks, CHATS, strict=True):
        torch.testing.assert_close(row, by_hand(policy, seq).masked_fill(~mask, 0.0), atol=2e-5, rtol=0)
        # the mask covers the assistant contents, nothing else
        assistant = [m["content"] for m in chat if m["role"] == "assistant"]
        assert "".join(tokenizer.decode(seq[mask])).replace("<|im_end|>", "") == "".join(assistant)
    # everything but the first token when assistant_only=False, on the "next" entry when there is one
    data = history_data(with_next=True)
    result = RetrieveLogProb(scorer(policy, tokenizer, pad_output=False), assistant_only=False)(data)
    for row, seq in zip(result["next"].get(("log_probs", "full"), as_list=True), ids, strict=True):
        torch.testing.assert_close(row, by_hand(policy, seq), atol=2e-5, rtol=0)


def test_retrieve_log_prob_checks_its_model(tokenizer, models):
    policy, _ = models
    with pytest.raises(ValueError, match="generate=False"):
        RetrieveLogProb(TransformersWrapper(policy, tokenizer=tokenizer))
    with pytest.raises(ValueError, match="input_mode='history'"):
        RetrieveLogProb(TransformersWrapper(policy, tokenizer=tokenizer, input_mode="tokens", generate=False))
    transform = RetrieveLogProb(
        TransformersWrapper(policy, tokenizer=tokenizer, input_mode="tokens", generate=False), assistant_only=False
    )
    assert transform.in_keys == [("tokens", "full")]
    with pytest.warns(UserWarning, match="does not end with 'full'"):
        RetrieveLogProb(scorer(policy, tokenizer), log_probs_full_key="lp")


# --- RetrieveKL -----------------------------------------------------------------------------------
@pytest.mark.parametrize("pad_output", [True, False])
def test_retrieve_kl_is_the_masked_log_prob_difference(tokenizer, models, pad_output):
    policy, reference = models
    gen = scorer(policy, tokenizer, pad_output=pad_output, log_probs_key="gen_log_probs")
    ref = scorer(reference, tokenizer, pad_output=pad_output, log_probs_key="ref_log_probs")
    transform = RetrieveKL(gen_model=gen, ref_model=ref, assistant_only=True, tokenizer=tokenizer, coeff=0.3)
    assert [type(t).__name__ for t in transform] == ["RetrieveLogProb", "RetrieveLogProb", "KLComputation"]
    data = history_data(with_next=True)
    ids, masks = rendered(tokenizer)
    rewards = [torch.randn(len(i), 1) for i in ids]
    if pad_output:
        data["next", "reward"] = torch.stack(
            [torch.nn.functional.pad(r, (0, 0, max(map(len, ids)) - len(r), 0)) for r in rewards]
        )
    result = transform(data)
    kl = result["next"].get("kl_penalty", as_list=True)
    if pad_output:
        assert result["next"].get("kl_penalty").shape == (2, max(map(len, ids)))
        kl = [row[row.numel() - len(i) :] for row, i in zip(result["next"].get("kl_penalty"), ids, strict=True)]
    for row, seq, mask in zip(kl, ids, masks, strict=True):
        want = (by_hand(policy, seq) - by_hand(reference, seq)).masked_fill(~mask, 0.0)
        torch.testing.assert_close(row, want, atol=3e-5, rtol=0)
        assert row[~mask].eq(0).all() and row[mask].abs().sum() > 0
    if pad_output:
        for i, (seq, reward) in enumerate(zip(ids, rewards, strict=True)):
            got = result["next", "reward"][i, -len(seq) :]
            torch.testing.assert_close(got, reward - 0.3 * kl[i].unsqueeze(-1), atol=1e-5, rtol=0)


def test_retrieve_kl_argument_errors(tokenizer, models, monkeypatch):
    policy, reference = models
    gen = scorer(policy, tokenizer, log_probs_key="gen_log_probs")
    with pytest.raises(ValueError, match="pad_output mismatch"):
        RetrieveKL(gen, scorer(reference, tokenizer, pad_output=True))
    with pytest.raises(ValueError, match="different `log_prob_key`"):
        RetrieveKL(gen, scorer(reference, tokenizer, log_probs_key="gen_log_probs"))
    with pytest.raises(ValueError, match="generation model must have `generate=False`"):
        RetrieveKL(TransformersWrapper(policy, tokenizer=tokenizer), gen)
    with pytest.raises(ValueError, match="Cannot provide both 'ref_model' and 'ref_model_factory'"):
        RetrieveKL(gen, gen, ref_model_factory=lambda: gen)
    # use_ray_service=True builds the hosted variant with the same arguments, as TorchRL's metaclass does
    from llmrl_core.envs.transforms import kl

    class Hosted:
        def __init__(self, *args, **kwargs):
            self.args, self.kwargs = args, kwargs

    monkeypatch.setattr(kl, "RayRetrieveKL", Hosted)
    hosted = RetrieveKL(gen, "ref", use_ray_service=True, coeff=0.5)
    assert isinstance(hosted, Hosted) and hosted.args == (gen, "ref") and hosted.kwargs == {"coeff": 0.5}
    # the default gen_model waits for a container with a collector
    lazy = RetrieveKL(ref_model=scorer(reference, tokenizer, log_probs_key="ref_log_probs"))
    assert len(lazy) == 0
    with pytest.raises(ValueError, match="container is not set"):
        lazy(history_data(with_next=True))


class EnvWithCollector:
    """What RetrieveKL needs from its container: ``collector.policy``."""

    def __init__(self, policy):
        self.collector = SimpleNamespace(policy=policy)


def test_retrieve_kl_from_collector_scores_with_the_collectors_policy(tokenizer, models):
    policy, reference = models
    env = EnvWithCollector(TransformersWrapper(policy, tokenizer=tokenizer))
    ref = scorer(reference, tokenizer, log_probs_key="ref_log_probs")
    lazy = RetrieveKL(ref_model=ref, add_to_reward=False)
    lazy.set_container(env)
    result = lazy(history_data(with_next=True))
    eager = RetrieveKL(
        scorer(policy, tokenizer), scorer(reference, tokenizer, log_probs_key="ref_log_probs"), add_to_reward=False
    )
    want = eager(history_data(with_next=True))
    assert len(lazy) == 3 and lazy[0].model.generate is False and lazy[0].model.in_keys == [("history", "full")]
    for got, expected in zip(
        result["next"].get("kl_penalty", as_list=True), want["next"].get("kl_penalty", as_list=True), strict=True
    ):
        torch.testing.assert_close(got, expected)


# --- KLRewardTransform ----------------------------------------------------------------------------
def test_kl_reward_transform_penalises_each_assistant_token(tokenizer, models):
    policy, reference = models
    ids, masks = rendered(tokenizer)
    gen_lp = [by_hand(policy, seq) for seq in ids]
    step = lazy_stack(
        [
            TensorDict({("tokens", "full"): seq, ("log_probs", "full"): lp, ("masks", "all_assistant_mask"): m})
            for seq, lp, m in zip(ids, gen_lp, masks, strict=True)
        ]
    )
    next_td = TensorDict(reward=torch.tensor([[1.0], [2.0]]), batch_size=(2,))
    ref = TransformersWrapper(reference, tokenizer=tokenizer, input_mode="tokens", generate=False)
    transform = KLRewardTransform(ref, coef=0.5)
    assert transform.in_keys == ["reward", ("tokens", "full")]
    assert transform.out_keys == ["reward", "kl_penalty", "ref_log_probs"]
    data = step.copy().set("next", next_td)
    out = transform(data)["next"]
    for i, (seq, mask) in enumerate(zip(ids, masks, strict=True)):
        kl = (gen_lp[i] - by_hand(reference, seq)).masked_fill(~mask, 0.0).unsqueeze(-1)
        torch.testing.assert_close(out.get("kl_penalty", as_list=True)[i], kl, atol=3e-5, rtol=0)
        torch.testing.assert_close(out.get("reward", as_list=True)[i], (i + 1.0) - 0.5 * kl, atol=2e-5, rtol=0)
        assert out.get("ref_log_probs", as_list=True)[i].shape == (len(seq), 1)
    # the documented legacy form KLRewardTransform(gen_model, ref_model) and the argument errors
    assert KLRewardTransform(policy, ref).ref_model is ref
    with pytest.raises(ValueError, match="exactly one of"):
        KLRewardTransform()
    with pytest.raises(ValueError, match="Cannot provide both"):
        KLRewardTransform(ref, ref_model_factory=lambda: ref)
    with pytest.raises(ValueError, match="tokens as input"):
        KLRewardTransform(scorer(reference, tokenizer))
    with pytest.raises(ValueError, match="configured to generate"):
        KLRewardTransform(TransformersWrapper(reference, tokenizer=tokenizer, input_mode="tokens"))
    with pytest.raises(ValueError, match="out_keys must have the same length"):
        KLRewardTransform(ref, out_keys=["a", "b"])
