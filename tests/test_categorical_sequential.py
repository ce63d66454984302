"""CategoricalSequential against torch.distributions.Categorical on the masked-in positions, and the NCCL helper."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import Categorical

from llmrl_core.modules.policies.distributions import CategoricalSequential
from llmrl_core.ports import free_port
from llmrl_core.weight_sync import stateless_init_process_group

B, T, V = 3, 7, 11


@pytest.fixture
def case():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(B, T, V, generator=gen) * 3
    mask = torch.rand(B, T, generator=gen) > 0.35
    mask[0, 0] = True
    mask[2] = False  # one fully masked row
    tokens = torch.randint(0, V, (B, T), generator=gen)
    return logits, mask, tokens


def test_log_prob_matches_categorical_on_masked_positions_and_is_zero_elsewhere(case):
    logits, mask, tokens = case
    dist = CategoricalSequential(logits, mask)
    lp = dist.log_prob(tokens)
    want = Categorical(logits=logits).log_prob(tokens)
    assert lp.shape == (B, T) and dist.batch_shape == (B, T)
    torch.testing.assert_close(lp[mask], want[mask], atol=1e-6, rtol=0)
    assert torch.all(lp[~mask] == 0)


def test_entropy_and_mode_match_categorical(case):
    logits, mask, _ = case
    dist = CategoricalSequential(logits, mask, pad_token_id=-1)
    ref = Categorical(logits=logits)
    torch.testing.assert_close(dist.entropy()[mask], ref.entropy()[mask], atol=1e-5, rtol=0)
    assert torch.all(dist.entropy()[~mask] == 0)
    assert torch.equal(dist.mode[mask], ref.mode[mask]) and torch.all(dist.mode[~mask] == -1)


def test_temperature_scales_the_logits(case):
    logits, mask, tokens = case
    dist = CategoricalSequential(logits, mask, temperature=0.6)
    ref = Categorical(logits=logits / 0.6)
    torch.testing.assert_close(dist.log_prob(tokens)[mask], ref.log_prob(tokens)[mask], atol=1e-6, rtol=0)
    torch.testing.assert_close(dist.entropy()[mask], ref.entropy()[mask], atol=1e-5, rtol=0)
    assert not torch.allclose(dist.log_prob(tokens)[mask], Categorical(logits=logits).log_prob(tokens)[mask])


def test_no_mask_means_every_position_and_ignore_index_is_masked(case):
    logits, _, tokens = case
    dist = CategoricalSequential(logits)
    torch.testing.assert_close(dist.log_prob(tokens), Categorical(logits=logits).log_prob(tokens), atol=1e-6, rtol=0)
    ignored = tokens.clone()
    ignored[1, 2:] = -100
    lp = dist.log_prob(ignored)
    assert torch.all(lp[1, 2:] == 0) and torch.all(lp[1, :2] != 0)


def test_garbage_logits_at_masked_positions_do_not_leak(case):
    logits, mask, tokens = case
    dirty = logits.clone()
    dirty[~mask] = float("nan")
    dist = CategoricalSequential(dirty.requires_grad_(), mask)
    lp = dist.log_prob(tokens)
    assert torch.isfinite(lp).all() and torch.isfinite(dist.entropy()).all()
    lp.sum().backward()
    assert torch.isfinite(dirty.grad).all() and torch.all(dirty.grad[~mask] == 0)


def test_sample_shape_respects_mask_and_log_prob_takes_sample_dims(case):
    logits, mask, _ = case
    logits = logits.clone()
    logits[..., 4] += 100.0  # nearly deterministic: token 4 everywhere
    dist = CategoricalSequential(logits, mask, pad_token_id=0)
    draws = dist.sample((5,))
    assert draws.shape == (5, B, T) and draws.dtype == torch.long
    assert torch.all(draws[:, mask] == 4) and torch.all(draws[:, ~mask] == 0)
    lp = dist.log_prob(draws)
    assert lp.shape == (5, B, T)
    torch.testing.assert_close(lp[0], dist.log_prob(draws[0]))


def test_bf16_logits_are_scored_in_fp32(case):
    logits, mask, tokens = case
    dist = CategoricalSequential(logits.bfloat16(), mask)
    assert dist.log_prob(tokens).dtype == torch.float32


def test_shape_errors(case):
    logits, mask, tokens = case
    with pytest.raises(ValueError, match="mask"):
        CategoricalSequential(logits, mask[:, :-1])
    with pytest.raises(ValueError, match="temperature"):
        CategoricalSequential(logits, mask, temperature=0.0)
    with pytest.raises(ValueError, match="batch shape"):
        CategoricalSequential(logits, mask).log_prob(tokens[:, :-1])


# --- stateless_init_process_group ---------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on machines without CUDA")
def test_stateless_group_without_cuda_says_nccl_needs_cuda():
    with pytest.raises(RuntimeError, match="NCCL weight sync needs CUDA"):
        stateless_init_process_group("127.0.0.1", free_port(), 0, 1, "cuda:0")


def test_stateless_group_argument_checks():
    with pytest.raises(ValueError, match="rank"):
        stateless_init_process_group("127.0.0.1", 1, 2, 2, "cuda:0")
    with pytest.raises(ValueError, match="world_size"):
        stateless_init_process_group("127.0.0.1", 1, 0, 0, "cuda:0")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_stateless_group_world_size_one_broadcasts_on_gpu():
    pytest.importorskip("vllm.distributed.device_communicators.pynccl")
    comm = stateless_init_process_group("127.0.0.1", free_port(), 0, 1, torch.device("cuda:0"))
    assert comm.rank == 0 and comm.world_size == 1
    tensor = torch.arange(8, dtype=torch.float32, device="cuda:0")
    comm.broadcast(tensor, src=0, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    assert tensor.cpu().tolist() == list(range(8))
