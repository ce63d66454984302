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


def test_written_weights_count_only_once_sealed(tmp_path):
    """write_weights puts the complete file at its final name (engines may load it) but the version exists only
    after seal (fsync, sha256, manifest); rewriting a sealed version withdraws its old manifest first."""
    store = CheckpointStore(tmp_path)
    store.save(_tiny(0), 0)
    written = store.write_weights(_tiny(1), 1)
    assert written.sha256 is None and written.num_tensors == 2 and written.dtypes == {"bfloat16": 1, "float32": 1}
    assert store.versions() == [0] and store.weights_path(1).is_file()  # on disk, not a version yet
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(store.weights_path(1)))["w"], _tiny(1)["w"])  # complete already
    with pytest.raises(CheckpointError, match="no checkpoint for policy version 1"):
        store.load(1)
    manifest = store.seal(written, parent_version=0, config={"a": 1})
    assert store.versions() == [0, 1] and manifest.parent_version == 0
    assert manifest.sha256 == hashlib.sha256(store.weights_path(1).read_bytes()).hexdigest()
    assert manifest.size_bytes == store.weights_path(1).stat().st_size
    assert store.load(1).manifest == manifest
    store.write_weights(_tiny(5), 1)  # a re-run of version 1: the old manifest no longer describes the file
    assert store.versions() == [0]
    with pytest.raises(CheckpointError, match="parent_version 1 must be lower than policy_version 1"):
        store.seal(written, parent_version=1)
    store.weights_path(1).unlink()
    with pytest.raises(CheckpointError, match="weights file of policy version 1 is missing"):
        store.seal(written)


def test_a_seal_keeps_the_versions_it_is_told_to_protect(tmp_path):
    """keep_last=1 alone would drop version 2 when 3 is sealed; a trainer whose version 3 is not committed yet
    protects 2 (what a resume from the last commit loads) until the next seal."""
    store = CheckpointStore(tmp_path, keep_last=1)
    for version in range(3):
        store.save(_tiny(version), version)
    assert store.versions() == [2]
    store.seal(store.write_weights(_tiny(3), 3), protect=range(2, 3))
    assert store.versions() == [2, 3]
    store.seal(store.write_weights(_tiny(4), 4), protect=[3])
    assert store.versions() == [3, 4]
    assert store.apply_retention(protect=None) == [3] and store.versions() == [4]


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


# ----------------------------------------------------------------------------- any filesystem URI
def _tied(version: int) -> dict[str, torch.Tensor]:
    """A tiny state dict with a tie (``head`` is ``embed``), as SmolLM2's lm_head / embed_tokens."""
    state = _tiny(version)
    state["embed"] = torch.randn(5, 2, generator=torch.Generator().manual_seed(100 + version))
    state["head"] = state["embed"]
    return state


@pytest.fixture(params=["memory", "s3"])
def remote_root(request):
    """The root URI of an empty store on fsspec's in-memory filesystem or on a local S3 (moto)."""
    if request.param == "memory":
        import os

        import fsspec

        folder = f"llmrl-ckpt-{os.getpid()}-{id(request)}"
        yield f"memory://{folder}/checkpoints"
        fsspec.filesystem("memory").rm(f"/{folder}", recursive=True)
    else:
        yield request.getfixturevalue("s3_server").uri("run-a/checkpoints")


def _visible(store: CheckpointStore) -> list[str]:
    """Every file under the store's root, hidden temporary ones included."""
    import pyarrow.fs as pafs

    if store.fs.get_file_info(store._dir).type != pafs.FileType.Directory:
        return []
    return sorted(e.base_name for e in store.fs.get_file_info(pafs.FileSelector(store._dir)) if e.size)


def test_a_store_on_any_uri_saves_loads_verifies_and_retains(remote_root):
    store = CheckpointStore(remote_root, keep_last=2)
    assert not store.local and store.root == remote_root and store.versions() == []
    for version in range(3):
        store.save(_tied(version), version, parent_version=version - 1 if version else None, config={"v": version})
    assert store.versions() == [1, 2] and store.latest_version() == 2  # retention on the remote store
    names = [f"policy_v{v:06d}.{ext}" for v in (1, 2) for ext in ("manifest.json", "safetensors")]
    assert _visible(store) == sorted(names)  # no temporary object left behind

    loaded = store.load(1)
    assert loaded.manifest == store.manifest(1) and loaded.manifest.aliases == {"head": "embed"}
    for name, tensor in _tied(1).items():
        assert torch.equal(loaded.state_dict[name], tensor), name
    assert loaded.state_dict["head"] is loaded.state_dict["embed"]  # the tie is restored

    # the weights URI names the file on that store, query options included, and opens again anywhere
    uri = store.weights_path(2)
    base, _, query = remote_root.partition("?")
    assert uri == f"{base}/policy_v000002.safetensors" + (f"?{query}" if query else "")
    again, version = CheckpointStore.from_weights_uri(uri)
    assert version == 2 and again.versions() == [1, 2]
    data = again.read_weights(version)
    assert hashlib.sha256(data).hexdigest() == store.manifest(2).sha256
    assert len(data) == store.manifest(2).size_bytes

    # a corrupt object is caught before anyone uses it
    from storage.filesystems import write_bytes_atomic

    corrupt = bytearray(data)
    corrupt[-1] ^= 0xFF
    write_bytes_atomic(store.fs, f"{store._dir}/policy_v000002.safetensors", bytes(corrupt))
    with pytest.raises(CheckpointError, match="sha256 .* does not match the manifest"):
        store.load(2)
    with pytest.raises(CheckpointError, match="sha256 .* does not match the manifest"):
        again.read_weights(2)
    assert torch.equal(store.load(2, verify=False).state_dict["w"], _tied(2)["w"])
    with pytest.raises(CheckpointError, match="no checkpoint for policy version 7"):
        store.load(7)
    store.delete(2)
    assert store.versions() == [1]


