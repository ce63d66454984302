"""KL env transforms (RetrieveLogProb, KLComputation, RetrieveKL, KLRewardTransform) and the pure KL functions.

The independent reference is a plain, unpacked forward of one conversation at a time through a tiny randomly
initialised Llama followed by ``log_softmax``; the transforms score all slots in packed micro-batches.
"""

from __future__ import annotations

import math

import pytest
import torch

from llmrl_core.data import Conversation, Response
from llmrl_core.envs import (
    ChatEnv,
    KLComputation,
    KLRewardTransform,
    RetrieveKL,
    RetrieveLogProb,
    SlotState,
    Transform,
)
from llmrl_core.envs.transforms.kl import kl_reward_penalty, token_kl

VOCAB = 97


def tiny_llama(seed: int, vocab_size: int = VOCAB):
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
def policy():
    return tiny_llama(0)


@pytest.fixture(scope="module")
def reference():
    return tiny_llama(1)


@torch.no_grad()
def reference_log_probs(model, ids: list[int], start: int, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of ids[start:] given everything before them: one unpacked forward, plain log_softmax."""
    logits = model(input_ids=torch.tensor([ids])).logits[0].float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    targets = torch.tensor(ids[start:])
    return log_probs[start - 1 : len(ids) - 1].gather(-1, targets[:, None]).squeeze(-1)


def rand_ids(gen: torch.Generator, n: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=gen)


def make_slots() -> list[SlotState]:
    """Tokens-mode slots as ChatEnv leaves them during on_step: prompt segments, then the latest response.

    Slot 2 is on its second turn: [prompt, response 1 (policy), tool output + template glue], then response 2.
    """
    gen = torch.Generator().manual_seed(123)
    slots = []
    for index, (prompt_len, response_len) in enumerate([(7, 5), (12, 9), (4, 3), (20, 1)]):
        slot = SlotState(index=index, history=Conversation())
        slot.token_segments = [rand_ids(gen, prompt_len)]
        slot.segment_is_policy = [False]
        if index == 2:
            first = rand_ids(gen, 6)
            slot.responses.append(Response("turn 1", token_ids=first, log_probs=-torch.rand(6, generator=gen)))
            slot.token_segments += [first, rand_ids(gen, 5)]
            slot.segment_is_policy += [True, False]
        ids = rand_ids(gen, response_len)
        slot.responses.append(Response("latest", token_ids=ids, log_probs=-torch.rand(response_len, generator=gen)))
        slot.turn = len(slot.responses)
        slots.append(slot)
    return slots


def full_ids(slot: SlotState) -> list[int]:
    return slot.all_tokens().tolist() + slot.last_response.token_ids.tolist()


def response_start(slot: SlotState) -> int:
    return len(slot.all_tokens())


def new_tokens_start(slot: SlotState) -> int:
    """First token no earlier step scored: after the previous response, or 1 on the first turn."""
    end, start = 0, 1
    for segment, is_policy in zip(slot.token_segments, slot.segment_is_policy, strict=True):
        end += len(segment)
        if is_policy:
            start = end
    return start


class ForwardCounter:
    def __init__(self, model):
        self.calls = 0
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, *args):
        self.calls += 1

    def remove(self):
        self.handle.remove()


# --- RetrieveLogProb ------------------------------------------------------------------------------
def test_retrieve_log_prob_batched_matches_unpacked_forward_per_row(policy):
    slots = make_slots()
    counter = ForwardCounter(policy)
    try:
        RetrieveLogProb(policy, token_budget=40).on_step(slots)
    finally:
        counter.remove()
    lengths = [len(full_ids(s)) for s in slots]
    assert lengths == [12, 21, 18, 21] and counter.calls == 2  # first-fit decreasing: [21, 18], [21, 12]
    for slot in slots:
        got = slot.info["log_probs"]
        want = reference_log_probs(policy, full_ids(slot), response_start(slot))
        assert got.shape == (len(slot.last_response.token_ids),)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_one_forward_for_all_slots_when_they_fit_the_budget(policy):
    slots = make_slots()
    counter = ForwardCounter(policy)
    try:
        RetrieveLogProb(policy, token_budget=4096).on_step(slots)
    finally:
        counter.remove()
    assert counter.calls == 1


def test_assistant_only_false_scores_prompt_and_glue_tokens_too(policy):
    slots = make_slots()
    RetrieveLogProb(policy, log_probs_key="all", assistant_only=False, token_budget=64).on_step(slots)
    RetrieveLogProb(policy, log_probs_key="assistant", assistant_only=True, token_budget=64).on_step(slots)
    for slot in slots:
        start = new_tokens_start(slot)
        want = reference_log_probs(policy, full_ids(slot), start)
        torch.testing.assert_close(slot.info["all"], want, atol=1e-5, rtol=0)
        n = len(slot.last_response.token_ids)
        assert len(slot.info["all"]) == len(full_ids(slot)) - start > n
        # the assistant-only window is the tail of the full window: the latest response's tokens
        torch.testing.assert_close(slot.info["all"][-n:], slot.info["assistant"], atol=1e-5, rtol=0)
    # slot 2 (second turn): the first response was charged at its own step, so only glue + response 2 count
    assert new_tokens_start(slots[2]) == 4 + 6 and len(slots[2].info["all"]) == 5 + 3


def test_temperature_divides_the_logits(policy):
    slots = make_slots()
    RetrieveLogProb(policy, log_probs_key="t07", temperature=0.7).on_step(slots)
    RetrieveLogProb(policy, log_probs_key="t1").on_step(slots)
    for slot in slots:
        want = reference_log_probs(policy, full_ids(slot), response_start(slot), temperature=0.7)
        torch.testing.assert_close(slot.info["t07"], want, atol=1e-5, rtol=0)
    assert not torch.allclose(slots[1].info["t07"], slots[1].info["t1"], atol=1e-3)


def test_from_sampler_reads_response_log_probs_and_needs_assistant_only():
    slots = make_slots()
    RetrieveLogProb("from_sampler").on_step(slots)
    for slot in slots:
        assert torch.equal(slot.info["log_probs"], slot.last_response.log_probs)
    with pytest.raises(ValueError, match="assistant_only=True"):
        RetrieveLogProb("from_sampler", assistant_only=False)
    slots[0].responses[-1] = Response("no log-probs", token_ids=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="has no log_probs"):
        RetrieveLogProb("from_sampler").on_step(slots)


# --- KLComputation / RetrieveKL / KLRewardTransform -----------------------------------------------
def test_retrieve_kl_adds_summed_token_kl_to_the_reward(policy, reference):
    slots = make_slots()
    for slot in slots:
        slot.add_reward(1.0, name="answer")
    RetrieveKL(policy, reference, coeff=0.25, token_budget=48).on_step(slots)
    for slot in slots:
        ids, start = full_ids(slot), response_start(slot)
        kl = reference_log_probs(policy, ids, start) - reference_log_probs(reference, ids, start)
        torch.testing.assert_close(slot.info["kl_penalty"], kl, atol=2e-5, rtol=0)
        torch.testing.assert_close(
            slot.info["ref_log_probs"], reference_log_probs(reference, ids, start), atol=1e-5, rtol=0
        )
        assert slot.info["kl_penalty_total"] == pytest.approx(float(kl.sum()), abs=1e-4)
        assert slot.info["kl_penalty_tokens"] == len(kl)
        assert slot.reward_components["kl_penalty"] == pytest.approx(-0.25 * float(kl.sum()), abs=1e-4)
        assert slot.reward == pytest.approx(1.0 - 0.25 * float(kl.sum()), abs=1e-4)


def test_kl_stored_for_a_loss_term_leaves_the_reward_alone(policy, reference):
    slots = make_slots()
    RetrieveKL(policy, reference, add_to_reward=False).on_step(slots)
    for slot in slots:
        assert slot.reward == 0.0 and slot.reward_components == {}
        assert slot.info["kl_penalty"].shape == slot.last_response.token_ids.shape


def test_same_model_on_both_sides_gives_zero_kl(policy):
    slots = make_slots()
    RetrieveKL(policy, policy, assistant_only=False).on_step(slots)
    for slot in slots:
        assert slot.info["kl_penalty"].abs().max() < 1e-6 and abs(slot.reward) < 1e-5


def test_kl_reward_transform_uses_sampler_log_probs_and_skips_non_finite(reference):
    slots = make_slots()
    slots[1].last_response.log_probs[3] = float("nan")
    transform = KLRewardTransform(reference, coef=0.5)
    transform.on_step(slots)
    for slot in slots:
        ids, start = full_ids(slot), response_start(slot)
        kl = slot.last_response.log_probs - reference_log_probs(reference, ids, start)
        finite = torch.isfinite(kl)
        assert slot.info["kl_penalty_tokens"] == int(finite.sum())
        assert slot.reward == pytest.approx(-0.5 * float(kl[finite].sum()), abs=1e-4)
        assert math.isfinite(slot.reward)
    assert slots[1].info["kl_penalty_tokens"] == len(slots[1].last_response.token_ids) - 1
    transform.coef = 2.0
    assert transform.kl_computation.coeff == 2.0
    with pytest.raises(ValueError, match="assistant_only must be True"):
        KLRewardTransform(reference, assistant_only=False)


def test_kl_computation_checks_its_inputs():
    slot = SlotState(index=0, history=Conversation())
    slot.info.update(log_probs=torch.tensor([-1.0, -2.0]), ref_log_probs=torch.tensor([-1.5, -1.0]))
    KLComputation(coeff=2.0).step_slot(slot)
    assert slot.info["kl_penalty"].tolist() == pytest.approx([0.5, -1.0])
    assert slot.reward == pytest.approx(-2.0 * (0.5 - 1.0))
    slot.info["ref_log_probs"] = torch.tensor([-1.0])
    with pytest.raises(ValueError, match="shape"):
        KLComputation().step_slot(slot)
    del slot.info["ref_log_probs"]
    with pytest.raises(ValueError, match="ref_log_probs"):
        KLComputation().step_slot(slot)
    with pytest.raises(ValueError, match="must differ"):
        KLComputation("a", "a")
    with pytest.raises(ValueError, match="reference model"):
        RetrieveKL()


# --- pure functions -------------------------------------------------------------------------------
def test_token_kl_and_penalty_arithmetic():
    lp = [-0.5, -1.0, -2.0, -0.1]
    ref = [-1.0, -1.0, -0.5, -3.0]
    assert token_kl(lp, ref).tolist() == pytest.approx([0.5, 0.0, -1.5, 2.9])
    mask = [True, True, True, False]
    assert token_kl(lp, ref, mask).tolist() == pytest.approx([0.5, 0.0, -1.5, 0.0])
    assert kl_reward_penalty(lp, ref, mask, coeff=0.1) == pytest.approx(0.1 * (0.5 + 0.0 - 1.5))
    assert kl_reward_penalty(lp, ref) == pytest.approx(0.5 - 1.5 + 2.9)
    # non-finite tokens (a sampler's -inf, unknown NaN) are left out of the penalty
    lp_bad = [-0.5, float("-inf"), float("nan"), -0.1]
    assert kl_reward_penalty(lp_bad, ref) == pytest.approx(0.5 + 2.9)
    assert torch.isnan(token_kl(lp_bad, ref)[2])
    assert kl_reward_penalty(torch.tensor(lp), torch.tensor(ref), torch.tensor(mask), coeff=2.0) == pytest.approx(-2.0)
    assert kl_reward_penalty([], []) == 0.0
    assert kl_reward_penalty([-0.5, None], [-1.0, -1.0]) == pytest.approx(0.5)  # unknown (None) is left out
    with pytest.raises(ValueError, match="same shape"):
        token_kl([0.0], [0.0, 1.0])
    with pytest.raises(ValueError, match="mask"):
        token_kl([0.0, 1.0], [0.0, 1.0], [True])


# --- inside a ChatEnv -----------------------------------------------------------------------------
class Echo(Transform):
    """A toy tool: every assistant turn gets a tool message back, so turn 2 has tool tokens before it."""

    def step_slot(self, slot):
        slot.add_message("tool", "ok")


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture(scope="module")
def vocab_models(tokenizer):
    return tiny_llama(2, len(tokenizer)), tiny_llama(3, len(tokenizer))


def sampled(tokenizer, text: str) -> Response:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return Response(text, token_ids=torch.tensor(ids), log_probs=torch.full((len(ids),), -0.5))


@pytest.mark.parametrize("assistant_only", [True, False])
def test_episode_sum_equals_the_full_sequence_masked_sum(tokenizer, vocab_models, assistant_only):
    """Per-step windows add up to TorchRL's one-shot masked KL over the final conversation (no double counting)."""
    policy, reference = vocab_models
    env = ChatEnv(tokenizer=tokenizer, input_mode="tokens", system_prompt="S", max_turns=2)
    env.append_transform(Echo())
    env.append_transform(RetrieveKL(policy, reference, assistant_only=assistant_only, coeff=0.3))
    env.reset(["What is 2+3?", "Name a colour."])
    env.step([sampled(tokenizer, "Let me check.<|im_end|>"), sampled(tokenizer, "Red<|im_end|>")])
    env.step([sampled(tokenizer, "It is 5.<|im_end|>"), sampled(tokenizer, "Blue, too.<|im_end|>")])
    for slot in env.slots:
        ids = slot.all_tokens().tolist()
        kl = reference_log_probs(policy, ids, 1) - reference_log_probs(reference, ids, 1)
        if assistant_only:
            kl = kl[slot.policy_mask()[1:]]
        assert slot.done and slot.episode_reward == pytest.approx(-0.3 * float(kl.sum()), abs=1e-4)


def test_history_mode_scores_the_response_after_the_rendered_prompt(tokenizer, vocab_models):
    policy, _ = vocab_models
    env = ChatEnv(tokenizer=tokenizer, system_prompt="S")
    env.append_transform(RetrieveLogProb(policy))
    out = env.reset(["What is 2+3?"])
    prompt_ids = tokenizer(out.history[0].apply_chat_template(tokenizer), add_special_tokens=False)["input_ids"]
    response = sampled(tokenizer, "5<|im_end|>")
    env.step([response])
    want = reference_log_probs(policy, prompt_ids + response.token_ids.tolist(), len(prompt_ids))
    torch.testing.assert_close(env.slots[0].info["log_probs"], want, atol=1e-5, rtol=0)
    env2 = ChatEnv(tokenizer=tokenizer).append_transform(RetrieveLogProb(policy, assistant_only=False))
    env2.reset(["What is 2+3?"])
    with pytest.raises(ValueError, match="input_mode='tokens'"):
        env2.step([response])
