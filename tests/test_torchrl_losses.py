"""GRPOLoss and SFTLoss called as TorchRL users call them (``loss(td)`` on the collector's TensorDict), against
TorchRL 0.14.1's own losses on the same inputs (tests/goldens/torchrl/losses_td.json, written by
scripts/torchrl_loss_goldens.py in the side venv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict, lazy_stack

from llmrl_core.data import History
from llmrl_core.modules import TransformersWrapper
from llmrl_core.modules.policies import ChatHistory
from llmrl_core.objectives import DAPO, CISPOLoss, DistillationLoss, GRPOLoss, SFTLoss

GOLDEN = json.loads((Path(__file__).parent / "goldens" / "torchrl" / "losses_td.json").read_text())


@pytest.fixture(scope="module")
def actor(hf_model_fp32):
    model, tokenizer = hf_model_fp32
    return TransformersWrapper(
        model, tokenizer=tokenizer, input_mode="history", generate=False, return_log_probs=True, pad_output=False
    )


@pytest.fixture(scope="module")
def scored(actor):
    history = History.from_chats(GOLDEN["chats"])
    return actor(TensorDict(history=ChatHistory(full=history, batch_size=(2,)), batch_size=(2,)))


def collector_batch(scored, per_token_advantage: bool = True):
    """The scored chats as a collector batch: TorchRL's sampler log-probs and advantages from the golden file."""
    rows = []
    for i, advantage in enumerate(GOLDEN["inputs"]["advantage"]):
        row = scored[i].clone()
        sampler = torch.tensor(GOLDEN["inputs"]["sampler_log_probs"][i])
        row.set(("log_probs", "full"), sampler)
        row.set(
            "advantage",
            torch.full((sampler.numel(), 1), advantage) if per_token_advantage else torch.tensor([advantage]),
        )
        rows.append(row)
    return lazy_stack(rows)


def test_the_scored_batch_is_torchrls(scored):
    """Same tokens, assistant masks and (to float tolerance) log-probs as TorchRL's wrapper wrote."""
    inputs = GOLDEN["inputs"]
    assert [t.tolist() for t in scored.get(("tokens", "full"), as_list=True)] == inputs["tokens"]
    assert [m.tolist() for m in scored.get(("masks", "all_assistant_mask"), as_list=True)] == inputs["assistant_mask"]
    for ours, theirs in zip(scored.get(("log_probs", "full"), as_list=True), inputs["log_probs"], strict=True):
        torch.testing.assert_close(ours.detach(), torch.tensor(theirs), atol=2e-4, rtol=0)


def _padded(row, width: int, side: str = "left") -> torch.Tensor:
    fill = torch.zeros(width - len(row), dtype=torch.float64)
    row = torch.tensor(row, dtype=torch.float64)
    return torch.cat([fill, row]) if side == "left" else torch.cat([row, fill])


def by_hand(
    advantage_side: str,
    advantages: list[float] | None = None,
    objective: str = "ppo",
    clip_epsilon: tuple[float, float] = (0.2, 0.2),
) -> float:
    """GRPO's token-mean objective (PPO's clipped surrogate, or CISPO's ``-clip(w) * A``) from the golden file's
    inputs, in float64 (rows left-padded as TorchRL does; the per-token advantages padded on ``advantage_side``)."""
    inputs = GOLDEN["inputs"]
    width = max(len(t) for t in inputs["tokens"])
    advantages = inputs["advantage"] if advantages is None else advantages
    cur = torch.stack([_padded(r, width) for r in inputs["log_probs"]])
    prev = torch.stack([_padded(r, width) for r in inputs["sampler_log_probs"]])
    mask = torch.stack([_padded([float(m) for m in r], width) for r in inputs["assistant_mask"]]).bool()
    adv = torch.stack(
        [_padded([a] * len(t), width, advantage_side) for a, t in zip(advantages, inputs["tokens"], strict=True)]
    )
    log_w = torch.where(mask, cur - prev, torch.zeros_like(cur))
    low, high = (torch.log1p(torch.tensor(e, dtype=torch.float64)) for e in (-clip_epsilon[0], clip_epsilon[1]))
    clipped = log_w.clamp(low, high).exp()
    per_token = -clipped * adv if objective == "cispo" else -torch.min(log_w.exp() * adv, clipped * adv)
    return float((per_token * mask).sum() / mask.sum())


