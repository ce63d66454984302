"""The collect flow: rollouts of a stored version written as a partition, without training."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_collect_writes_a_partition_of_the_base_model(tmp_path, default_model_path):
    from flows.collect import collect
    from storage.trajectories import TrajectoryStore

    overrides = [
        "run_id=c1",
        f"runs_dir={tmp_path / 'runs'}",
        "data.prompts_per_iteration=2",
        "data.group_size=2",
        "rollout.max_new_tokens=16",
    ]
    summary = collect(overrides=overrides, policy_version=0, batches=2)
    assert summary["run_id"] == "c1-collect" and summary["rows"] == 8
    store = TrajectoryStore(tmp_path / "runs" / "trajectories")
    assert store.runs() == ["c1-collect"] and store.versions("c1-collect") == [0]
    records = store.read_records("c1-collect", version=0)
    assert len(records) == 8 and len({r.group_id for r in records}) == 4  # 2 batches x 2 prompts x 2 samples
    assert all(r.advantage is not None and len(r.sampler_logprobs) == len(r.response_tokens) for r in records)
    assert not (tmp_path / "runs" / "c1" / "checkpoints").exists()  # nothing was trained or published
    with pytest.raises(ValueError, match="has no checkpoint 3"):
        collect(overrides=overrides, policy_version=3)
