"""vLLMUpdater: weights pushed into a resident engine change it, match the trainer, and restore exactly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from llmrl_core.envs import PolicyVersion
from llmrl_core.modules.backends.transformers.scoring import load_causal_lm
from llmrl_core.modules.backends.vllm.engine import score_with_vllm
from llmrl_core.weight_sync import vLLMUpdater
from llmrl_core.weight_sync.fingerprint import weights_fingerprint
from llmrl_core.weight_sync.serialization import state_dict_from_bytes, state_dict_to_bytes
from llmrl_core.weight_sync.worker_extension import held_fingerprint


@pytest.fixture(scope="module")
def trainer(default_model_path):
    """A private fp32 copy of the model to perturb (the shared fixture model stays untouched)."""
    model, tokenizer = load_causal_lm(default_model_path, dtype="float32")
    return model, tokenizer, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture
def engine(vllm_engine_fp32, trainer):
    """The session engine; whatever a test pushes, the original weights go back afterwards."""
    yield vllm_engine_fp32
    vLLMUpdater(mode="in_process").register_engine(vllm_engine_fp32).push_weights(trainer[2])


def _fixed_tokens(tokenizer):
    prompt = tokenizer(
        "<|im_start|>user\nWhat is 7 times 6?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )["input_ids"]
    response = tokenizer("7 times 6 is 42.<|im_end|>", add_special_tokens=False)["input_ids"]
    return prompt, response


def _trainer_logprobs(model, prompt, response):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


@pytest.mark.parametrize("mode", ["in_process", "bytes", "file"])
def test_push_changes_engine_matches_trainer_and_restores_exactly(mode, engine, trainer, tmp_path):
    model, tokenizer, original = trainer
    prompt, response = _fixed_tokens(tokenizer)
    before = score_with_vllm(engine, [prompt], [response])[0]
    torch.testing.assert_close(before, _trainer_logprobs(model, prompt, response), atol=1e-3, rtol=0)

    version = PolicyVersion()
    updater = vLLMUpdater(mode=mode, shared_dir=tmp_path).register_engine(engine).register_version_tracker(version)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.02)
    try:
        assert updater.push_weights(model) == 1 and version.version == 1
        # the engine's fingerprint of what it loaded is the trainer's of what it pushed (and not the old one)
        held = engine.collective_rpc(held_fingerprint)[0]
        assert held == {
            "fingerprint": weights_fingerprint(model.state_dict(), "float32", tied=True),
            "dtype": "float32",
        }
        assert held["fingerprint"] != weights_fingerprint(original, "float32", tied=True)
        after = score_with_vllm(engine, [prompt], [response])[0]
        assert (after - before).abs().max().item() > 0.1  # the update really changed the engine
        expected = _trainer_logprobs(model, prompt, response)
        assert (after - expected).abs().max().item() < 1e-3  # and it now computes what the trainer computes
        if mode == "file":
            assert (tmp_path / "policy-v1.safetensors").is_file()
            assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    finally:
        model.load_state_dict(original)
    assert updater.push_weights(original) == 2 and version.version == 2
    assert torch.equal(score_with_vllm(engine, [prompt], [response])[0], before)
    assert engine.collective_rpc(held_fingerprint)[0]["fingerprint"] == weights_fingerprint(
        original, "float32", tied=True
    )


def test_updater_rejects_bad_configuration():
    with pytest.raises(ValueError, match="mode must be one of"):
        vLLMUpdater(mode="carrier-pigeon")
    with pytest.raises(ValueError, match="shared_dir"):
        vLLMUpdater(mode="file")
    with pytest.raises(RuntimeError, match="no engine registered"):
        vLLMUpdater().push_weights({})


def test_safetensors_bytes_round_trip_keeps_tied_weights():
    shared = torch.randn(4, 3)
    state = {"embed.weight": shared, "lm_head.weight": shared, "bias": torch.arange(3.0)}
    back = state_dict_from_bytes(state_dict_to_bytes(state))
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="an NCCL push needs two GPUs: the engine's (GPU 0) and the trainer's (GPU 1); NCCL refuses two ranks on one",
)
def test_nccl_push_matches_trainer(default_model_path):
    from llmrl_core.modules.backends.types import EngineConfig
    from llmrl_core.modules.backends.vllm.engine import make_llm

    model, tokenizer = load_causal_lm(default_model_path, dtype="float32", device="cuda:1")
    llm = make_llm(
        EngineConfig(
            model=default_model_path,
            dtype="float32",
            in_process=False,
            weight_sync_extension=True,
            gpu_memory_utilization=0.3,
        )
    )
    prompt, response = _fixed_tokens(tokenizer)
    updater = vLLMUpdater(mode="nccl", device="cuda:1").register_engine(llm)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    updater.push_weights(model)
    after = score_with_vllm(llm, [prompt], [response])[0]
    expected = _trainer_logprobs(model.cpu(), prompt, response)
    assert (after - expected).abs().max().item() < 1e-3


CROSS_PROCESS_SCRIPT = """
import sys, torch
from llmrl_core.modules.backends.types import EngineConfig
from llmrl_core.modules.backends.vllm.engine import make_llm, shutdown_llm
from llmrl_core.modules.backends.vllm.engine import score_with_vllm
from llmrl_core.modules.backends.transformers.scoring import load_causal_lm
from llmrl_core.weight_sync import vLLMUpdater