def test_grpo_loss_on_a_tensordict_matches_torchrl(actor, scored):
    """``GRPOLoss(actor, masking_strategy="rlhf")(td)`` on the collector's layout. TorchRL 0.14.1 reads the
    per-token advantage padded on the right while it pads the log-probs on the left, so on a batch of unequal
    lengths its objective pairs a token with its neighbour's advantage: its recorded value is reproduced by hand
    with that padding, ours by hand with the advantages aligned. The terms that do not involve the advantage are
    TorchRL's exactly."""
    theirs = GOLDEN["grpo_rlhf"]
    out = GRPOLoss(actor, masking_strategy="rlhf")(collector_batch(scored))
    assert theirs["loss_objective"] == pytest.approx(by_hand("right"), abs=1e-5)  # TorchRL's padding, reproduced
    assert float(out.loss_objective) == pytest.approx(by_hand("left"), abs=2e-4)
    assert by_hand("left") != pytest.approx(by_hand("right"), abs=1e-3)  # the two paddings do differ here
    for name in ("ESS", "loss_entropy"):
        assert float(getattr(out, name)) == pytest.approx(theirs[name], abs=2e-4), name
    # TorchRL averages the clip indicator over all B x T positions, llmrl over the trained tokens (module docstring)
    positions = 2 * max(len(t) for t in GOLDEN["inputs"]["tokens"])
    assert float(out.clip_fraction) * float(out.num_tokens) == pytest.approx(
        theirs["clip_fraction"] * positions, abs=1e-3
    )
    out.loss.backward()  # the loss is differentiable through the actor's model
    grads = [p.grad for p in actor.model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    actor.model.zero_grad(set_to_none=True)
    # TorchRL's idiom: the output is a tensorclass, summed over its fields; the diagnostics are detached, so the
    # gradient is the loss terms' alone
    out = GRPOLoss(actor, masking_strategy="rlhf")(collector_batch(scored))
    assert set(out.to_dict()) >= {"loss_objective", "clip_fraction", "kl_approx", "ESS"}
    out.sum(reduce=True).backward()
    summed = [p.grad for p in actor.model.parameters() if p.grad is not None]
    assert len(summed) == len(grads)
    for a, b in zip(grads, summed, strict=True):
        torch.testing.assert_close(a, b)
    actor.model.zero_grad(set_to_none=True)


def test_grpo_loss_takes_a_sequence_advantage_and_says_what_is_missing(actor, scored):
    per_token = GRPOLoss(actor, masking_strategy="rlhf", entropy_bonus=False)(collector_batch(scored))
    per_row = GRPOLoss(actor, masking_strategy="rlhf", entropy_bonus=False)(collector_batch(scored, False))
    assert float(per_row.loss_objective) == pytest.approx(float(per_token.loss_objective), abs=1e-6)
    batch = collector_batch(scored)
    with pytest.raises(ValueError, match=r"Advantage key advantage not in tensordict"):
        GRPOLoss(actor)(batch.exclude("advantage"))
    with pytest.raises(ValueError, match=r"Action key \('tokens', 'full'\) not in tensordict"):
        GRPOLoss(actor)(TensorDict(advantage=torch.zeros(2, 1), batch_size=(2,)))
    with pytest.raises(ValueError, match="masking_strategy must be one of"):
        GRPOLoss(actor, masking_strategy="everything")


@pytest.mark.parametrize("advantage", [1.0, -1.0])
@pytest.mark.parametrize(("name", "loss_class", "objective"), [("dapo", DAPO, "ppo"), ("cispo", CISPOLoss, "cispo")])
def test_dapo_and_cispo_match_torchrl(actor, scored, advantage, name, loss_class, objective):
    """TorchRL's ``DAPO`` and ``CISPOLoss`` with clip-higher ``(0.2, 0.28)``, one advantage on every token. Their
    outputs are TorchRL's classes; the objective pairs tokens with advantages as in the GRPO test above (TorchRL's
    recorded value is the by-hand one with its right-padded advantage, ours the aligned one); ESS and the entropy
    term are TorchRL's."""
    theirs = GOLDEN[f"{name}_{advantage:+g}"]
    batch = collector_batch(scored)
    for i, row in enumerate(batch.unbind(0)):
        row.set("advantage", torch.full((len(GOLDEN["inputs"]["tokens"][i]), 1), advantage))
    out = loss_class(actor, masking_strategy="rlhf", clip_epsilon=(0.2, 0.28))(batch)
    assert type(out).__name__ == theirs["output_type"]
    same = [advantage, advantage]
    assert theirs["loss_objective"] == pytest.approx(by_hand("right", same, objective, (0.2, 0.28)), abs=1e-5)
    assert float(out.loss_objective) == pytest.approx(by_hand("left", same, objective, (0.2, 0.28)), abs=2e-4)
    for term in ("ESS", "loss_entropy"):
        assert float(getattr(out, term)) == pytest.approx(theirs[term], abs=2e-4), term
    out.loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.model.parameters())
    actor.model.zero_grad(set_to_none=True)
    if loss_class is CISPOLoss:
        with pytest.raises(ValueError, match="CISPOLoss is the 'cispo' objective"):
            CISPOLoss(actor, objective="ppo")


