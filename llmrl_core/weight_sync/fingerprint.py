"""A fingerprint of a model's weights: which values sit in which named tensor, in the dtype an engine holds them.

The checkpoint's sha256 says whether two files are the same bytes; it changes with safetensors' metadata and key
order, and says nothing about what an engine holds after it loaded the file. This fingerprint is computed from
tensor contents only: each tensor, cast to the engine's dtype, is hashed (XXH3-64 over its shape, dtype and
values in row-major order), and the tensors' hashes are combined with their names' independently of order. So
the trainer (over the weights it publishes) and an engine (over the weights its loader took in) reach the same
16 hex digits exactly when the same values reached the same names.

Tied embeddings count once, under the embeddings' name: a model that ties its output head to its input
embeddings (``tie_word_embeddings``) may carry the tensor under either name or both (a de-duplicated checkpoint
keeps one, ``state_dict()`` gives both).

Why XXH3 and not a cryptographic hash: the fingerprint catches a load that did not reach an engine (or another
model), not a forger, and it is computed over every weight by the trainer and by each engine at every version.
XXH3 hashes ~20 GB/s on one core; BLAKE2b took 0.58 s of a 1.0 s engine reload of SmolLM2-135M in fp32 on two AMD
EPYC cores (``bench/bench_weight_publish.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import xxhash

EMBEDDINGS, HEAD = "model.embed_tokens.weight", "lm_head.weight"
_MASK = (1 << 64) - 1
_K2 = 0xBF58476D1CE4E5B9
_K3 = 0x94D049BB133111EB
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _mix(value: int) -> int:
    """A 64-bit finaliser (splitmix64's), in Python integers."""
    value = ((value ^ (value >> 30)) * _K2) & _MASK
    value = ((value ^ (value >> 27)) * _K3) & _MASK
    return value ^ (value >> 31)


def tensor_hash(tensor: torch.Tensor) -> int:
    """A 64-bit hash (XXH3-64) of ``tensor``'s shape, dtype and values in row-major order (their bit patterns)."""
    flat = tensor.detach()
    if flat.device.type != "cpu":
        flat = flat.cpu()
    flat = flat.contiguous().reshape(-1)
    digest = xxhash.xxh3_64(repr((tuple(tensor.shape), str(tensor.dtype))).encode())
    digest.update(flat.view(_BITS[flat.element_size()]).numpy())  # the buffer itself: no copy
    return digest.intdigest()


def canonical_names(names: Iterable[str], tied: bool) -> dict[str, str]:
    """Which name each tensor counts under (a tied head counts as the embeddings, once); names left out are
    copies of a tensor already counted."""
    names = list(names)
    counted = {name: name for name in names}
    if tied and HEAD in counted:
        del counted[HEAD]
        if EMBEDDINGS not in counted:
            counted[HEAD] = EMBEDDINGS  # only the head carries the tied tensor
    return counted


def weights_fingerprint(
    weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype | str | None = None,
    *,
    tied: bool = False,
) -> str:
    """The fingerprint (16 hex digits) of named ``weights`` with floating-point tensors cast to ``dtype`` (the
    engine's; None: as they are). ``tied``: the model ties its output head to its input embeddings."""
    items = dict(weights.items() if isinstance(weights, Mapping) else weights)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    total = 0
    for name, counted_as in canonical_names(items, tied).items():
        tensor = items[name]
        if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        key = xxhash.xxh3_64_intdigest(counted_as.encode())
        total = (total + _mix(tensor_hash(tensor) ^ key)) & _MASK  # a sum: the tensors' order does not matter
    return f"{total:016x}"


class WeightsMismatchError(RuntimeError):
    """An engine holds other weights than the trainer published for a version (their fingerprints differ)."""


def check_engines_hold(version: int, published: Mapping[str, str], held: list[Mapping[str, str]]) -> None:
    """Raise :class:`WeightsMismatchError` unless every engine's ``{"fingerprint", "dtype"}`` equals the
    trainer's fingerprint of ``version`` in that dtype (``published``: dtype -> fingerprint)."""
    wrong = [
        f"engine {i} holds {h['fingerprint']} ({h['dtype']})"
        for i, h in enumerate(held)
        if published.get(h["dtype"]) != h["fingerprint"]
    ]
    if wrong:
        expected = ", ".join(f"{fp} ({dtype})" for dtype, fp in sorted(published.items()))
        raise WeightsMismatchError(
            f"version {version}: the trainer published weights {expected} but {'; '.join(wrong)}: the engines "
            "sample with other weights than the ones trained (a load that did not reach them, or another model); "
            "stopping before training on their rows"
        )