if __name__ == "__main__":
    path = sys.argv[1]
    llm = make_llm(EngineConfig(model=path, dtype="float32", in_process=False, weight_sync_extension=True))
    model, tok = load_causal_lm(path)
    prompt = tok("Hello, how are you?", add_special_tokens=False)["input_ids"]
    response = tok(" I am fine.", add_special_tokens=False)["input_ids"]
    before = score_with_vllm(llm, [prompt], [response])[0]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
        expected = torch.log_softmax(model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1], -1)
    expected = expected.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
    vLLMUpdater(mode="bytes").register_engine(llm).push_weights(model)
    after = score_with_vllm(llm, [prompt], [response])[0]
    print("RESULT", (after - before).abs().max().item(), (after - expected).abs().max().item(), flush=True)
    shutdown_llm(llm)
"""


@pytest.mark.extended  # the long tier: pytest -m extended (README "Tests")
@pytest.mark.slow
def test_bytes_push_into_an_engine_in_another_process(default_model_path, tmp_path):
    """The engine core runs in its own process (as on a GPU worker): tensors travel as safetensors bytes."""
    import subprocess
    import sys

    script = tmp_path / "cross_process_push.py"
    script.write_text(CROSS_PROCESS_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), default_model_path], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))
    changed, mismatch = map(float, line.split()[1:])
    assert changed > 0.1 and mismatch < 1e-3


def test_state_without_the_tied_head_still_updates_the_output_layer(engine, trainer):
    """save_pretrained drops lm_head for tied models; vLLM's CPU model keeps its own copy of the head."""
    model, tokenizer, original = trainer
    prompt, response = _fixed_tokens(tokenizer)
    updater = vLLMUpdater(mode="in_process").register_engine(engine)
    try:
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(1.5)  # tied: changes the input embeddings and the head
        state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
        updater.push_weights(state)
        after = score_with_vllm(engine, [prompt], [response])[0]
        assert (after - _trainer_logprobs(model, prompt, response)).abs().max().item() < 1e-3
    finally:
        model.load_state_dict(original)


def test_state_with_only_the_tied_head_still_updates_the_input_embeddings(engine, trainer, tmp_path, caplog):
    """A tied tensor stored once under its first name in sorted order, ``lm_head.weight`` (checkpoints and the
    shared-memory file the GRPO trainer writes): the engine's input embeddings must change with it too, and the
    reload must not warn that the embeddings failed to load (it used to, on every version)."""
    import logging

    from safetensors.torch import load_file

    from storage.checkpoints import CheckpointStore
    from storage.handoff import SharedWeights

    model, tokenizer, original = trainer
    prompt, response = _fixed_tokens(tokenizer)
    updater = vLLMUpdater(mode="in_process").register_engine(engine)
    before = score_with_vllm(engine, [prompt], [response])[0]
    try:
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(1.5)  # tied: changes the input embeddings and the head
        expected = _trainer_logprobs(model, prompt, response)
        assert (expected - before).abs().max().item() > 0.1
        state = {k: v.detach() for k, v in model.state_dict().items()}  # both names, one tensor
        handoff = SharedWeights(torch.float32, root=tmp_path)  # the file lives as long as this object
        shared = handoff.write(state)
        written = CheckpointStore(tmp_path / "store").write_weights(state, 1)
        checkpoint = tmp_path / "store" / written.weights_file
        for path in (shared, checkpoint):
            stored = load_file(path)
            assert "lm_head.weight" in stored and "model.embed_tokens.weight" not in stored
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="vllm"):
                updater.push_weights(stored)
            warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert not [w for w in warnings if "Failed to load weights" in w or "not loaded" in w], warnings
            after = score_with_vllm(engine, [prompt], [response])[0]
            assert (after - expected).abs().max().item() < 1e-3, path
            updater.push_weights(original)
    finally:
        model.load_state_dict(original)


