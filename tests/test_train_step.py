"""The train step: packing, micro-batch accumulation, one real step on the packaged model, LoRA, determinism."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from llmrl_core.modules.backends.transformers.scoring import render_chat_prompt, score_response_tokens
from llmrl_core.objectives import GRPOLoss, SFTLoss
from llmrl_core.trainer import (
    LoraOptions,
    Trainer,
    TrainerConfig,
    TrainSample,
    pack_samples,
    plan_micro_batches,
    score_packed,
)

# ------------------------------------------------------------------------------------------------ inputs


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Several agents share this 2-core machine; with 2 OpenMP threads under oversubscription a SmolLM2 forward
    pass took 3-4 s for 40 tokens, 0.2 s with 1 thread. Restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float64) -> LlamaForCausalLM:
    """A small randomly initialised Llama (same architecture as SmolLM2) for exact float64 accumulation checks."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config).to(dtype)


def tiny_samples(model: LlamaForCausalLM, n: int = 7, seed: int = 1) -> list[TrainSample]:
    """Ragged samples with tool-token masks, NaN sampler entries, off-policy sampler log-probs and ref log-probs."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        p = int(torch.randint(2, 9, (1,), generator=g))
        r = int(torch.randint(1, 12, (1,), generator=g))
        prompt = torch.randint(0, 97, (p,), generator=g).tolist()
        response = torch.randint(0, 97, (r,), generator=g).tolist()
        with torch.no_grad():
            lp = score_response_tokens(model, prompt, response).double()
        noise = 0.3 * torch.randn(r, generator=g, dtype=torch.float64)
        sampler = (lp + noise).tolist()
        mask = [not (i % 3 == 0 and t == r // 2) for t in range(r)]  # a "tool" token in some rows
        if i == 2:
            sampler[0] = math.nan
        samples.append(
            TrainSample(
                prompt,
                response,
                response_mask=mask,
                sampler_logprobs=sampler,
                advantage=float(torch.randn(1, generator=g)),
                ref_logprobs=(lp - 0.2 * noise).tolist(),
                sample_id=f"s{i}",
            )
        )
    return samples


def chat_samples(tokenizer) -> list[tuple[list[int], list[int]]]:
    qa = [
        ("What is 2+3?", ["2 + 3 = 5.", "It is 6."]),
        ("Name a color.", ["Blue.", "A dog."]),
        ("What is 4*2?", ["4 * 2 = 8.", "9"]),
    ]
    out = []
    for q, answers in qa:
        prompt = render_chat_prompt(tokenizer, [{"role": "user", "content": q}])
        for a in answers:
            out.append((prompt, tokenizer(a + "<|im_end|>", add_special_tokens=False)["input_ids"]))
    return out


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


def own_model(path: str) -> torch.nn.Module:
    """A private fp32 copy of the packaged model (never the shared hf_model_fp32 fixture: we train it)."""
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


# ------------------------------------------------------------------------------------------------ packing


def test_plan_micro_batches_first_fit_decreasing():
    lengths = [5, 9, 3, 12, 4, 4, 20]
    plan = plan_micro_batches(lengths, 12)
    assert sorted(i for b in plan for i in b) == list(range(len(lengths)))
    for b in plan:
        assert sum(lengths[i] for i in b) <= 12 or len(b) == 1
    assert [6] in plan  # longer than the budget: alone
    assert plan == plan_micro_batches(lengths, 12)
    # FFD over 20, 12, 9, 5, 4, 4, 3: the 3 joins the 9; 5 + 4 share a bin; the second 4 opens a new one.
    assert plan == [[6], [3], [1, 2], [0, 4], [5]]
    with pytest.raises(ValueError, match="token_budget"):
        plan_micro_batches(lengths, 0)


def test_train_sample_validation_names_sample_and_field():
    with pytest.raises(ValueError, match="TrainSample r7: field 'sampler_logprobs' has 2 entries"):
        TrainSample([1], [2, 3, 4], sampler_logprobs=[0.0, 0.0], sample_id="r7")
    with pytest.raises(ValueError, match="field 'prompt_ids' is empty"):
        TrainSample([], [2])
    with pytest.raises(ValueError, match="'advantage' is not finite"):
        TrainSample([1], [2], advantage=float("nan"))
    with pytest.raises(ValueError, match="trajectory row run1/p3/2: missing field 'response_tokens'"):
        TrainSample.from_row({"run_id": "run1", "prompt_id": "p3", "sample_index": 2, "prompt_tokens": [1]})
    s = TrainSample.from_row(
        {"prompt_tokens": [1, 2], "response_tokens": [3, 4], "response_mask": [True, False],
         "sampler_logprobs": [-1.0, -2.0], "ref_logprobs": None, "advantage": 0.5}
    )  # fmt: skip
    assert s.response_mask == [True, False] and s.advantage == 0.5 and s.ref_logprobs is None


def test_packed_log_probs_equal_unpacked(hf_model_fp32, tokenizer):
    """Packed scoring == one-sample-at-a-time scoring on the packaged model (read-only use of the fixture)."""
    model, _ = hf_model_fp32
    samples = [TrainSample(p, r) for p, r in chat_samples(tokenizer)]
    batch = pack_samples(samples)
    assert batch.num_tokens == sum(s.length for s in samples)  # no padding in the model input
    with torch.no_grad():
        packed = score_packed(model, batch).log_probs
        worst = 0.0
        for i, s in enumerate(samples):
            alone = score_response_tokens(model, s.prompt_ids, s.response_ids)
            worst = max(worst, float((packed[i, : len(alone)] - alone).abs().max()))
    # fp32 matmuls of different shapes differ by ~1e-5 on log-probs of magnitude ~5 (the float64 test below
    # shows the packing itself is exact); a leak across sequences would show up as O(1) differences.
    assert worst < 5e-5, worst


def test_packing_is_exact_in_float64(default_model_path, tokenizer):
    model = own_model(default_model_path).double().eval()
    samples = [TrainSample(p, r) for p, r in chat_samples(tokenizer)[:4]]
    with torch.no_grad():
        packed = score_packed(model, pack_samples(samples)).log_probs
        for i, s in enumerate(samples):
            alone = score_packed(model, pack_samples([s])).log_probs[0]
            assert float((packed[i, : len(alone)] - alone).abs().max()) < 1e-10
        # Changing the first sample's tokens leaves the others' log-probs bit-for-bit unchanged.
        changed = [TrainSample([7] * 9, [8] * len(samples[0].response_ids))] + samples[1:]
        again = score_packed(model, pack_samples(changed)).log_probs
    assert float((again[1:] - packed[1:]).abs().max()) < 1e-12


# ------------------------------------------------------------------------------------------------ accumulation


def grads_of(trainer: Trainer, samples) -> tuple[dict, list[torch.Tensor]]:
    metrics = trainer.backward(samples)
    return metrics, [p.grad.detach().clone() for p in trainer.params]


@pytest.mark.parametrize(
    "make_objective",
    [
        lambda m: GRPOLoss(m, kl_to_ref_coeff=0.1, kl_to_inference_coeff=0.05, clip_epsilon=(0.2, 0.28)),
        lambda m: GRPOLoss(m, aggregation="prompt_mean", entropy_coeff=0.02),
        lambda m: GRPOLoss(m, aggregation="sequence_sum", norm_constant=16, objective="cispo"),
        lambda m: SFTLoss(m, kl_to_ref_coeff=0.1),
        lambda m: SFTLoss(m, reduction="sum", normalize_by_seq_length=False),
    ],
    ids=["grpo-token_mean", "grpo-prompt_mean", "grpo-sequence_sum-cispo", "sft-mean", "sft-sum"],
)
def test_micro_batch_accumulation_equals_full_batch(make_objective):
    model = tiny_llama()
    samples = tiny_samples(model)
    one = Trainer(make_objective(model), TrainerConfig(token_budget=10_000, mixed_precision="no"))
    m_one, g_one = grads_of(one, samples)
    many = Trainer(make_objective(model), TrainerConfig(token_budget=24, mixed_precision="no"))
    m_many, g_many = grads_of(many, samples)
    assert m_one["num_micro_batches"] == 1 and m_many["num_micro_batches"] >= 4
    for a, b in zip(g_one, g_many, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-9)
    for key, value in m_one.items():
        if key.startswith("loss") or key in ("clip_fraction", "kl_approx", "entropy", "kl_to_ref", "kl_to_inference"):
            assert m_many[key] == pytest.approx(value, abs=1e-10), key


def test_gradient_checkpointing_gives_the_same_gradients():
    model = tiny_llama()
    samples = tiny_samples(model)
    _, plain = grads_of(Trainer(GRPOLoss(model), TrainerConfig(mixed_precision="no")), samples)
    ckpt_model = tiny_llama()
    trainer = Trainer(GRPOLoss(ckpt_model), TrainerConfig(mixed_precision="no", gradient_checkpointing=True))
    assert ckpt_model.model.gradient_checkpointing and ckpt_model.training
    _, ckpt = grads_of(trainer, samples)
    for a, b in zip(plain, ckpt, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-9)


def test_untrainable_batches_and_none_aggregation():
    model = tiny_llama()
    samples = tiny_samples(model, n=3)
    for s in samples:
        s.response_mask = [False] * len(s.response_ids)
    trainer = Trainer(GRPOLoss(model), TrainerConfig(mixed_precision="no", weight_decay=0.1))
    before = [p.detach().clone() for p in trainer.params]
    metrics = trainer.train_step(samples)
    assert metrics["skipped"] == 1.0 and metrics["step"] == 0.0
    assert all(torch.equal(a, p) for a, p in zip(before, trainer.params, strict=True))
    with pytest.raises(ValueError, match="scalar loss"):
        Trainer(GRPOLoss(model, aggregation="none"), TrainerConfig(mixed_precision="no")).train_step(
            tiny_samples(model)
        )
    with pytest.raises(ValueError, match="sampler_logprobs; missing for samples"):
        Trainer(GRPOLoss(model), TrainerConfig(mixed_precision="no")).train_step(
            [TrainSample([1, 2], [3], sample_id="x")]
        )


@pytest.mark.parametrize("aggregation", ["token_mean", "prompt_mean", "sequence_sum"])
def test_rows_left_out_with_zero_gradient_count_in_the_mean_as_if_trained(aggregation):
    """``train.exact_skip``: the zero-advantage rows are not run, yet the gradient is the whole batch's (their units
    join the normaliser); without them counted it is larger (the mean over the trained rows alone)."""
    model = tiny_llama()
    samples = tiny_samples(model, n=8)
    for s in samples[::2]:
        s.advantage, s.ref_logprobs = 0.0, None
    for s in samples[1::2]:
        s.ref_logprobs = None
    options = {"norm_constant": 16} if aggregation == "sequence_sum" else {}
    objective = GRPOLoss(model, entropy_bonus=False, aggregation=aggregation, **options)
    trainer = Trainer(objective, TrainerConfig(mixed_precision="no"))
    _, whole = grads_of(trainer, samples)
    signal, flat = samples[1::2], samples[::2]
    metrics = trainer.backward(signal, zero_gradient_rows=flat)
    left_out = [p.grad.detach().clone() for p in trainer.params]
    _, alone = grads_of(trainer, signal)
    for a, b in zip(whole, left_out, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-9)
    ratio = float(torch.cat([g.flatten() for g in alone]).norm() / torch.cat([g.flatten() for g in whole]).norm())
    assert ratio > 1.2, f"the trained rows' own mean should be larger than the whole batch's (ratio {ratio:.2f})"
    assert metrics["num_samples"] == len(signal)


def test_a_zero_gradient_step_is_the_step_of_a_batch_without_advantage():
    """What the flows take on a version with no group with signal (``train.skip_zero_signal_groups``): the
    optimizer step that training those zero-advantage rows would give (AdamW's momentum), without their compute."""
    model = tiny_llama()
    samples = tiny_samples(model)
    flat = [TrainSample(**{**vars(s), "advantage": 0.0, "ref_logprobs": None}) for s in samples]
    fresh = Trainer(GRPOLoss(tiny_llama(), entropy_bonus=False), TrainerConfig(mixed_precision="no"))
    untouched = [p.detach().clone() for p in fresh.params]
    assert fresh.zero_gradient_step()["step"] == 1.0  # no momentum yet: the weights stay
    assert all(torch.equal(a, p) for a, p in zip(untouched, fresh.params, strict=True))

    trained, skipped = (
        Trainer(GRPOLoss(tiny_llama(), entropy_bonus=False), TrainerConfig(mixed_precision="no")) for _ in range(2)
    )
    for trainer in (trained, skipped):
        trainer.train_step(samples)
    after_one = [p.detach().clone() for p in trained.params]
    metrics = trained.train_step(flat)  # the rows trained: their gradient is zero, the step is taken
    assert metrics["grad_norm"] == 0.0 and metrics["step"] == 2.0
    assert skipped.zero_gradient_step()["step"] == 2.0
    for a, b in zip(trained.params, skipped.params, strict=True):
        torch.testing.assert_close(a, b, atol=0.0, rtol=0.0)
    moved = max(float((a - before).abs().max()) for a, before in zip(skipped.params, after_one, strict=True))
    assert moved > 0.5 * trained.config.lr, f"the momentum step moved the weights by only {moved:.2e}"


# ------------------------------------------------------------------------------------------------ real model


def grpo_batch(model, tokenizer) -> list[TrainSample]:
    samples = []
    for k, (prompt, response) in enumerate(chat_samples(tokenizer)):
        with torch.no_grad():
            sampler = score_response_tokens(model, prompt, response)
        samples.append(TrainSample(prompt, response, sampler_logprobs=sampler, advantage=1.0 if k % 2 == 0 else -1.0))
    return samples


def test_one_real_grpo_step_lowers_the_loss(default_model_path, tokenizer):
    model = own_model(default_model_path)
    samples = grpo_batch(model, tokenizer)
    trainer = Trainer(GRPOLoss(model, entropy_bonus=False), TrainerConfig(lr=2e-6, token_budget=160))
    before = trainer.evaluate(samples)["loss"]
    metrics = trainer.train_step(samples)
    after = trainer.evaluate(samples)["loss"]
    expected_keys = {"loss", "loss_objective", "clip_fraction", "kl_approx", "ESS", "grad_norm", "lr", "num_tokens",
                     "num_loss_tokens", "num_micro_batches", "step_time_s", "tokens_per_s", "step"}  # fmt: skip
    assert expected_keys <= set(metrics)
    assert metrics["num_micro_batches"] >= 2 and metrics["ESS"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["loss"] == pytest.approx(before, abs=1e-6)
    assert after < before - 1e-3, (before, after)


def test_one_real_sft_step_lowers_the_loss(default_model_path, tokenizer):
    model = own_model(default_model_path)
    samples = [TrainSample(p, r) for p, r in chat_samples(tokenizer)[::2]]
    trainer = Trainer(SFTLoss(model), TrainerConfig(lr=5e-6))
    before = trainer.evaluate(samples)["loss"]
    trainer.train_step(samples)
    after = trainer.evaluate(samples)["loss"]
    assert after < before - 1e-3, (before, after)


def test_trainer_score_matches_reference(hf_model_fp32, default_model_path, tokenizer):
    model = own_model(default_model_path)
    trainer = Trainer(SFTLoss(model), TrainerConfig(token_budget=100))
    samples = [TrainSample(p, r) for p, r in chat_samples(tokenizer)]
    scored = trainer.score(samples)
    ref_model, _ = hf_model_fp32
    for s, lp in zip(samples, scored, strict=True):
        assert len(lp) == len(s.response_ids)
        torch.testing.assert_close(torch.tensor(lp), score_response_tokens(ref_model, s.prompt_ids, s.response_ids),
                                   atol=5e-5, rtol=0)  # fmt: skip


def lora_trainer(path: str, tokenizer, seed: int) -> tuple[Trainer, list[TrainSample]]:
    model = own_model(path)
    samples = grpo_batch(model, tokenizer)
    config = TrainerConfig(lr=1e-3, seed=seed, lora=LoraOptions(r=4, alpha=8, target_modules=("q_proj", "v_proj")))
    return Trainer(GRPOLoss(model, entropy_bonus=False), config), samples


def adapter_tensors(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.named_parameters() if "lora_" in k}


def test_lora_step_export_and_merge(default_model_path, tokenizer, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file

    trainer, samples = lora_trainer(default_model_path, tokenizer, seed=0)
    base_before = {k: v.detach().clone() for k, v in trainer.model.named_parameters() if "lora_" not in k}
    lora_before = adapter_tensors(trainer)
    before = trainer.evaluate(samples)["loss"]
    trainer.train_step(samples)
    after = trainer.evaluate(samples)["loss"]
    assert after < before
    for k, v in trainer.model.named_parameters():
        if "lora_" in k:
            assert k in lora_before
        else:
            assert torch.equal(v, base_before[k]), k  # base weights frozen
    assert any(not torch.equal(v, lora_before[k]) for k, v in adapter_tensors(trainer).items())

    out = trainer.export_adapter(tmp_path / "adapter")
    files = {p.name for p in out.iterdir()} - {"README.md"}  # peft also writes a model card
    assert files == {"adapter_config.json", "adapter_model.safetensors"}
    weights = load_file(out / "adapter_model.safetensors")
    assert weights and all("lora_" in k for k in weights)  # adapter only, no base weights
    assert sum(v.numel() for v in weights.values()) < 1_000_000
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4
    trainer.export_adapter(out)  # overwriting an existing export works (atomic replace)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left

    probe = torch.tensor([samples[0].prompt_ids + samples[0].response_ids])
    with torch.no_grad():
        trained = trainer.model(input_ids=probe).logits
        reloaded = PeftModel.from_pretrained(own_model(default_model_path), out).eval()
        torch.testing.assert_close(reloaded(input_ids=probe).logits, trained, atol=1e-4, rtol=0)
        merged = own_model(default_model_path).eval()
        merged.load_state_dict(trainer.state_dict_for_inference(), strict=True)
        # merged W + BA sums in another fp32 order than W x + B(A x): 1.1e-4 seen on an AVX-512 CPU
        torch.testing.assert_close(merged(input_ids=probe).logits, trained, atol=5e-4, rtol=0)
    with pytest.raises(ValueError, match="LoRA"):
        Trainer(SFTLoss(tiny_llama()), TrainerConfig()).export_adapter(tmp_path / "x")


def test_deterministic_on_cpu_with_a_seed(default_model_path, tokenizer):
    runs = []
    for seed in (7, 7, 8):
        trainer, samples = lora_trainer(default_model_path, tokenizer, seed=seed)
        m1 = trainer.train_step(samples)
        m2 = trainer.train_step(samples)
        runs.append((adapter_tensors(trainer), m1["loss"], m2["loss"]))
        del trainer
    (a, a1, a2), (b, b1, b2), (c, *_) = runs
    assert a1 == b1 and a2 == b2
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)  # another seed, another LoRA init


@pytest.mark.gpu
def test_bf16_autocast_step_on_gpu(default_model_path, tokenizer):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (bf16 autocast path); run on the device machine")
    model = own_model(default_model_path).cuda()
    samples = grpo_batch(model, tokenizer)
    trainer = Trainer(GRPOLoss(model, entropy_bonus=False), TrainerConfig(lr=2e-6))
    assert trainer._autocast().fast_dtype == torch.bfloat16  # mixed_precision="auto" on CUDA
    before = trainer.evaluate(samples)["loss"]
    metrics = trainer.train_step(samples)
    after = trainer.evaluate(samples)["loss"]
    assert math.isfinite(metrics["grad_norm"]) and after < before
    assert next(model.parameters()).dtype == torch.float32  # weights stay fp32, compute in bf16
