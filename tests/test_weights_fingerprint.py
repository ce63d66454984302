"""The weights fingerprint (N6): the same values under the same names give the same 16 hex digits whatever the
file's metadata, key order or storage; one changed value, a swap of two tensors, a reshape or another dtype's
rounding change it; a tied head counts once; a mismatch between trainer and engines stops with one line."""

from __future__ import annotations

import hashlib
import random

import pytest
import torch
import xxhash
from safetensors.torch import load_file, save_file

from llmrl_core.weight_sync.fingerprint import (
    EMBEDDINGS,
    HEAD,
    WeightsMismatchError,
    check_engines_hold,
    tensor_hash,
    weights_fingerprint,
)


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        EMBEDDINGS: torch.randn(32, 8, generator=g),
        "model.layers.0.mlp.down_proj.weight": torch.randn(8, 16, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(16, 8, generator=g),
        "model.layers.1.mlp.up_proj.weight": torch.randn(16, 8, generator=g),
        "model.norm.weight": torch.ones(8),
    }


def test_a_tensor_hash_is_xxh3_over_shape_dtype_and_values():
    t = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.bfloat16)
    # an independent spelling of the same bytes: the header, then the bf16 bit patterns little-endian, in one call
    header = repr(((2, 2), "torch.bfloat16")).encode()
    values = b"".join(int(v).to_bytes(2, "little", signed=True) for v in t.reshape(-1).view(torch.int16).tolist())
    assert tensor_hash(t) == xxhash.xxh3_64_intdigest(header + values)
    assert tensor_hash(t.t().contiguous().t()) == tensor_hash(t)  # storage layout does not matter, values do


def test_key_order_file_metadata_and_storage_do_not_change_it(tmp_path):
    state = _state()
    names = list(state)
    random.Random(1).shuffle(names)
    shuffled = {n: state[n].clone() for n in names}
    assert weights_fingerprint(shuffled) == weights_fingerprint(state)
    save_file(state, tmp_path / "a.safetensors", metadata={"format": "pt"})
    save_file(shuffled, tmp_path / "b.safetensors", metadata={"written_by": "someone else", "step": "7"})
    a, b = (tmp_path / "a.safetensors").read_bytes(), (tmp_path / "b.safetensors").read_bytes()
    assert hashlib.sha256(a).hexdigest() != hashlib.sha256(b).hexdigest()  # what the checkpoint sha256 sees
    loaded = [load_file(tmp_path / name) for name in ("a.safetensors", "b.safetensors")]
    assert weights_fingerprint(loaded[0]) == weights_fingerprint(loaded[1]) == weights_fingerprint(state)
    assert len(weights_fingerprint(state)) == 16 and int(weights_fingerprint(state), 16) >= 0


def test_any_change_of_values_names_or_shapes_changes_it():
    base = weights_fingerprint(_state(), "bfloat16")
    one_value = _state()
    one_value["model.layers.1.mlp.up_proj.weight"][3, 2] += 0.25
    swapped = _state()
    a, b = "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"
    swapped[a], swapped[b] = swapped[b], swapped[a]
    reshaped = _state()
    reshaped["model.layers.0.mlp.down_proj.weight"] = reshaped["model.layers.0.mlp.down_proj.weight"].reshape(16, 8)
    renamed = _state()
    renamed["model.final_norm.weight"] = renamed.pop("model.norm.weight")
    missing = _state()
    del missing["model.norm.weight"]
    others = [weights_fingerprint(s, "bfloat16") for s in (one_value, swapped, reshaped, renamed, missing)]
    assert len({base, *others}) == 6


def test_it_is_taken_in_the_engines_dtype():
    state = _state()
    tiny = {k: v.clone() for k, v in state.items()}
    tiny["model.norm.weight"][0] += 1e-4  # below bf16's resolution at 1.0 (2**-7), above fp32's
    assert weights_fingerprint(tiny, "bfloat16") == weights_fingerprint(state, torch.bfloat16)
    assert weights_fingerprint(tiny, "float32") != weights_fingerprint(state, "float32")
    as_bf16 = {k: v.to(torch.bfloat16) for k, v in state.items()}  # an engine's copy, already rounded
    assert weights_fingerprint(as_bf16) == weights_fingerprint(state, "bfloat16")
    assert weights_fingerprint(state) == weights_fingerprint(state, "float32")
    ids = {"ids": torch.arange(5)}  # integer tensors are never cast
    assert weights_fingerprint(ids, "bfloat16") == weights_fingerprint(ids)


def test_a_tied_head_counts_once_under_the_embeddings_name():
    state = _state()
    both = {**state, HEAD: state[EMBEDDINGS]}  # state_dict() of a tied model: one tensor, two names
    head_only = {HEAD if k == EMBEDDINGS else k: v for k, v in state.items()}  # a de-duplicated file
    fingerprints = {weights_fingerprint(s, tied=True) for s in (state, both, head_only)}
    assert len(fingerprints) == 1
    assert weights_fingerprint(both, tied=False) != weights_fingerprint(state, tied=False)  # untied: two tensors


def test_engines_holding_other_weights_stop_the_run_with_one_line():
    published = {"bfloat16": "00000000000000aa", "float32": "00000000000000bb"}
    check_engines_hold(3, published, [{"fingerprint": "00000000000000aa", "dtype": "bfloat16"}])
    check_engines_hold(3, published, [])
    held = [
        {"fingerprint": "00000000000000aa", "dtype": "bfloat16"},
        {"fingerprint": "00000000000000cc", "dtype": "float32"},
    ]
    with pytest.raises(WeightsMismatchError) as caught:
        check_engines_hold(3, published, held)
    message = str(caught.value)
    assert message.startswith("version 3: the trainer published weights 00000000000000aa (bfloat16), ")
    assert "but engine 1 holds 00000000000000cc (float32)" in message and "engine 0" not in message
    assert "stopping before training on their rows" in message and "\n" not in message
    with pytest.raises(WeightsMismatchError, match="engine 0 holds 00000000000000aa \\(float16\\)"):
        check_engines_hold(3, published, [{"fingerprint": "00000000000000aa", "dtype": "float16"}])
