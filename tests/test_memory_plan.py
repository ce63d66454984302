"""The memory plan (llmrl_core/memory_plan.py, `llmrl plan`): parameter counts and plan figures against hand
computations for two public model configs, the packaged model against transformers' own count, and the refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmrl_core.memory_plan import GIB, ModelShape, PlanInputs, memory_plan, over_budget, render, totals

# The public config.json sizes of Qwen2.5-0.5B (tied embeddings) and Qwen2.5-7B (untied); Qwen2 has q/k/v biases.
QWEN_05B = {
    "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864, "tie_word_embeddings": True,
}  # fmt: skip
QWEN_7B = {
    "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944, "tie_word_embeddings": False,
}  # fmt: skip


def test_parameter_counts_match_the_published_ones():
    # 0.5B, by hand: per layer q 896*896+896, k and v 896*128+128 each, o 896*896, MLP 3*896*4864, norms 2*896
    # = 14,912,384; x 24 = 357,897,216; + embeddings 151936*896 = 136,134,656; + final norm 896
    assert ModelShape.from_config(QWEN_05B).parameters() == 494_032_768
    # 7B: per layer 12,848,640 + 2 * 1,835,520 + 12,845,056 + 203,685,888 + 7,168 = 233,057,792; x 28 =
    # 6,525,618,176; + embeddings and LM head 2 * 152064*3584 = 1,089,994,752; + 3,584
    assert ModelShape.from_config(QWEN_7B).parameters() == 7_615_616_512


def test_the_packaged_models_count_is_transformers(hf_model_fp32, default_model_path):
    model, _ = hf_model_fp32
    assert ModelShape.from_model_dir(default_model_path).parameters() == sum(p.numel() for p in model.parameters())


def test_a_7b_plan_on_two_80gb_gpus_by_hand():
    shape = ModelShape.from_config(QWEN_7B)
    n = 7_615_616_512
    inputs = PlanInputs(
        trainer_device="cuda:0",
        engine_devices=("cuda:1",),
        token_budget=2048,
        engine_dtype_bytes=2,
        gpu_memory_utilization=0.9,
        device_memory={"cuda:0": 80 * GIB, "cuda:1": 80 * GIB},
    )
    lines = {line.item: line.bytes for line in memory_plan(shape, inputs)}
    assert lines["trainer weights"] == 4 * n == 30_462_466_048
    assert lines["gradients"] == 4 * n and lines["optimizer state"] == 8 * n
    assert lines["activations"] == 2048 * 28 * 3584 * 34 == 6_987_710_464
    assert lines["logits"] == 2048 * 152064 * 8 == 2_491_416_576
    assert lines["engine 0 weights"] == 2 * n == 15_231_233_024
    assert lines["engine 0 KV cache"] == int(0.9 * 80 * GIB) - 2 * n  # vLLM's reservation minus the weights
    assert shape.kv_bytes_per_token(2) == 2 * 28 * 4 * 128 * 2 == 57_344
    capacity = {"cuda:0": 80 * GIB, "cuda:1": 80 * GIB}
    (problem,) = over_budget(memory_plan(shape, inputs), capacity, shape, inputs)
    # 16 bytes/param (113.5 GiB) + activations (6.5 GiB) + logits (2.3 GiB) on the trainer's GPU
    assert (16 * n + 6_987_710_464 + 2_491_416_576) / GIB == pytest.approx(122.3, abs=0.05)
    assert problem.startswith("cuda:0: the plan needs 122.3 GiB and the device has 80.0 GiB")
    assert "train.lora" in problem
    # LoRA r=16 on every projection: the trainer keeps fp32 weights but trains 40,370,176 parameters
    lora = shape.lora_parameters(16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    assert lora == 28 * 16 * ((3584 + 3584) * 2 + (3584 + 512) * 2 + (3584 + 18944) * 3) == 40_370_176
    fitted = PlanInputs(**{**inputs.__dict__, "trainable_parameters": lora})
    assert over_budget(memory_plan(shape, fitted), capacity, shape, fitted) == []
    assert totals(memory_plan(shape, fitted))["cuda:0"] < 80 * GIB


def test_data_parallel_ranks_each_hold_a_whole_trainer_by_hand():
    """train.data_parallel=2 on 3 GPUs (the local plan: ranks on GPUs 0 and 1, the engine on 2): rank 1's GPU holds
    a second trainer (weights, gradients, AdamW state, activations, logits) and no reference model; on CPU both
    ranks count against the host's memory."""
    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig
    from runtime.memory_check import plan_run

    shape = ModelShape.from_config(QWEN_05B)
    n = 494_032_768
    inputs = PlanInputs(
        trainer_device="cuda:0", engine_devices=("cuda:2",), other_trainer_ranks=("cuda:1",), reference_model=True
    )
    lines = memory_plan(shape, inputs)
    rank1 = {line.item: line.bytes for line in lines if line.device == "cuda:1"}
    assert rank1 == {
        "rank 1 trainer weights": 4 * n,
        "rank 1 gradients": 4 * n,
        "rank 1 optimizer state": 8 * n,
        "rank 1 activations": 2048 * 24 * 896 * 34,
        "rank 1 logits": 2048 * 151936 * 8,
    }
    assert totals(lines)["cuda:1"] == 16 * n + 2048 * 24 * 896 * 34 + 2048 * 151936 * 8
    assert totals(lines)["cuda:0"] == totals(lines)["cuda:1"] + 2 * n  # rank 0 also holds the reference (bf16)

    cfg = load_config(GRPOConfig, None, ["train.data_parallel=2", "train.device=cuda", "model=default"])
    plan = plan_run(cfg, gpus=["0", "1", "2"], capacity={"cpu": 64 * GIB, **{f"cuda:{g}": 80 * GIB for g in "012"}})
    assert plan.inputs.trainer_device == "cuda:0" and plan.inputs.other_trainer_ranks == ("cuda:1",)
    assert plan.inputs.engine_devices == ("cuda:2",)
    cpu = plan_run(load_config(GRPOConfig, None, ["train.data_parallel=3", "train.device=cpu"]), gpus=[])
    assert cpu.inputs.other_trainer_ranks == ("cpu", "cpu")