def distillation_batch(scored):
    """The scored chats carrying the golden file's teacher log-probs where ``RetrieveLogProb`` writes them."""
    rows = []
    for i, teacher in enumerate(GOLDEN["inputs"]["teacher_log_probs"]):
        row = scored[i].clone()
        row.set(("next", "teacher_log_probs", "full"), torch.tensor(teacher))
        rows.append(row)
    return lazy_stack(rows)


@pytest.mark.parametrize(
    ("case", "kwargs"),
    [
        ("reverse_mean", {"kl_direction": "reverse"}),
        ("forward_mean", {"kl_direction": "forward"}),
        ("reverse_sum_unnormalized", {"kl_direction": "reverse", "reduction": "sum", "normalize_by_seq_length": False}),
    ],
)
def test_distillation_loss_matches_torchrl(actor, scored, hf_model_fp32, case, kwargs):
    """``DistillationLoss(student)(td)`` on the assistant tokens equals TorchRL 0.14.1's on the same batch, and the
    chats alone (rendered with the tokenizer and the wrapper's template) give the loss of the scored batch."""
    _, tokenizer = hf_model_fp32
    theirs = GOLDEN[f"distill_{case}"]
    out = DistillationLoss(actor, tokenizer=tokenizer, **kwargs)(distillation_batch(scored))
    assert float(out.loss_distill) == pytest.approx(theirs["loss_distill"], abs=2e-4)
    assert float(out.kl_to_teacher) == pytest.approx(theirs["kl_to_teacher"], abs=2e-4)
    assert not out.kl_to_teacher.requires_grad
    out.loss_distill.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.model.parameters())
    actor.model.zero_grad(set_to_none=True)
    teacher = [torch.tensor(t) for t in GOLDEN["inputs"]["teacher_log_probs"]]
    chats_only = lazy_stack(
        [
            TensorDict(
                history=ChatHistory(full=History.from_chats([chat])[0]),
                next=TensorDict({("teacher_log_probs", "full"): teacher[i]}),
            )
            for i, chat in enumerate(GOLDEN["chats"])
        ]
    )
    # rendered as the wrapper rendered them when it scored (SmolLM2's own template would add a system prompt)
    rendered = DistillationLoss(
        actor, tokenizer=tokenizer, tokenizer_kwargs={"chat_template_name": "chatml_format"}, **kwargs
    )(chats_only)
    assert float(rendered.loss_distill) == pytest.approx(float(out.loss_distill), abs=1e-5)


