"""Sampler/trainer agreement on the resident trainer: real engine samples at T = 0.7, the trainer's first-step
diagnostics, and the alarm when the trainer holds other weights than the engine that sampled."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from llmrl_core.builtin_data import load_gsm8k
from llmrl_core.modules.backends.transformers.scoring import render_chat_prompt
from llmrl_core.modules.backends.vllm.engine import generate
from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig
from storage.handoff import SharedWeights
from storage.layout import RunLayout
from storage.schema import TrajectoryRecord
from storage.trajectories import TrajectoryStore


def _sampled_records(engine, tokenizer, logprobs_mode="processed_logprobs", temperature=0.7):
    questions = [r["question"] for r in load_gsm8k("test", 3)]
    prompts = [render_chat_prompt(tokenizer, [{"role": "user", "content": q}]) for q in questions]
    results = generate(engine, [p for p in prompts for _ in range(2)], max_tokens=32, temperature=temperature, seed=7)
    records = []
    for i, [completion] in enumerate(results):
        records.append(
            TrajectoryRecord(
                run_id="agree",
                policy_version=0,
                prompt_id=str(i // 2),
                group_id=f"g{i // 2}",
                sample_index=i % 2,
                messages=[{"role": "user", "content": questions[i // 2]}],
                prompt_tokens=list(completion.prompt_token_ids),
                response_tokens=completion.token_ids,
                response_mask=[True] * len(completion.token_ids),
                sampler_logprobs=completion.logprobs,
                reward=float(i % 2),
                advantage=1.0 if i % 2 else -1.0,
                finish_reason=completion.finish_reason or "length",
                model_id="default",
                sampling_params={"temperature": temperature, "logprobs_mode": logprobs_mode, "max_tokens": 32},
            )
        )
    return records


@pytest.fixture(scope="module")
def trainer_worker(tmp_path_factory, default_model_path):
    from runtime.trainer_actor import TrainerWorker

    runs = tmp_path_factory.mktemp("runs")
    overrides = [
        "run_id=agree",
        "progress=false",
        "train.lr=1e-6",
        "rollout.temperature=0.7",
        "train.mixed_precision=no",
    ]
    cfg = load_config(GRPOConfig, None, overrides)
    return TrainerWorker(cfg, default_model_path, RunLayout(cfg.run_id, runs))


def _train(worker, tmp_path, records):
    store = TrajectoryStore(tmp_path / "store")
    store.write_shard("agree", 0, 0, records)
    return worker.train(str(tmp_path / "store"), 0)


def test_fp32_engine_and_trainer_agree_at_the_sampling_temperature(vllm_engine_fp32, trainer_worker, tmp_path):
    tokenizer = vllm_engine_fp32.get_tokenizer()
    state = {k: v.clone() for k, v in trainer_worker.model.state_dict().items()}
    try:
        metrics = _train(trainer_worker, tmp_path, _sampled_records(vllm_engine_fp32, tokenizer))
    finally:
        trainer_worker.model.load_state_dict(state)
    assert metrics["train_samples"] == 6
    assert metrics["agreement_abs_diff_mean"] < 1e-3, metrics
    assert metrics["agreement_abs_diff_max"] < 2e-2, metrics
    assert 0 <= metrics["agreement_kl_to_sampler"] < 1e-5
    assert metrics["agreement_ess"] > 0.999
    assert metrics["agreement_off"] == 0.0
    assert metrics["agreement_abs_diff_max"] >= metrics["agreement_abs_diff_mean"]


def test_rows_with_raw_logprobs_are_scored_at_temperature_one(vllm_engine_fp32, trainer_worker, tmp_path):
    """A row that says its log-probs are raw (T = 1 distribution) is scored at T = 1 although sampled at 0.7."""

    tokenizer = vllm_engine_fp32.get_tokenizer()
    records = _sampled_records(vllm_engine_fp32, tokenizer, temperature=1.0)
    for r in records:  # sampled at T = 1 (processed == raw), labelled as raw log-probs of a T = 0.7 sampler
        r.sampling_params = {"temperature": 0.7, "logprobs_mode": "raw_logprobs"}
    state = {k: v.clone() for k, v in trainer_worker.model.state_dict().items()}
    try:
        metrics = _train(trainer_worker, tmp_path, records)
    finally:
        trainer_worker.model.load_state_dict(state)
    assert metrics["agreement_abs_diff_mean"] < 1e-3, metrics


def test_a_trainer_holding_other_weights_is_flagged(vllm_engine_fp32, trainer_worker, tmp_path):
    """What a broken weight publish looks like from the trainer: the engine sampled with other weights."""
    tokenizer = vllm_engine_fp32.get_tokenizer()
    records = _sampled_records(vllm_engine_fp32, tokenizer)
    state = {k: v.clone() for k, v in trainer_worker.model.state_dict().items()}
    try:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in trainer_worker.model.model.layers[-1].parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        metrics = _train(trainer_worker, tmp_path, records)
    finally:
        trainer_worker.model.load_state_dict(state)
    assert metrics["agreement_abs_diff_mean"] > trainer_worker.cfg.train.agreement_warn, metrics
    assert metrics["agreement_off"] == 1.0
    assert metrics["agreement_ess"] < 0.99


def test_one_micro_batch_takes_the_first_rows_within_the_token_budget():
    from runtime.trainer_actor import one_micro_batch

    rows = [SimpleNamespace(length=n) for n in (50, 60, 70)]
    assert one_micro_batch(rows, SimpleNamespace(token_budget=120)) == rows[:2]
    assert one_micro_batch(rows, SimpleNamespace(token_budget=10)) == rows[:1]  # one row even when over budget
    assert one_micro_batch(rows, SimpleNamespace(token_budget=180)) == rows


def test_with_no_signal_one_micro_batch_measures_the_agreement_and_only_momentum_steps(
    vllm_engine_fp32, trainer_worker, tmp_path, monkeypatch
):
    """Every group's rewards equal: no row is trained (no loss); with ``train.exact_skip`` the optimizer takes
    its zero-gradient step (what training those zero-advantage rows would give: AdamW's momentum, the same weights as
    torch's AdamW stepping on zeros from the same state), without it nothing moves; the agreement comes from a
    forward pass over the rows of one micro-batch (here 2 of the 6 rows) — still enough to flag a trainer holding
    other weights."""
    records = _sampled_records(vllm_engine_fp32, vllm_engine_fp32.get_tokenizer())
    for r in records:
        r.reward, r.advantage = 1.0, 0.0
    lengths = [len(r.prompt_tokens) + len(r.response_tokens) for r in records]
    budget = lengths[0] + lengths[1]
    monkeypatch.setattr(trainer_worker.cfg.train, "token_budget", budget)
    monkeypatch.setattr(trainer_worker.cfg.train, "skip_zero_signal_groups", True)
    monkeypatch.setattr(trainer_worker.cfg.train, "exact_skip", True)
    scored: list[int] = []
    evaluate = trainer_worker.trainer.evaluate
    monkeypatch.setattr(
        trainer_worker.trainer, "evaluate", lambda samples: scored.append(len(samples)) or evaluate(samples)
    )
    state = {k: v.clone() for k, v in trainer_worker.model.state_dict().items()}
    optimizer_state = copy.deepcopy(trainer_worker.trainer.optimizer.state_dict())
    step = trainer_worker.trainer.step_count
    # the reference: torch's AdamW from the same state, one step on zero gradients
    reference = [p.detach().clone().requires_grad_(True) for p in trainer_worker.trainer.params]
    adamw = torch.optim.AdamW(reference)
    adamw.load_state_dict(copy.deepcopy(optimizer_state))
    for p in reference:
        p.grad = torch.zeros_like(p)
    adamw.step()
    try:
        same = _train(trainer_worker, tmp_path / "same", records)
        for got, want in zip(trainer_worker.trainer.params, reference, strict=True):
            torch.testing.assert_close(got.detach(), want.detach(), atol=0.0, rtol=0.0)
        trainer_worker.model.load_state_dict(state)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in trainer_worker.model.model.layers[-1].parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        other = _train(trainer_worker, tmp_path / "other", records)
        trainer_worker.model.load_state_dict(state)
        monkeypatch.setattr(trainer_worker.cfg.train, "exact_skip", False)  # the default: no step at all
        before = trainer_worker.trainer.step_count
        still = _train(trainer_worker, tmp_path / "still", records)
        assert trainer_worker.trainer.step_count == before and "zero_gradient_step" not in still
        assert all(torch.equal(v, state[k]) for k, v in trainer_worker.model.state_dict().items())
    finally:
        trainer_worker.model.load_state_dict(state)
        trainer_worker.trainer.optimizer.load_state_dict(optimizer_state)
        trainer_worker.trainer.step_count = step
    assert scored == [2, 2, 2]
    assert same["train_samples"] == 0 and "loss" not in same and same["zero_gradient_step"] == 1.0
    assert same["step"] == step + 1 and other["step"] == step + 2
    assert same["agreement_abs_diff_mean"] < 1e-3 and same["agreement_off"] == 0.0, same
    assert other["agreement_abs_diff_mean"] > trainer_worker.cfg.train.agreement_warn, other
    assert other["agreement_off"] == 1.0


def test_trainer_worker_takes_the_loss_menu_lora_and_checkpointing_from_the_config(
    vllm_engine_fp32, default_model_path, tmp_path, monkeypatch
):
    """LoRA + gradient checkpointing + GSPO + sequence-level TIS + RLOO-ready rows: the options reach the loss,
    a step trains only the adapters, the published checkpoint holds merged Hugging Face weights, and a resume
    restores the adapters."""
    from safetensors.torch import load_file

    from runtime.trainer_actor import TrainerWorker
    from storage.checkpoints import CheckpointStore

    overrides = [
        "run_id=agree",
        "progress=false",
        "train.lr=1e-4",
        "rollout.temperature=0.7",
        "train.mixed_precision=no",
        "train.lora.enabled=true",
        "train.lora.r=4",
        "train.gradient_checkpointing=true",
        "train.importance_level=sequence",
        "train.clip_epsilon=0.0003",
        "train.clip_epsilon_high=0.0004",
        "train.tis.cap=2",
        "train.tis.level=sequence",
    ]
    cfg = load_config(GRPOConfig, None, overrides)
    runs = tmp_path / "runs"
    worker = TrainerWorker(cfg, default_model_path, RunLayout(cfg.run_id, runs))
    options = worker.trainer.objective.options
    assert options["importance_level"] == "sequence" and options["tis_level"] == "sequence"
    assert options["clip_epsilon"] == (0.0003, 0.0004)
    assert worker.trainer.model.is_gradient_checkpointing
    base = worker.trainer.state_dict_for_inference()  # merged before any step: the base weights
    metrics = _train(worker, tmp_path, _sampled_records(vllm_engine_fp32, vllm_engine_fp32.get_tokenizer()))
    assert metrics["step"] == 1 and metrics["agreement_abs_diff_mean"] < 1e-3
    adapters = worker._lora_state()
    assert adapters and all("lora_" in k for k in adapters)
    worker.publish(1, {"test": True})
    published = CheckpointStore(worker.layout.checkpoints_dir).load(1).state_dict
    assert not [k for k in published if "lora_" in k or "base_layer" in k]
    changed = [k for k, v in published.items() if k in base and not torch.allclose(v, base[k])]
    assert changed and all("proj" in k for k in changed)  # merged LoRA deltas, only on the adapted linears
    store = CheckpointStore(worker.layout.checkpoints_dir)
    staged = worker.stage(2, {"test": True})  # the file the engines load: written, not yet a version
    assert Path(staged["checkpoint"]).is_file() and store.versions() == [1]
    with pytest.raises(RuntimeError, match=r"seal\(3\) without stage\(3\) first \(staged: 2\)"):
        worker.seal(3, {"test": True})
    sealed = worker.seal(2, {"test": True})
    assert store.versions() == [1, 2] and sealed["sha256"] == store.manifest(2).sha256
    assert store.manifest(2).parent_version == 1 and store.load(2).manifest.num_tensors > 0  # sha256 verified

    fresh = TrainerWorker(cfg, default_model_path, RunLayout(cfg.run_id, runs))
    fresh.restore(1)
    restored = fresh._lora_state()
    assert all(torch.equal(restored[k], v) for k, v in adapters.items())
    assert fresh.trainer.step_count == 1
    monkeypatch.setattr("storage.handoff.SHARED_MEMORY", tmp_path / "shm")
    (tmp_path / "shm").mkdir()
    assert worker.share_weights("bfloat16")  # engines on the trainer's host: new weights go through shared memory
    staged = worker.stage(3, {"test": True})
    shared = Path(staged["checkpoint"])
    assert shared.parent == tmp_path / "shm" / f"llmrl-handoff-{os.getpid()}"
    merged = worker.trainer.state_dict_for_inference()
    engine_view = load_file(shared)
    assert set(engine_view) <= set(merged) and "model.embed_tokens.weight" in engine_view
    assert all(engine_view[k].dtype == torch.bfloat16 for k in engine_view)
    assert all(torch.equal(engine_view[k], merged[k].to(torch.bfloat16)) for k in engine_view)
    assert not store.weights_path(3).exists() and store.versions() == [1, 2]  # the checkpoint comes with the seal
    sealed = worker.seal(3, {"test": True})
    assert store.versions() == [1, 2, 3] and sealed["sha256"] == store.manifest(3).sha256
    stored = store.load(3)  # sha256 verified
    assert stored.manifest.parent_version == 2 and stored.manifest.dtypes == {"float32": stored.manifest.num_tensors}
    assert all(torch.equal(stored.state_dict[k], merged[k]) for k in engine_view)  # full precision in the store
    # /dev/shm full when the handoff file must be made anew (here: a new one): the version goes through its
    # checkpoint file, and the flow is told once (the note), and once more when shared memory has room again
    worker._shared = SharedWeights(torch.bfloat16)
    with monkeypatch.context() as full:
        full.setattr("storage.handoff.shutil.disk_usage", lambda root: SimpleNamespace(free=0))
        staged = worker.stage(4, {"test": True})
    assert staged["checkpoint"] == str(store.weights_path(4)) and "lacks room for twice the weights" in staged["note"]
    assert str(tmp_path / "shm") in staged["note"]
    worker.seal(4, {"test": True})
    staged = worker.stage(5, {"test": True})
    assert Path(staged["checkpoint"]).parent.parent == tmp_path / "shm" and "room again" in staged["note"]
    assert "note" not in worker.stage(5, {"test": True})  # said once per change
