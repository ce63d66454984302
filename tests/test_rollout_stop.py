"""A run that stops (Ctrl-C, SIGTERM, an error) while an engine is rolling out: on a joined cluster the workers
outlive the run, so the engine must not finish its rollout into the run's staging area after the run has gone.
The run's teardown (:meth:`runtime.cluster.Placement.close_actors`) tells every actor to stop before closing it."""

from __future__ import annotations

import time

import pytest

from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig


@pytest.mark.slow
def test_a_rollout_in_flight_when_the_run_stops_writes_nothing(tmp_path, default_model_path):
    from one_worker_cluster import one_worker_cluster

    from runtime.cluster import Placement
    from runtime.rollout_actor import RolloutStopped, RolloutWorker
    from storage.trajectories import TrajectoryStore
    from tasks import grpo_stages as stages

    cfg = load_config(
        GRPOConfig,
        None,
        [
            "run_id=stop",
            f"runs_dir={tmp_path / 'runs'}",
            "data.prompts_per_iteration=4",
            "data.group_size=4",
            "rollout.max_new_tokens=48",
            "rollout.dtype=float32",
            "progress=false",
        ],
    )
    rows, _ = stages.load_prompts(cfg, None)
    staging = tmp_path / "staging"
    store = TrajectoryStore(staging)
    with one_worker_cluster(tmp_path / "dask", as_default=True) as client:
        (worker,) = client.scheduler_info()["workers"]
        place = Placement(client, [worker], worker)
        engine = place.start_actor(RolloutWorker, cfg, worker=worker).result()
        # a rollout the run waits for writes its shard (so the stopped one below can be told apart)
        assert engine.rollout(rows[:2], 0, str(staging), 0).result(timeout=300)["rows"] == 2
        assert len(store.read_records("stop", version=0)) == 2

        call = engine.rollout(rows, 0, str(staging), 1)  # 16 responses of up to 48 tokens: seconds on one core
        time.sleep(1.0)  # the engine is generating
        stopped = time.monotonic()
        place.close_actors()  # what a stopping run does as it leaves a joined cluster
        with pytest.raises(RolloutStopped, match="stopped before writing its 16 rows"):
            call.result(timeout=120)
        print(f"close_actors returned {time.monotonic() - stopped:.1f} s after the stop")
        assert len(store.read_records("stop", version=0)) == 2  # the stopped rollout wrote no shard
        assert len(store.shards("stop", version=0)) == 1