def test_the_rotary_reload_warning_is_explained_once_then_hidden(caplog):
    """vLLM warns "RotaryEmbedding: Failed to load weights" on every reload (its cos/sin cache is computed,
    never a checkpoint weight): llmrl explains it once and hides it; other reload warnings still show."""
    import logging

    from llmrl_core.modules.backends.vllm.engine import quiet_reload_warnings

    quiet_reload_warnings()
    quiet_reload_warnings()  # idempotent
    reload_logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            reload_logger.warning("%s: Failed to load weights", "RotaryEmbedding")
        reload_logger.warning("%s: Failed to load weights", "QKVParallelLinear")
    messages = [r.getMessage() for r in caplog.records]
    assert "QKVParallelLinear: Failed to load weights" in messages
    assert "RotaryEmbedding: Failed to load weights" not in messages
    assert sum("cos/sin cache is computed" in m for m in messages) <= 1


def test_weights_are_cast_to_the_engine_dtype_exactly_as_the_engine_would_round_them():
    """A bf16 engine fed fp32 weights rounds them in ``param.copy_``; casting first gives the same bits (so
    what the engine samples with does not change), leaves integer tensors alone, and skips unknown dtypes."""
    from types import SimpleNamespace

    from llmrl_core.weight_sync.updater import cast_floats, engine_dtype

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 33, generator=generator) * 3
    state = {"w": weight, "ids": torch.arange(5), "half": weight.to(torch.bfloat16)}
    cast = cast_floats(state, torch.bfloat16)
    param = torch.empty(64, 33, dtype=torch.bfloat16)
    param.copy_(weight)  # what vLLM's default weight loader does with an fp32 tensor
    assert cast["w"].dtype == torch.bfloat16 and torch.equal(cast["w"].view(torch.int16), param.view(torch.int16))
    assert cast["ids"] is state["ids"] and cast["half"] is state["half"]
    assert cast_floats(state, None) is state
    llm = SimpleNamespace(llm_engine=SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16)))
    assert engine_dtype(llm) is torch.bfloat16 and engine_dtype(object()) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a CUDA GPU")
def test_cuda_ipc_handles_open_in_another_process_on_the_same_gpu(tmp_path):
    """``rollout.weight_sync=cuda_ipc`` for real: handles the trainer's way (``reduce_tensor``, pickled as Dask does),
    opened by :func:`runtime.rollout_actor.open_cuda_handles` in another process that sees the same GPU."""
    import pickle
    import subprocess
    import sys

    from torch.multiprocessing.reductions import reduce_tensor

    a = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    weights = {"a": a, "b": torch.ones(5, device="cuda")}
    (tmp_path / "handles.pkl").write_bytes(pickle.dumps({n: reduce_tensor(t) for n, t in weights.items()}))
    child = (
        "import pickle, sys, torch; from runtime.rollout_actor import open_cuda_handles; "
        f"opened = open_cuda_handles(pickle.loads(open({str(tmp_path / 'handles.pkl')!r}, 'rb').read())); "
        "print({n: (t.device.type, float(t.sum()), tuple(t.shape)) for n, t in opened.items()})"
    )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]  # the parent's GPU as the child's only one
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": visible}, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == str({"a": ("cuda", 66.0, (3, 4)), "b": ("cuda", 5.0, (5,))})
