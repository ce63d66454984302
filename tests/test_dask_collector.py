"""DaskLLMCollector: two resident engines on two Dask worker processes, sharded prompts, one version."""

from __future__ import annotations

import functools

import pytest
import torch

from llmrl_core.collectors.dask_collector import DaskLLMCollector, shard_by_group
from llmrl_core.collectors.tensordict_batches import rows as episodes
from llmrl_core.envs import PromptRow, make_gsm8k_env
from llmrl_core.modules.backends.types import EngineConfig, SamplingConfig


def test_shard_by_group_keeps_groups_together_and_balances():
    rows = [PromptRow({"q": i}, prompt_id=i // 3, group_id=i // 3, sample_index=i % 3) for i in range(12)]
    shards = shard_by_group(rows, 3)
    assert sorted(len(s) for s in shards) == [3, 3, 6]
    for shard in shards:
        groups = {r.group_id for r in shard}
        assert all(sum(r.group_id == g for r in shard) == 3 for g in groups)
    assert sorted(r.data["q"] for s in shards for r in s) == list(range(12))


def gsm8k_env_factory(tokenizer):
    """Module-level (picklable) env factory: a GSM8K env that takes any number of prompts per reset."""
    return make_gsm8k_env(batch_size=1, tokenizer=tokenizer, input_mode="tokens")


@pytest.mark.extended  # the long tier: pytest -m extended (README "Tests")
@pytest.mark.slow
def test_two_workers_collect_with_consistent_versions(default_model_path, tmp_path):
    from dask.distributed import Client, LocalCluster

    from llmrl_core.builtin_data import load_gsm8k
    from llmrl_core.modules.backends.transformers.scoring import load_causal_lm

    rows = [
        PromptRow({"query": r["question"], "answer": r["answer"]}, prompt_id=i, group_id=i, sample_index=k)
        for i, r in enumerate(load_gsm8k("test", 4))
        for k in range(2)
    ]
    config = EngineConfig(model=default_model_path, dtype="float32", kv_cache_gb=1, seed=0)
    sampling = SamplingConfig(max_new_tokens=16, temperature=1.0, seed=0)
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            local_directory=str(tmp_path / "dask"),
        ) as cluster,
        Client(cluster) as client,
    ):
        collector = DaskLLMCollector(
            client,
            functools.partial(gsm8k_env_factory),
            engine_config=config,
            sampling=sampling,
            shared_dir=tmp_path / "weights",
        )
        assert len(collector.actors) == 2
        first = episodes(collector.collect(rows))
        assert len(first) == 8
        assert sorted((t.group_id, t.sample_index) for t in first) == sorted((r.group_id, r.sample_index) for r in rows)
        assert all(t.policy_versions == [0] for t in first)
        assert all(t.reward in (0.0, 0.1, 1.0) for t in first)

        model, _ = load_causal_lm(default_model_path)
        with torch.no_grad():
            for param in model.parameters():
                param.mul_(0.0)  # a degenerate policy: every token equally likely
        assert collector.push_weights(model) == 1
        assert collector.engine_versions() == [1, 1]
        second = episodes(collector.collect(rows))
        assert all(t.policy_versions == [1] for t in second)
        # uniform logits over the 49152-token vocabulary: every sampled token has log-prob -log(V)
        lps = torch.cat([t.sampler_log_probs for t in second])
        torch.testing.assert_close(
            lps, torch.full_like(lps, -torch.log(torch.tensor(49152.0)).item()), atol=1e-3, rtol=0
        )

        # shutdown frees each engine on its worker (Dask alone drops an actor, and an in-process vLLM engine
        # dropped without its shutdown stays in memory: a frozen GC heap, reload records keyed by its layers)
        def rss_mib() -> float:
            import gc

            import psutil

            gc.collect()
            return psutil.Process().memory_info().rss / 2**20

        resident = client.run(rss_mib)
        collector.shutdown()
        assert collector.actors == []
        freed = {a: resident[a] - after for a, after in client.run(rss_mib).items()}
        print("MiB freed per worker by shutdown:", freed)
        # each engine held fp32 weights (~540 MB) and a 1 GiB KV cache
        assert all(mib > 1000 for mib in freed.values()), freed
