"""TorchRL's ``as_padded_tensor`` / ``as_nested_tensor`` of ``torchrl.envs.llm.transforms``: one TensorDict from a
list of TensorDicts whose entries differ in length (a ``DataLoadingPrimer``'s rows, a batch of dialog turns).

These take TensorDicts; :mod:`llmrl_core.data.tensors` has the same names for plain lists of 1-D tensors."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase


def _checked(list_of_tensordicts: Sequence[TensorDictBase], caller: str) -> list[TensorDictBase]:
    items = list(list_of_tensordicts)
    if not items:
        raise ValueError(f"{caller} needs at least one TensorDict")
    for index, item in enumerate(items):
        if not isinstance(item, TensorDictBase):
            raise TypeError(
                f"{caller}: item {index} is a {type(item).__name__}, not a TensorDict (for plain lists of 1-D "
                f"tensors use llmrl_core.data.{caller})"
            )
    return items


def as_padded_tensor(list_of_tensordicts: Sequence[TensorDictBase], dim: int = 0, stack_dim: int = 0) -> TensorDictBase:
    """Stack TensorDicts into one whose every entry is padded with zeros on the left of dimension ``dim`` up to
    the longest, then stacked along ``stack_dim``; the batch size is the first one's with the count inserted at
    ``dim`` (TorchRL's layout). ``dim`` must be >= 0."""
    items = _checked(list_of_tensordicts, "as_padded_tensor")
    if dim < 0:
        raise ValueError("dim must be >= 0")

    def pad_and_stack(*tensors: torch.Tensor) -> torch.Tensor:
        longest = max(t.shape[dim] for t in tensors)
        padded = []
        for tensor in tensors:
            widths = [0] * (2 * (tensor.ndim - dim))
            widths[-2] = longest - tensor.shape[dim]  # F.pad lists the last dimension first: (left, right) pairs
            padded.append(F.pad(tensor, widths) if widths[-2] else tensor)
        return torch.stack(padded, dim=stack_dim)

    batch_size = list(items[0].batch_size)
    batch_size.insert(dim, len(items))
    return items[0].apply(pad_and_stack, *items[1:], batch_size=batch_size)


def as_nested_tensor(list_of_tensordicts: Sequence[TensorDictBase]) -> TensorDictBase:
    """Stack TensorDicts into one whose entries are jagged ``torch.nested`` tensors (leading dimension: the
    count), batch size ``(count, *first.batch_size)``."""
    items = _checked(list_of_tensordicts, "as_nested_tensor")

    def nest(*tensors: torch.Tensor) -> torch.Tensor:
        return torch.nested.as_nested_tensor(list(tensors), layout=torch.jagged)

    return items[0].apply(nest, *items[1:], batch_size=[len(items), *items[0].batch_size])
