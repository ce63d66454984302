"""``llmrl_core.envs.transforms.as_padded_tensor`` / ``as_nested_tensor`` (TorchRL's ``torchrl.envs.llm.transforms``
functions on lists of TensorDicts). Expected values: what TorchRL 0.14.1's own functions return for the same input
(run in its side venv)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from llmrl_core.envs.transforms import as_nested_tensor, as_padded_tensor


def rows():
    return [
        TensorDict({"a": torch.tensor([1, 2]), "n": {"b": torch.tensor([[1.0], [2.0], [3.0]])}}),
        TensorDict({"a": torch.tensor([3]), "n": {"b": torch.tensor([[4.0]])}}),
    ]


def test_as_padded_tensor_pads_on_the_left_with_zeros_and_stacks():
    out = as_padded_tensor(rows())
    assert out.batch_size == torch.Size([2])
    assert out["a"].tolist() == [[1, 2], [0, 3]] and out["a"].dtype == torch.int64
    assert out["n", "b"].tolist() == [[[1.0], [2.0], [3.0]], [[0.0], [0.0], [4.0]]]
    with pytest.raises(ValueError, match="dim must be >= 0"):
        as_padded_tensor(rows(), dim=-1)


def test_as_nested_tensor_keeps_the_lengths():
    out = as_nested_tensor(rows())
    assert out.batch_size == torch.Size([2]) and out["a"].is_nested
    assert [t.tolist() for t in out["a"].unbind(0)] == [[1, 2], [3]]
    assert [t.shape[0] for t in out["n", "b"].unbind(0)] == [3, 1]


def test_plain_tensors_are_pointed_to_the_data_helpers():
    with pytest.raises(TypeError, match=r"item 0 is a Tensor, not a TensorDict .*llmrl_core.data.as_padded_tensor"):
        as_padded_tensor([torch.tensor([1, 2])])
    with pytest.raises(ValueError, match="at least one TensorDict"):
        as_nested_tensor([])