def test_distillation_on_every_token_leaves_out_the_first_and_refuses_zero_filled_teachers(actor, scored):
    """With ``assistant_only=False`` TorchRL 0.14.1 also counts each chat's first token, which has no context (the
    student's log-prob there is a written 0.0, the teacher's whatever was given): its value is reproduced by hand
    with that token, llmrl's without it. Teacher log-probs zero-filled off the assistant tokens (what
    ``RetrieveLogProb(assistant_only=True)`` writes) are refused on every token, as TorchRL refuses them."""
    inputs = GOLDEN["inputs"]

    def reverse_k3_mean(skip_first: bool) -> float:
        per_chat = []
        for student, teacher in zip(inputs["log_probs"], inputs["teacher_log_probs"], strict=True):
            d = torch.tensor(teacher[skip_first:], dtype=torch.float64) - torch.tensor(student[skip_first:])
            per_chat.append((d.expm1() - d).mean())
        return float(torch.stack(per_chat).mean())

    assert GOLDEN["distill_reverse_all_tokens"]["loss_distill"] == pytest.approx(reverse_k3_mean(False), abs=1e-5)
    out = DistillationLoss(actor, assistant_only=False)(distillation_batch(scored))
    assert float(out.loss_distill) == pytest.approx(reverse_k3_mean(True), abs=2e-4)
    assert reverse_k3_mean(True) != pytest.approx(reverse_k3_mean(False), abs=1e-3)
    zero_filled = distillation_batch(scored)
    for row, mask in zip(zero_filled.unbind(0), inputs["assistant_mask"], strict=True):
        teacher = row.get(("next", "teacher_log_probs", "full"))
        row.set(("next", "teacher_log_probs", "full"), teacher * torch.tensor(mask, dtype=torch.float32))
    with pytest.raises(RuntimeError, match="exactly 0.0"):
        DistillationLoss(actor, assistant_only=False)(zero_filled)
    with pytest.raises(KeyError, match="Teacher log-probs not found"):
        DistillationLoss(actor)(collector_batch(scored))
    with pytest.raises(ValueError, match="kl_direction must be"):
        DistillationLoss(actor, kl_direction="both")


def test_sft_loss_on_chats_matches_torchrl(actor, hf_model_fp32):
    _, tokenizer = hf_model_fp32
    history = History.from_chats(GOLDEN["chats"])
    out = SFTLoss(actor, tokenizer=tokenizer)(
        TensorDict(history=ChatHistory(full=history, batch_size=(2,)), batch_size=(2,))
    )
    assert float(out.loss_sft) == pytest.approx(GOLDEN["sft"]["loss_sft"], abs=2e-4)
    with pytest.raises(ValueError, match="Reference log probs not found"):
        SFTLoss(actor, loss_function="minor_sft")(
            TensorDict(history=ChatHistory(full=history, batch_size=(2,)), batch_size=(2,))
        )


