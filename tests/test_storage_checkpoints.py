"""The checkpoint store: safetensors per version + manifest, atomic writes, verification, retention."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
import torch

import storage.checkpoints as checkpoints
from storage.checkpoints import CheckpointError, CheckpointStore


def _tiny(version: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(version)
    return {"w": torch.randn(4, 3, generator=generator), "b": torch.arange(3, dtype=torch.bfloat16) + version}


def test_real_model_round_trips_with_manifest(tmp_path, hf_model_fp32):
    model, tokenizer = hf_model_fp32
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()  # tied in SmolLM2
    store = CheckpointStore(tmp_path)
    config = {"lr": 5e-6, "clip": 0.2, "model": "SmolLM2-135M-Instruct"}
    manifest = store.save(state, 0, config=config, model_id="SmolLM2-135M-Instruct", metadata={"step": 0})

    weights = tmp_path / "policy_v000000.safetensors"
    assert manifest.sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert manifest.size_bytes == weights.stat().st_size
    expected_hash = hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert manifest.config_hash == expected_hash
    assert manifest.dtype == "float32" and manifest.dtypes == {"float32": len(state) - 1}
    assert manifest.num_parameters == sum(p.numel() for p in model.parameters())  # ties counted once
    assert manifest.aliases == {"model.embed_tokens.weight": "lm_head.weight"}
    assert manifest.parent_version is None and store.manifest(0) == manifest

    loaded = store.load()
    assert loaded.manifest == manifest and set(loaded.state_dict) == set(state)
    for name, tensor in state.items():
        assert torch.equal(loaded.state_dict[name], tensor), name
    assert loaded.state_dict["lm_head.weight"] is loaded.state_dict["model.embed_tokens.weight"]  # tie restored

    # the reloaded weights drive a wiped copy of the model to the same logits
    fresh = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in fresh.parameters():
            parameter.zero_()
    fresh.load_state_dict(loaded.state_dict, strict=True)
    ids = tokenizer("What is 2+3?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)


def test_latest_and_given_versions_with_parents(tmp_path):
    store = CheckpointStore(tmp_path)
    assert store.latest_version() is None
    with pytest.raises(CheckpointError, match="no checkpoints"):
        store.load()
    for version in range(3):
        store.save(_tiny(version), version, parent_version=version - 1 if version else None)
    assert store.versions() == [0, 1, 2] and store.latest_version() == 2
    assert store.manifest().parent_version == 1 and store.manifest(1).parent_version == 0
    assert torch.equal(store.load(1).state_dict["w"], _tiny(1)["w"])
    assert store.load().manifest.policy_version == 2
    assert store.manifest(2).dtype == "mixed" and store.manifest(2).dtypes == {"bfloat16": 1, "float32": 1}
    with pytest.raises(CheckpointError, match="no checkpoint for policy version 7"):
        store.load(7)
    with pytest.raises(CheckpointError, match="parent_version 5 must be lower"):
        store.save(_tiny(3), 3, parent_version=5)
    with pytest.raises(CheckpointError, match="does not match the given config"):
        store.save(_tiny(3), 3, config={"a": 1}, config_hash="0" * 64)


def test_crash_before_the_manifest_leaves_the_version_invisible(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)
    store.save(_tiny(0), 0)

    def die(*args, **kwargs):
        raise KeyboardInterrupt("killed between the weights rename and the manifest")

    monkeypatch.setattr(checkpoints, "_write_text_atomic", die)
    with pytest.raises(KeyboardInterrupt):
        store.save(_tiny(1), 1, parent_version=0)
    monkeypatch.undo()
    assert store.versions() == [0] and store.latest_version() == 0  # the orphan weights file is not a version
    assert store.load().manifest.policy_version == 0
    store.save(_tiny(1), 1, parent_version=0)  # the re-run replaces the orphan
    assert torch.equal(store.load(1).state_dict["w"], _tiny(1)["w"])


def test_crash_while_writing_weights_leaves_no_file(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)

    def partial_write(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"\x00" * 100)  # half a file, then the process is interrupted
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoints, "save_file", partial_write)
    with pytest.raises(KeyboardInterrupt):
        store.save(_tiny(0), 0)
    assert list(tmp_path.iterdir()) == [] and store.versions() == []


def test_corruption_is_detected(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(_tiny(0), 0)
    path = store.weights_path(0)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256 .* does not match the manifest"):
        store.load(0)
    store.load(0, verify=False)  # a caller may opt out
    store.manifest_path(0).write_text('{"policy_version": 0}')
    with pytest.raises(CheckpointError, match="missing field"):
        store.load(0)


def test_saving_a_version_again_replaces_it(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(_tiny(0), 0)
    second = store.save(_tiny(9), 0)
    assert store.versions() == [0] and store.manifest(0) == second
    assert torch.equal(store.load(0).state_dict["w"], _tiny(9)["w"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy_v000000.manifest.json", "policy_v000000.safetensors"]


def test_retention_keeps_last_k_plus_every_nth(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=2, keep_every=3)
    for version in range(10):
        store.save(_tiny(version), version)
    assert store.versions() == [0, 3, 6, 8, 9]
    names = sorted(p.name for p in tmp_path.iterdir())
    kept = (0, 3, 6, 8, 9)
    assert names == sorted(f"policy_v{v:06d}.{ext}" for v in kept for ext in ("safetensors", "manifest.json"))
    only_last = CheckpointStore(tmp_path / "b", keep_last=1)
    for version in range(3):
        only_last.save(_tiny(version), version)
    assert only_last.versions() == [2]
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointStore(tmp_path, keep_last=0)
