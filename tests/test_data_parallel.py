"""Data-parallel train step: two gloo ranks on CPU give the single-process gradients and update.

One spawn of two ranks runs every objective below (process start-up dominates the cost). The batch is built so
that the token-balanced shards are very unequal in sequences and trained tokens (one long sample on one rank,
seven short ones on the other): a normalisation that weighted the ranks equally would be far off, and the test
asserts that such a naive average differs from the true gradient, so it can fail.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llmrl_core.modules.backends.transformers.scoring import score_response_tokens
from llmrl_core.objectives import GRPOLoss, SFTLoss
from llmrl_core.trainer import Trainer, TrainerConfig, TrainSample
from llmrl_core.trainer.data_parallel import DataParallelTrainer, run_data_parallel, shard_samples

VOCAB = 128
WORLD = 2
# lr/eps bound the first AdamW step's sensitivity to fp32 noise in tiny gradient entries (|dp| <= lr/eps |dg|).
CONFIG = TrainerConfig(lr=1e-3, adam_eps=1e-4, max_grad_norm=1.0, token_budget=24, mixed_precision="no")

OBJECTIVES = {
    "grpo-token_mean": lambda m: GRPOLoss(m, kl_to_ref_coeff=0.1, clip_epsilon=(0.2, 0.28)),
    "grpo-prompt_mean": lambda m: GRPOLoss(m, aggregation="prompt_mean", entropy_coeff=0.02),
    "grpo-sequence_sum": lambda m: GRPOLoss(m, aggregation="sequence_sum", norm_constant=16),
    "sft-sum": lambda m: SFTLoss(m, reduction="sum", normalize_by_seq_length=False),  # units None: a plain sum
}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Two shared CPU cores: one intra-op thread per process (restored after the module)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    """A small randomly initialised fp32 Llama."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(config)


def make_samples(model: LlamaForCausalLM) -> list[TrainSample]:
    """One long and seven short samples: off-policy sampler log-probs, a NaN sampler entry, tool-token masks."""
    g = torch.Generator().manual_seed(3)
    shapes = [(14, 26), (3, 2), (4, 3), (2, 4), (5, 1), (3, 3), (2, 5), (4, 2)]
    samples = []
    for i, (p, r) in enumerate(shapes):
        prompt = torch.randint(0, VOCAB, (p,), generator=g).tolist()
        response = torch.randint(0, VOCAB, (r,), generator=g).tolist()
        with torch.no_grad():
            lp = score_response_tokens(model, prompt, response)
        noise = 0.3 * torch.randn(r, generator=g)
        sampler = (lp + noise).tolist()
        if i == 1:
            sampler[0] = math.nan
        samples.append(
            TrainSample(
                prompt,
                response,
                response_mask=[not (i % 3 == 0 and t == r // 2) for t in range(r)],
                sampler_logprobs=sampler,
                advantage=float(torch.randn(1, generator=g)),
                ref_logprobs=(lp - 0.2 * noise).tolist(),
                sample_id=f"s{i}",
            )
        )
    return samples


def grads(trainer: Trainer) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in trainer.params]


def params(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.params]


def rank_worker(rank: int, world_size: int, samples: list[TrainSample]) -> dict[str, dict]:
    """On each rank and for each objective: DP gradients, the parameters after one DP step, and the metrics.

    Rank 1 starts from different weights: the wrapper's broadcast must make the replicas identical.
    """
    torch.set_num_threads(1)
    out: dict[str, dict] = {}
    for name, make in OBJECTIVES.items():
        dp = DataParallelTrainer(Trainer(make(tiny_llama(seed=rank)), CONFIG))
        assert dp.distributed and dp.world_size == world_size
        dp.backward(samples)
        g = grads(dp.trainer)
        # Shards given by the caller (local=True), one of them empty: same gradients again.
        dp.backward(samples if rank == 0 else [], local=True)
        g_uneven = grads(dp.trainer)
        metrics = dp.train_step(samples)
        out[name] = {"grads": g, "grads_uneven": g_uneven, "params": params(dp.trainer), "metrics": metrics}
    return out


def assert_grads_equal(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    scale = max(float(e.abs().max()) for e in expected)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, atol=1e-6 * scale, rtol=1e-5)


def relative_difference(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    num = sum(float((a - e).pow(2).sum()) for a, e in zip(actual, expected, strict=True))
    return math.sqrt(num / sum(float(e.pow(2).sum()) for e in expected))


def test_shard_samples_balances_tokens_deterministically():
    assert shard_samples([40, 6, 6, 6, 6, 6, 6, 6], 2) == [[0], [1, 2, 3, 4, 5, 6, 7]]
    assert shard_samples([5, 9, 3, 12, 4], 2) == [[3, 4], [0, 1, 2]]  # 12+4 vs 9+5+3 tokens
    assert shard_samples([3], 3) == [[0], [], []]
    with pytest.raises(ValueError, match="world_size"):
        shard_samples([1], 0)


def test_without_process_group_is_the_single_process_step():
    model = tiny_llama()
    samples = make_samples(model)
    one = Trainer(OBJECTIVES["grpo-token_mean"](tiny_llama()), CONFIG)
    dp = DataParallelTrainer(Trainer(OBJECTIVES["grpo-token_mean"](tiny_llama()), CONFIG))
    assert not dp.distributed and dp.local_samples(samples) == samples
    m_one, m_dp = one.train_step(samples), dp.train_step(samples)
    assert m_one["loss"] == m_dp["loss"]
    for a, b in zip(params(one), params(dp.trainer), strict=True):
        assert torch.equal(a, b)


@pytest.mark.engine
def test_two_gloo_ranks_match_the_single_process_step():
    model = tiny_llama()
    samples = make_samples(model)
    shards = shard_samples([s.length for s in samples], WORLD)
    assert [len(s) for s in shards] == [1, 7]  # very unequal shards: the normalisation matters

    results = run_data_parallel(
        rank_worker, WORLD, args=(samples,), backend="gloo", timeout_s=120, start_method="forkserver"
    )

    for name, make in OBJECTIVES.items():
        single = Trainer(make(tiny_llama()), CONFIG)
        m_single = single.backward(samples)
        assert m_single["num_micro_batches"] >= 3
        g_single = grads(single)

        # What averaging the ranks' own batch gradients (DDP's mean over ranks) would give: far off.
        naive = []
        for shard in shards:
            single.backward([samples[i] for i in shard])
            naive.append(grads(single))
        g_naive = [torch.stack(per_rank).mean(0) for per_rank in zip(*naive, strict=True)]
        assert relative_difference(g_naive, g_single) > 0.1, name

        m_step = single.train_step(samples)
        p_single = params(single)
        for rank, result in enumerate(results):
            got = result[name]
            assert_grads_equal(got["grads"], g_single)
            assert_grads_equal(got["grads_uneven"], g_single)
            for a, e in zip(got["params"], p_single, strict=True):
                torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-5)
            # Metrics of the global batch on every rank: counts, loss terms, token-weighted diagnostics, maxima.
            metrics = got["metrics"]
            assert set(metrics) == set(m_step)
            for key in ("num_samples", "num_tokens", "num_loss_tokens", "skipped", "step"):
                assert metrics[key] == m_step[key], (name, rank, key)
            for key in set(m_step) - {"num_micro_batches", "step_time_s", "tokens_per_s"}:
                assert metrics[key] == pytest.approx(m_step[key], rel=1e-5, abs=1e-6), (name, rank, key)
            assert metrics["num_micro_batches"] >= WORLD
        assert torch.equal(results[0][name]["params"][0], results[1][name]["params"][0])  # replicas in sync