def test_a_torchrl_style_grpo_iteration_runs_end_to_end(hf_model_fp32):
    """A TorchRL user's GRPO step, with llmrl's imports: a tokens-mode env of whole groups, a TransformersWrapper
    sampling with log-probs, the collector, MCAdvantage, GRPOLoss on the batch, an optimizer step. The trainer's
    scores of the sampled tokens agree with the sampler's (same weights), and the step changes the weights."""
    from llmrl_core.collectors import LLMCollector
    from llmrl_core.data.tensor_specs import Unbounded
    from llmrl_core.envs import ChatEnv
    from llmrl_core.envs.tensordict_io import end_rows, responses_from_tensordict
    from llmrl_core.envs.transforms import Transform
    from llmrl_core.objectives import MCAdvantage

    model, tokenizer = hf_model_fp32

    class LengthReward(Transform):  # a reward that differs within a group: the answer's length, mod 5
        def transform_reward_spec(self, reward_spec):
            reward_spec["reward"] = Unbounded(shape=(*reward_spec.shape, 1))
            return reward_spec

        def _step(self, tensordict, next_tensordict):
            texts = [r.text for r in responses_from_tensordict(tensordict, tokenizer)]
            reward = torch.tensor([[float(len(t) % 5)] for t in texts])
            end_rows(next_tensordict, [True] * len(texts))
            return next_tensordict.set("reward", next_tensordict["reward"] + reward)

    prompts = [{"query": "What is 2 + 2?"}, {"query": "Name a colour."}]
    env = ChatEnv.from_dataloader(
        prompts, tokenizer=tokenizer, input_mode="tokens", batch_size=2, repeats=3, group_repeats=True
    )
    env.append_transform(LengthReward())
    policy = TransformersWrapper(
        model, tokenizer=tokenizer, input_mode="tokens", generate=True, return_log_probs=True,
        generate_kwargs={"max_new_tokens": 12, "do_sample": True, "temperature": 1.0},
    )  # fmt: skip
    collector = LLMCollector(env, policy=policy, dialog_turns_per_batch=6, total_dialog_turns=6)
    batch = next(iter(collector))
    assert batch.batch_size == (6, 1)  # TorchRL's layout: (env slots: 2 prompts x 3 repeats, steps)
    batch = MCAdvantage(grpo_size=3)(batch)  # read flattened, slot after slot
    assert batch.batch_size == (6,)
    by_group = {}
    for i in range(6):
        by_group.setdefault(batch[i]["group_id"], []).append(i)
    assert sorted(len(rows) for rows in by_group.values()) == [3, 3]
    for rows in by_group.values():
        rewards = batch.get("reward")[rows].reshape(-1)
        expected = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        torch.testing.assert_close(batch.get("advantage")[rows].reshape(-1), expected, atol=1e-5, rtol=0)

    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    out = GRPOLoss(policy, masking_strategy="rlhf")(batch)
    assert float(out.sampler_abs_diff_max) < 1e-3  # sampler and trainer score the same tokens alike
    assert float(out.ESS) == pytest.approx(1.0, abs=1e-3)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    changed = any(not torch.equal(a, p.detach()) for a, p in zip(before, model.parameters(), strict=True))
    with torch.no_grad():  # put the shared fixture's weights back
        for p, a in zip(model.parameters(), before, strict=True):
            p.copy_(a)
    assert changed


