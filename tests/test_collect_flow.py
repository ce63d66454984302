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


@pytest.mark.extended  # the long tier: pytest -m extended (README "Tests")
@pytest.mark.slow
def test_a_killed_rollout_worker_heals_and_the_partition_is_exact(tmp_path, default_model_path, monkeypatch):
    """The rollout worker is killed (SIGKILL) in the middle of the collection (its first rollout). The flow names the
    lost worker in one line, starts new workers, collects again from the first batch and writes the partition:
    every row once (0 lost, 0 duplicated), as a collection without the fault."""
    import logging
    from pathlib import Path

    import dask

    from flows.collect import collect
    from storage.trajectories import TrajectoryStore

    preload = str(Path(__file__).parent / "fault_preloads" / "rollout_worker_dies_once.py")
    marker = tmp_path / "killed.txt"
    monkeypatch.setenv("LLMRL_TEST_FAULT_MARKER", str(marker))
    monkeypatch.setenv("LLMRL_TEST_FAULT_VERSION", "0")
    overrides = [
        "run_id=c2",
        f"runs_dir={tmp_path / 'runs'}",
        "data.prompts_per_iteration=2",
        "data.group_size=2",
        "rollout.max_new_tokens=8",
        "dask.restarts=1",
    ]
    said: list[str] = []
    heard = logging.Handler()
    heard.emit = lambda record: said.append(record.getMessage())  # the flow's own log lines
    logging.getLogger("prefect.flow_runs").addHandler(heard)
    try:
        with dask.config.set({"distributed.worker.preload": [preload]}):
            summary = collect(overrides=overrides, policy_version=0, batches=2)
    finally:
        logging.getLogger("prefect.flow_runs").removeHandler(heard)
    assert marker.exists(), "the fault did not happen"
    said = [line for line in said if "Restart 1 of 1 (dask.restarts)" in line]
    assert len(said) == 1 and "the rollout worker tcp://127.0.0.1:" in said[0], said
    assert "died during rollout of version 0" in said[0] and "collecting again from the first batch" in said[0]
    assert summary["rows"] == 8
    records = TrajectoryStore(tmp_path / "runs" / "trajectories").read_records("c2-collect", version=0)
    assert len(records) == 8  # 2 batches x 2 prompts x 2 samples, once each
    assert sorted((r.group_id, r.sample_index) for r in records) == sorted(
        {(r.group_id, r.sample_index) for r in records}
    )