def test_a_remote_store_hashes_on_the_way_up_and_seals_with_the_manifest(remote_root):
    store = CheckpointStore(remote_root)
    written = store.write_weights(_tied(3), 3)
    assert written.sha256 is not None and written.aliases == {"head": "embed"} and store.versions() == []
    manifest = store.seal(written)
    assert store.versions() == [3] and manifest.sha256 == written.sha256
    assert hashlib.sha256(store.read_weights(3)).hexdigest() == manifest.sha256


def test_a_failed_upload_leaves_nothing_visible_on_a_remote_store(remote_root, monkeypatch):
    store = CheckpointStore(remote_root)
    store.save(_tiny(0), 0)

    def die(*args, **kwargs):
        raise KeyboardInterrupt("killed between the weights upload and the manifest")

    monkeypatch.setattr(checkpoints, "_write_text_atomic", die)
    with pytest.raises(KeyboardInterrupt):
        store.save(_tiny(1), 1, parent_version=0)
    monkeypatch.undo()
    assert store.versions() == [0]  # the orphan weights object is not a version
    store.save(_tiny(1), 1, parent_version=0)
    assert torch.equal(store.load(1).state_dict["w"], _tiny(1)["w"])

    class DroppedConnection:
        """The store's filesystem, except that an upload breaks after its first bytes."""

        def __init__(self, fs):
            self.fs = fs

        def __getattr__(self, name):
            return getattr(self.fs, name)

        def open_output_stream(self, path, *args, **kwargs):
            real = self.fs.open_output_stream(path, *args, **kwargs)

            class Stream:
                def __enter__(self):
                    return self

                def __exit__(self, *exc):
                    real.close()  # what was sent so far becomes an object under the temporary name
                    return False

                def write(self, data):
                    real.write(bytes(memoryview(data)[:10]))
                    raise OSError("connection reset while uploading")

            return Stream()

    monkeypatch.setattr(store, "fs", DroppedConnection(store.fs))
    with pytest.raises(OSError, match="connection reset"):
        store.save(_tiny(2), 2, parent_version=1)
    monkeypatch.undo()
    assert store.versions() == [0, 1] and not any(".tmp-" in name for name in _visible(store))
    assert not any("v000002" in name for name in _visible(store))


def test_the_rollout_actor_loads_a_remote_checkpoint_through_the_store(remote_root, tmp_path):
    """``RolloutWorker.load`` with what the trainer published: a local path goes to the engine as is; a URI is
    read through the store on the worker (sha256-checked) and the engine gets the bytes."""
    from runtime.rollout_actor import RolloutWorker

    received = []

    class Engine:
        def load_weights(self, weights, version):
            received.append(weights)
            return version

    actor = RolloutWorker.__new__(RolloutWorker)  # the load path only: no vLLM engine
    actor.worker = Engine()
    remote, local = CheckpointStore(remote_root), CheckpointStore(tmp_path)
    for store in (remote, local):
        store.save(_tied(3), 3)
    assert actor.load(str(remote.weights_path(3)), 3) == 3
    assert actor.load(str(local.weights_path(3)), 3) == 3
    assert received[0] == remote.read_weights(3) and received[1] == str(local.weights_path(3))
    from safetensors.torch import load

    assert torch.equal(load(received[0])["embed"], _tied(3)["embed"])


def test_bit_identical_weights_give_the_same_file_and_sha256(tmp_path):
    """The weights file holds the tensors and nothing about when or as which version they were saved (issue 71:
    bit-identical weights, e.g. a version trained on no signal, gave a new sha256), so equal weights hash equally
    across versions, stores and tensor order; a changed value changes it."""
    import torch

    weights = {"b": torch.ones(3), "a": torch.arange(4.0), "tied": None}
    weights["tied"] = weights["b"]
    first = CheckpointStore(tmp_path / "one").save(weights, 1)
    reordered = {"a": torch.arange(4.0), "b": torch.ones(3)}
    reordered["tied"] = reordered["b"]
    later = CheckpointStore(tmp_path / "two").save(reordered, 7, parent_version=6)
    assert first.sha256 == later.sha256 and first.size_bytes == later.size_bytes
    changed = {**reordered, "a": torch.arange(4.0) + 1e-6}
    assert CheckpointStore(tmp_path / "three").save(changed, 1).sha256 != first.sha256