def test_a_torchrl_grpo_step_takes_the_reference_kl_from_retrieve_kl_in_the_env(hf_model_fp32):
    """TorchRL's way to a KL-to-reference term: ``RetrieveKL`` in a tokens-mode env, the collector, MCAdvantage
    grouping rows by their query (the prompts carry no group ids), ``GRPOLoss(kl_to_ref_coeff=...)`` reading
    ``("next", "ref_log_probs", "full")``. The reference log-probs of each answer equal the reference model's own
    teacher-forced scores, and the loss's KL term is the mean of k3 over the answer tokens."""
    import copy

    from llmrl_core.collectors import LLMCollector
    from llmrl_core.envs import ChatEnv
    from llmrl_core.envs.transforms.kl import RetrieveKL
    from llmrl_core.objectives import MCAdvantage

    model, tokenizer = hf_model_fp32
    ref_model = copy.deepcopy(model)
    with torch.no_grad():
        ref_model.model.norm.weight.mul_(1.05)  # another model: the KL is not 0

    def scorer(m, key):
        return TransformersWrapper(
            m, tokenizer=tokenizer, input_mode="tokens", generate=False, return_log_probs=True, log_probs_key=key
        )

    env = ChatEnv(batch_size=4, tokenizer=tokenizer, input_mode="tokens", system_prompt="Be brief.", max_turns=1)
    env.append_transform(
        RetrieveKL(scorer(model, "log_probs"), scorer(ref_model, "ref_log_probs"), assistant_only=False)
    )
    policy = TransformersWrapper(
        model, tokenizer=tokenizer, input_mode="tokens", generate=True, return_log_probs=True,
        generate_kwargs={"max_new_tokens": 6, "do_sample": True},
    )  # fmt: skip
    prompts = [{"query": "What is 2+3?"}] * 2 + [{"query": "Name a colour."}] * 2
    collector = LLMCollector(env, policy=policy, prompts=prompts, dialog_turns_per_batch=4, total_dialog_turns=4)
    batch = MCAdvantage(grpo_size=2)(next(iter(collector)))  # groups: the two queries
    assert batch.get("advantage").shape == (4, 1)

    k3, mask_sizes = [], []
    for i in range(4):
        ids = batch[i]["tokens", "full"]
        start = len(batch[i]["tokens", "prompt"])
        with torch.no_grad():
            logits = ref_model(ids[None]).logits[0, start - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(-1, ids[start:, None]).squeeze(-1)
        ref = batch[i]["next", "ref_log_probs", "full"]
        assert ref.shape == ids.shape
        torch.testing.assert_close(ref[start:], expected, atol=1e-4, rtol=0)
        gen = batch[i]["log_probs", "full"][start:]
        diff = ref[start:] - gen
        k3.append(torch.exp(diff) - diff - 1)
        mask_sizes.append(len(diff))
    out = GRPOLoss(policy, kl_to_ref_coeff=0.1)(batch)
    assert float(out.kl_to_ref) > 0
    assert float(out.kl_to_ref) == pytest.approx(float(torch.cat(k3).mean()), rel=1e-3)


def test_logits_only_and_get_dist_agree_with_the_wrappers_log_probs(actor, scored):
    """``logits_only=True`` gives per-token logits aligned with the tokens; ``get_dist`` is the masked categorical
    over them: its log-probs of the sequences are the wrapper's scores, masked by ``mask_key``."""
    td = TensorDict(history=ChatHistory(full=History.from_chats(GOLDEN["chats"])), batch_size=(2,))
    out = actor(td.copy(), logits_only=True)
    tokens = scored.get(("tokens", "full"), as_list=True)
    scores = scored.get(("log_probs", "full"), as_list=True)
    for logits, ids, expected in zip(out.get("logits", as_list=True), tokens, scores, strict=True):
        assert logits.shape == (len(ids), actor.model.config.vocab_size)
        got = torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(got.detach(), expected.detach(), atol=1e-4, rtol=0)
    dist = actor.get_dist(scored, mask_key=("masks", "all_assistant_mask"))
    padded_ids = torch.stack([torch.nn.functional.pad(t, (dist.mask.shape[1] - len(t), 0)) for t in tokens])
    log_probs = dist.log_prob(padded_ids)
    padded_scores = torch.stack([torch.nn.functional.pad(s, (dist.mask.shape[1] - len(s), 0)) for s in scores])
    torch.testing.assert_close(log_probs.detach(), torch.where(dist.mask, padded_scores, 0).detach(), atol=1e-4, rtol=0)
    assert int(dist.mask.sum()) == sum(sum(m) for m in GOLDEN["inputs"]["assistant_mask"])
    assert (dist.entropy()[dist.mask] > 0).all() and (dist.entropy()[~dist.mask] == 0).all()
    generating = TransformersWrapper(actor.model, tokenizer=actor.tokenizer, generate=True)
    with pytest.raises(NotImplementedError, match="get_dist is not implemented for generate=True"):
        generating.get_dist(td)


def test_distillation_from_retrieve_log_prob_as_torchrls_example(hf_model_fp32):
    """TorchRL's documented pipeline: ``RetrieveLogProb(teacher, log_probs_full_key=("teacher_log_probs", "full"))``
    writes the teacher's log-probs on a batch of chats, ``DistillationLoss(student)`` reads them (the template named
    in both). A teacher identical to the student gives a zero loss; the example itself, run in TorchRL 0.14.1 and
    here with a perturbed teacher, gave the same values (0.53425 reverse, 0.22775 forward; session note)."""
    from llmrl_core.data.history import _CHAT_TEMPLATES
    from llmrl_core.envs.transforms import RetrieveLogProb

    model, tokenizer = hf_model_fp32
    assert "chatml_format" in _CHAT_TEMPLATES and "qwen" in _CHAT_TEMPLATES
    history = History.from_chats(GOLDEN["chats"])
    kwargs = {"tokenizer": tokenizer, "generate": False, "chat_template_name": "qwen", "input_mode": "history"}
    student = TransformersWrapper(model, pad_output=False, **kwargs)
    teacher = TransformersWrapper(model, return_log_probs=True, pad_output=False, **kwargs)
    transform = RetrieveLogProb(
        teacher,
        log_probs_full_key=("teacher_log_probs", "full"),
        assistant_only=True,
        tokenizer_kwargs={"chat_template_name": "qwen"},
        tokenizer=tokenizer,
    )
    td = TensorDict(
        history=ChatHistory(full=history, prompt=history[..., :-1], response=history[..., -1:]),
        next=TensorDict(done=torch.zeros(2, dtype=torch.bool), history=ChatHistory(prompt=history)),
        batch_size=(2,),
    )
    with torch.no_grad():
        data = transform(lazy_stack(list(td.unbind(0))))
    teacher_rows = data.get(("next", "teacher_log_probs", "full"), as_list=True)
    assert all(float(r.sum()) < 0 for r in teacher_rows)
    loss = DistillationLoss(student, tokenizer=tokenizer, tokenizer_kwargs={"chat_template_name": "qwen"})
    out = loss(data)
    assert float(out.loss_distill) == pytest.approx(0.0, abs=1e-5)
    shifted = data.copy()
    for row in shifted.unbind(0):
        row.set(("next", "teacher_log_probs", "full"), row.get(("next", "teacher_log_probs", "full")) - 0.1)
    assert float(loss(shifted).loss_distill) == pytest.approx(torch.tensor(-0.1).expm1().item() + 0.1, abs=1e-5)
    # a padded teacher (pad_output=True): refused, as TorchRL 0.14.1 refuses it (a ValueError there too), saying why
    padded = RetrieveLogProb(
        TransformersWrapper(model, return_log_probs=True, pad_output=True, **kwargs),
        log_probs_full_key=("teacher_log_probs", "full"), assistant_only=True,
        tokenizer_kwargs={"chat_template_name": "qwen"}, tokenizer=tokenizer,
    )  # fmt: skip
    with torch.no_grad():
        data = padded(lazy_stack(list(td.unbind(0))))
    with pytest.raises(ValueError, match=r"look padded to the longest chat .*pad_output=False"):
        loss(data)


def test_set_keys_moves_where_each_loss_reads(actor, scored, hf_model_fp32):
    """TorchRL's ``loss.set_keys(...)``: the same batch under other keys gives the same loss once the keys are set;
    unset, the loss says which key it missed; an unknown name is refused; ``None`` restores the default."""
    _, tokenizer = hf_model_fp32
    batch = collector_batch(scored)
    expected = GRPOLoss(actor, masking_strategy="rlhf", entropy_bonus=False)(batch.copy())
    moved = batch.copy()
    moved.rename_key_("advantage", "my_advantage")
    moved.rename_key_(("log_probs", "full"), ("sampler", "lp"))
    loss = GRPOLoss(actor, masking_strategy="rlhf", entropy_bonus=False)
    with pytest.raises(ValueError, match="Advantage key advantage not in tensordict"):
        loss(moved.copy())
    loss.set_keys(advantage="my_advantage", sample_log_prob=("sampler", "lp"))
    assert loss.tensor_keys.advantage == "my_advantage" and GRPOLoss(actor).tensor_keys.advantage == "advantage"
    assert float(loss(moved.copy()).loss_objective) == pytest.approx(float(expected.loss_objective), abs=1e-6)
    with pytest.raises(ValueError, match="is not an accepted tensordict key"):
        loss.set_keys(advantages="x")
    loss.set_keys(advantage=None)
    assert loss.tensor_keys.advantage == "advantage"

    chats = TensorDict(my_chats=ChatHistory(full=History.from_chats(GOLDEN["chats"])), batch_size=(2,))
    sft = SFTLoss(actor, tokenizer=tokenizer)
    sft.set_keys(history=("my_chats", "full"))
    assert float(sft(chats).loss_sft) == pytest.approx(GOLDEN["sft"]["loss_sft"], abs=2e-4)

    distill = distillation_batch(scored)
    distill.rename_key_(("next", "teacher_log_probs", "full"), ("teacher", "lp"))
    loss = DistillationLoss(actor, tokenizer=tokenizer)
    with pytest.raises(KeyError, match="set_keys"):
        loss(distill.copy())
    loss.set_keys(teacher_log_prob=("teacher", "lp"))
    assert float(loss(distill).loss_distill) == pytest.approx(GOLDEN["distill_reverse_mean"]["loss_distill"], abs=2e-4)
