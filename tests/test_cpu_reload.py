"""Weights into a CPU engine in place (llmrl_core.weight_sync.cpu_reload): the same engine as after vLLM's own
reload, the tied output head included, and a partial update leaves the other layers as they were."""

from __future__ import annotations

import pytest
import torch

from llmrl_core.modules.backends.transformers.scoring import load_causal_lm
from llmrl_core.modules.backends.vllm.engine import score_with_vllm
from llmrl_core.weight_sync.updater import add_tied_head
from llmrl_core.weight_sync.worker_extension import _worker, reload_and_fingerprint

PROMPT = "<|im_start|>user\nWhat is 7 times 6?<|im_end|>\n<|im_start|>assistant\n"
ANSWER = "7 times 6 is 42. Multiplying seven by six gives forty-two.<|im_end|>"


def _ids(tokenizer):
    return (
        tokenizer(PROMPT, add_special_tokens=False)["input_ids"],
        tokenizer(ANSWER, add_special_tokens=False)["input_ids"],
    )


def _perturbed(model, scale=0.02, only=None):
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if only is None or name == only:
                param.add_(torch.randn(param.shape, generator=generator) * scale)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _trainer_logprobs(model, prompt, response):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def _packs_in_place(worker):
    return getattr(_worker(worker).model_runner, "_llmrl_packs_in_place", None)


def test_a_partial_update_changes_that_layer_only_and_the_engine_computes_what_the_trainer_does(
    vllm_engine_fp32, default_model_path
):
    """The session's fp32 CPU engine reloads in place; a state holding one tensor changes that layer, every other
    layer (and the tied head) keeps the weights it had; the original weights go back exactly."""
    model, tokenizer = load_causal_lm(default_model_path, dtype="float32")
    original = {k: v.clone() for k, v in model.state_dict().items()}
    prompt, response = _ids(tokenizer)
    before = score_with_vllm(vllm_engine_fp32, [prompt], [response])[0]
    name = "model.layers.3.mlp.down_proj.weight"
    try:
        changed = _perturbed(model, scale=0.05, only=name)
        vllm_engine_fp32.collective_rpc(reload_and_fingerprint, args=([(name, changed[name])],))
        assert vllm_engine_fp32.collective_rpc(_packs_in_place) == [True]
        vllm_engine_fp32.reset_prefix_cache()
        after = score_with_vllm(vllm_engine_fp32, [prompt], [response])[0]
        assert (after - before).abs().max().item() > 1e-3  # the layer changed
        assert (after - _trainer_logprobs(model, prompt, response)).abs().max().item() < 1e-3  # and only it
    finally:
        state = dict(original)
        add_tied_head(state, vllm_engine_fp32)
        vllm_engine_fp32.collective_rpc(reload_and_fingerprint, args=(list(state.items()),))
        vllm_engine_fp32.reset_prefix_cache()
    assert torch.equal(score_with_vllm(vllm_engine_fp32, [prompt], [response])[0], before)


@pytest.mark.slow
def test_the_in_place_reload_leaves_the_engine_as_vllms_own_reload_does(default_model_path):
    """Two fresh bf16 engines (the flows' dtype; the paths are not mixed on one engine): one reloads through vLLM's
    ``reload_weights``, the other in place; their log-probs on the same answer are bit-identical, and both moved
    from the base model's."""
    from llmrl_core.modules.backends.types import EngineConfig
    from llmrl_core.modules.backends.vllm.engine import make_llm, shutdown_llm

    model, tokenizer = load_causal_lm(default_model_path, dtype="float32")
    prompt, response = _ids(tokenizer)
    state = {k: v.to(torch.bfloat16) for k, v in _perturbed(model).items()}
    scores = {}
    for path in ("vllm", "in_place"):
        llm = make_llm(
            EngineConfig(model=default_model_path, dtype="bfloat16", kv_cache_gb=1, seed=0, weight_sync_extension=True)
        )
        try:
            base = score_with_vllm(llm, [prompt], [response])[0]
            if path == "vllm":
                llm.collective_rpc(_choose_vllms_reload)
            weights = dict(state)
            add_tied_head(weights, llm)
            llm.collective_rpc(reload_and_fingerprint, args=(list(weights.items()),))
            assert llm.collective_rpc(_packs_in_place) == [path == "in_place"]
            llm.reset_prefix_cache()
            scores[path] = score_with_vllm(llm, [prompt], [response])[0]
            assert (scores[path] - base).abs().max().item() > 0.05
        finally:
            shutdown_llm(llm)
    assert torch.equal(scores["vllm"], scores["in_place"])


def _choose_vllms_reload(worker):
    _worker(worker).model_runner._llmrl_packs_in_place = False