def test_one_gpu_shared_by_trainer_and_engine_and_a_kv_cache_too_small():
    shape = ModelShape.from_config(QWEN_05B)
    inputs = PlanInputs(
        trainer_device="cuda:0", engine_devices=("cuda:0",), gpu_memory_utilization=0.9,
        device_memory={"cuda:0": 24 * GIB}, max_model_len=32768,
    )  # fmt: skip
    problems = over_budget(memory_plan(shape, inputs), {"cuda:0": 24 * GIB}, shape, inputs)
    assert any(p.startswith("cuda:0: the plan needs") for p in problems)  # the engine reserves 90 % of the GPU
    small = PlanInputs(engine_devices=("cpu",), cpu_kv_cache_bytes=GIB // 64, max_model_len=32768)
    (kv,) = over_budget(memory_plan(shape, small), {"cpu": 1 << 50}, shape, small)
    assert "engine 0 KV cache holds 1365 tokens" in kv and "rollout.max_model_len" in kv  # 12,288 bytes/token
    with pytest.raises(ValueError, match=r"config.json: hidden_size must be a positive integer"):
        ModelShape.from_config({**QWEN_05B, "hidden_size": None})


def test_an_engine_that_sleeps_while_the_trainer_trains_shares_one_gpu_by_hand():
    shape = ModelShape.from_config(QWEN_05B)
    base = dict(trainer_device="cuda:0", engine_devices=("cuda:0",), gpu_memory_utilization=0.5,
                device_memory={"cuda:0": 24 * GIB}, token_budget=4096, max_model_len=4096)  # fmt: skip
    awake, asleep = PlanInputs(**base), PlanInputs(**base, engine_sleep_level=1)
    resident = 16 * 494_032_768  # fp32 weights, gradients and AdamW moments: 7,904,524,288 bytes
    training = 4096 * 24 * 896 * 34 + 4096 * 151_936 * 8  # activations 2,994,733,056 + logits 4,978,638,848
    sampling = 12 * GIB  # vLLM's reservation: 0.5 x 24 GiB, weights and KV cache
    assert totals(memory_plan(shape, awake))["cuda:0"] == resident + training + sampling  # 26.8 GiB: all at once
    (problem,) = over_budget(memory_plan(shape, awake), {"cuda:0": 24 * GIB}, shape, awake)
    assert problem.startswith("cuda:0: the plan needs 26.8 GiB") and "rollout.sleep_level=1" in problem
    lines = memory_plan(shape, asleep)
    assert totals(lines)["cuda:0"] == resident + max(training, sampling)  # 19.4 GiB: the larger phase
    assert over_budget(lines, {"cuda:0": 24 * GIB, "cpu": 64 * GIB}, shape, asleep) == []
    parked = [line for line in lines if line.device == "cpu"]  # level 1: the weights wait in host memory
    assert [(p.item, p.bytes, p.phase) for p in parked] == [("engine 0 weights asleep", 2 * 494_032_768, "train")]
    assert "peak (the larger phase)" in render(lines) and "(while sampling)" in render(lines)
    assert not [line for line in memory_plan(shape, PlanInputs(**base, engine_sleep_level=2)) if line.device == "cpu"]
    cpu_engine = PlanInputs(engine_devices=("cpu",), engine_sleep_level=1)  # CPU engines never sleep
    assert all(line.phase != "rollout" for line in memory_plan(shape, cpu_engine))


def test_the_cuda_ipc_copy_counts_while_the_engines_load_it_by_hand():
    """rollout.weight_sync=cuda_ipc: the trainer's fp32 copy of the weights (4 x N) sits beside the awake engine,
    not beside the training activations."""
    shape = ModelShape.from_config(QWEN_05B)
    base = dict(trainer_device="cuda:0", engine_devices=("cuda:0",), gpu_memory_utilization=0.5, engine_sleep_level=1,
                device_memory={"cuda:0": 24 * GIB}, token_budget=4096, max_model_len=4096)  # fmt: skip
    plain, ipc = memory_plan(shape, PlanInputs(**base)), memory_plan(shape, PlanInputs(**base, ipc_weights_copy=True))
    (shared,) = [line for line in ipc if line.item == "weights shared over CUDA IPC"]
    assert (shared.device, shared.bytes, shared.phase) == ("cuda:0", 4 * 494_032_768, "rollout")
    resident, training = 16 * 494_032_768, 4096 * 24 * 896 * 34 + 4096 * 151_936 * 8
    assert training < 12 * GIB  # 7.4 GiB of activations and logits: sampling (vLLM's 12 GiB) is the larger phase
    assert totals(plain)["cuda:0"] == resident + 12 * GIB
    assert totals(ipc)["cuda:0"] == resident + 12 * GIB + 4 * 494_032_768  # the copy adds to the sampling phase
    assert [line for line in plain if "IPC" in line.item] == []


def test_a_transformers_engine_holds_one_batch_by_hand():
    shape = ModelShape.from_config(QWEN_05B)
    inputs = PlanInputs(
        trainer_device="cuda:0", engine_devices=("cuda:0",), engine_backend="transformers", engine_dtype_bytes=2,
        max_model_len=1024, max_new_tokens=256, device_memory={"cuda:0": 80 * GIB},
    )  # fmt: skip
    lines = {line.item: line for line in memory_plan(shape, inputs)}
    # KV: 2 (k, v) x 24 layers x 2 kv heads x 64 head_dim x 2 bytes = 12,288 bytes per token; 64 x 1024 tokens
    assert lines["engine 0 KV cache"].bytes == 64 * 1024 * 12_288 == 805_306_368
    assert lines["engine 0 sampled scores"].bytes == 64 * 256 * 151_936 * 4  # fp32 scores of each sampled step
    assert lines["engine 0 weights"].bytes == 2 * 494_032_768
    assert "rollout.gpu_memory_utilization" not in " ".join(line.rule for line in lines.values())  # no reservation


@pytest.mark.engine
def test_llmrl_plan_prints_the_main_jobs_plan():
    proc = subprocess.run(
        [sys.executable, "-c", "from llmrl_cli.main import app; app()", "plan", "--set", "train.token_budget=512"],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "134,515,008 parameters" in proc.stdout and "512 tokens (train.token_budget)" in proc.stdout
    assert "cpu        total" in proc.stdout
    bad = subprocess.run(
        [sys.executable, "-c", "from llmrl_cli.main import app; app()", "plan", "--set", "rollout.kv_cache_gb=0.01",
         "--set", "rollout.max_model_len=8192"],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bad.returncode == 1 and "does not fit: engine 0 KV cache holds" in bad.stderr


def test_a_model_the_plan_cannot_read_runs_without_a_plan(tmp_path, caplog):
    """Another architecture family (GPT-2's config names its sizes n_embd, n_layer): a warning, not a refusal."""
    import json
    import logging

    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig
    from runtime.memory_check import check_run_memory

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 768, "n_layer": 12}))
    with caplog.at_level(logging.WARNING, logger="llmrl.memory"):
        assert check_run_memory(load_config(GRPOConfig, None, [f"model={tmp_path}"])) is None
    assert "no memory plan for this model" in caplog.text and "must be a positive integer" in caplog.text
