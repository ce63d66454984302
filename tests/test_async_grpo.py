"""Asynchronous GRPO (``rollout.max_staleness``): the batch schedule, the queue of in-flight rollouts, the store's
per-batch shards, the trainer's staleness bound, and a real run killed mid-pipeline and resumed."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from cli_runs import cli_env, kill_when_committed
from storage_records import make_records

from llmrl_cli.run import MAIN_JOB
from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.weight_sync import vLLMUpdater
from storage.lineage import LineageRecorder
from storage.trajectories import TrajectoryStore
from tasks import grpo_stages as stages


def _cfg(*overrides: str) -> GRPOConfig:
    return load_config(GRPOConfig, None, ["iterations=5", "data.prompts_per_iteration=2", *overrides])


def test_batch_schedule_samples_each_batch_at_most_k_versions_behind(tmp_path):
    staging = str(tmp_path / "staging")
    sync = [stages.batch_of(_cfg(), staging, v) for v in range(5)]
    assert [(b.policy_version, b.shard_prefix, b.staleness) for b in sync] == [(v, None, 0) for v in range(5)]
    assert {b.staging_uri for b in sync} == {staging}  # as before: one staging store
    two = [stages.batch_of(_cfg("rollout.max_staleness=2"), staging, v) for v in range(5)]
    assert [b.policy_version for b in two] == [0, 0, 0, 1, 2]
    assert [b.staleness for b in two] == [0, 1, 2, 2, 2]
    assert len({b.staging_uri for b in two}) == 5 and len({b.shard_prefix for b in two}) == 5
    assert two[3].shard_prefix == "b000003-" and two[3].staging_uri == f"{staging}/batch-3"
    remote = stages.batch_of(_cfg("rollout.max_staleness=1"), "s3://b/r/staging?scheme=http", 2)
    assert remote.staging_uri == "s3://b/r/staging/batch-2?scheme=http"  # URI options stay at the end


def test_staleness_needs_the_checkpoints_a_resume_samples_with():
    with pytest.raises(ValueError, match=r"keep_checkpoints.*must exceed rollout.max_staleness \(3\)"):
        _cfg("rollout.max_staleness=3", "keep_checkpoints=3")
    with pytest.raises(ValueError, match=r"rollout.max_staleness.*must be >= 0"):
        _cfg("rollout.max_staleness=-1")


class _Future:
    def __init__(self, value):
        self.value = value

    def result(self, timeout=None):
        return self.value


class _Engine:
    """Records the calls a real rollout actor receives, in order."""

    def __init__(self, log: list):
        self.log = log

    def load(self, path: str, version: int) -> _Future:
        self.log.append(("load", version))
        return _Future(version)

    def rollout(self, rows, version, staging_uri, shard, batch) -> _Future:
        self.log.append(("rollout", version, batch, [r.prompt_id for r in rows]))
        return _Future({"rows": len(rows), "seconds": 0.0})


def _queue(tmp_path, monkeypatch, cfg, engine_version, cursor, log):
    """A RolloutAhead over fake engines; prompts come from a counter cursor (the primer's own logic is tested
    elsewhere), the await stage is called without Prefect."""
    from tasks.rollout_ahead import RolloutAhead

    def load_prompts(cfg, state):
        n = (state or {"next": 0})["next"]
        rows = [SimpleNamespace(prompt_id=f"p{n}", group_id=f"g{n}")]
        return rows, {"next": n + 1}

    monkeypatch.setattr(stages, "load_prompts", load_prompts)
    monkeypatch.setattr(stages, "await_rollout", lambda calls, version=None: [f.result() for _, f in calls])
    checkpoints = SimpleNamespace(weights_path=lambda v: tmp_path / f"policy_v{v}.safetensors")
    return RolloutAhead(cfg, str(tmp_path / "staging"), [_Engine(log)], checkpoints, engine_version, cursor)


def test_rollouts_run_ahead_with_the_version_each_batch_needs(tmp_path, monkeypatch):
    """The flow's calls for a fresh run with k=1: batch v+1 is sent (sampled by v) before batch v is trained."""
    log: list = []
    cfg = _cfg("rollout.max_staleness=1", "iterations=3")
    ahead = _queue(tmp_path, monkeypatch, cfg, 0, None, log)
    ahead.fill(0)
    taken = []
    for version in range(cfg.iterations):
        ahead.send(version + 1)
        arrived = ahead.take(version)
        taken.append((arrived.batch.index, arrived.batch.policy_version, arrived.primer_state))
        log.append(("train", version))
        ahead.published(version + 1)  # publish loads version + 1 into the engines
    assert log == [
        ("rollout", 0, 0, ["p0"]),
        ("rollout", 0, 1, ["p1"]),  # sent before batch 0 is trained: sampled by version 0, one behind
        ("train", 0),
        ("rollout", 1, 2, ["p2"]),
        ("train", 1),
        ("train", 2),  # no batch 3: the run ends at version 3
    ]
    # each published version stores the data cursor after its own batch, not after the batches in flight
    assert taken == [(0, 0, {"next": 1}), (1, 0, {"next": 2}), (2, 1, {"next": 3})]


def test_resume_resends_the_unpublished_batches_with_their_own_checkpoints(tmp_path, monkeypatch):
    """Resuming at version 3 with k=2: batches 3 and 4 are sampled again by versions 1 and 2 (fresh engines hold
    version 0), from the cursor stored with version 3, before batch 5 is sampled by version 3."""
    log: list = []
    cfg = _cfg("rollout.max_staleness=2", "iterations=6")
    ahead = _queue(tmp_path, monkeypatch, cfg, 0, {"next": 3}, log)
    original = vLLMUpdater.push_weights
    with mock.patch.object(vLLMUpdater, "push_weights", autospec=True, side_effect=original) as pushed:
        ahead.fill(3)
        ahead.send(5)
    assert ahead.take(3).batch.policy_version == 1
    # each load goes through TorchRL's vLLMUpdater (the one sender), with its version's checkpoint
    assert [(c.args[0].version, Path(c.args[1]).name) for c in pushed.call_args_list] == [
        (v, f"policy_v{v}.safetensors") for v in (1, 2, 3)
    ]
    assert log == [
        ("load", 1),
        ("rollout", 1, 3, ["p3"]),
        ("load", 2),
        ("rollout", 2, 4, ["p4"]),
        ("load", 3),
        ("rollout", 3, 5, ["p5"]),
    ]


def test_synchronous_queue_is_the_old_loop(tmp_path, monkeypatch):
    log: list = []
    cfg = _cfg("iterations=2")
    ahead = _queue(tmp_path, monkeypatch, cfg, 0, None, log)
    ahead.fill(0)
    assert log == []  # nothing in flight before training
    for version in range(2):
        ahead.send(version)
        arrived = ahead.take(version)
        assert arrived.batch.policy_version == version and arrived.batch.shard_prefix is None
        ahead.published(version + 1)
    assert log == [("rollout", 0, 0, ["p0"]), ("rollout", 1, 1, ["p1"])]


def test_batches_sharing_a_version_are_stored_read_and_replaced_apart(tmp_path):
    store = TrajectoryStore(tmp_path / "traj")
    first, second = make_records("r", 0, seed=1), make_records("r", 0, seed=2)
    store.write_shard("r", 0, "b000000-0", first)
    store.write_shard("r", 0, "b000001-0", second)
    assert len(store.read_records("r", version=0)) == len(first) + len(second)  # queries by version see both
    got = store.read_records("r", version=0, shard_prefix="b000001-")
    assert [(r.group_id, r.sample_index, r.reward) for r in got] == [
        (r.group_id, r.sample_index, r.reward) for r in second
    ]
    digest_all = store.partition_digest("r", 0)
    digest_one, rows, shards = store.partition_digest("r", 0, "b000001-")
    assert rows == len(second) and [s.name for s in shards] == ["b000001-0.parquet"]
    assert digest_one != digest_all[0]
    store.delete_partition("r", 0, "b000001-")  # a retried batch replaces only its own shards
    assert [s.name for s in store.shards("r", version=0)] == ["b000000-0.parquet"]


def test_lineage_names_the_batch_of_a_shared_partition(tmp_path):
    store = TrajectoryStore(tmp_path / "traj")
    store.write_shard("r", 0, "b000000-0", make_records("r", 0, seed=1))
    store.write_shard("r", 0, "b000001-0", make_records("r", 0, seed=2))
    with LineageRecorder(tmp_path / "run", pipeline="grpo", run_id="r", config={}) as lineage:
        ref = lineage.log_trajectory_partition(store, 0, shard_prefix="b000001-")
    assert ref.name == "trajectories/r/policy_version=0/b000001-*"
    assert ref.num_rows == len(make_records("r", 0, seed=2)) and ref.policy_version == 0


def test_trainer_refuses_rows_older_than_the_bound(tmp_path):
    """The trainer's own check (before any forward pass): a batch sampled more than max_staleness versions ago."""
    from runtime.trainer_actor import TrainerWorker

    store = TrajectoryStore(tmp_path / "traj")
    store.write_shard("r", 0, "b000002-0", make_records("r", 0))
    worker = SimpleNamespace(cfg=_cfg("run_id=r", "rollout.max_staleness=1"))
    with pytest.raises(RuntimeError, match=r"version 2 -> 3 has rows sampled by versions \[0\].*allows versions 1..2"):
        TrainerWorker.train(worker, str(tmp_path / "traj"), 0, "b000002-", 2)


def _tiny(tmp_path, *extra):
    return [
        "run_id=a1",
        f"runs_dir={tmp_path / 'runs'}",
        "iterations=3",
        "data.prompts_per_iteration=2",
        "data.group_size=4",
        "rollout.max_new_tokens=24",
        "rollout.dtype=float32",
        "train.mixed_precision=no",  # fp32 on both sides: sampler log-probs equal the checkpoint's exactly
        "rollout.temperature=1.0",
        "train.lr=1e-5",
        "rollout.max_staleness=1",
        "keep_checkpoints=5",  # the test reads every sampling checkpoint back
        "final_eval.questions=0",
        "progress=false",
        *extra,
    ]


@pytest.mark.slow
@pytest.mark.xdist_group("dev-shm")  # see tests/conftest.py
def test_async_run_killed_mid_pipeline_resumes_exactly(tmp_path, default_model_path):
    """max_staleness=1: SIGKILL (flow and Dask workers) once version 1 is committed — batch 1 (sampled by version
    0) is staged or in flight and batch 2 may be being sampled — then a resume. Every batch is stored once, by
    the version that sampled it, each row's log-probs are those of that version's checkpoint (so the resume
    re-sampled with the right weights), and no version is trained twice."""
    import subprocess
    import sys

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from flows.grpo import grpo
    from runtime.records import record_to_sample

    overrides = _tiny(tmp_path)
    runs = tmp_path / "runs"
    state = runs / "a1" / "state"
    config = str(MAIN_JOB)  # two-digit addition: the base model gets some right, so version 1 differs from 0
    args = ["--config", config, *(a for o in overrides for a in ("--set", o))]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from llmrl_cli.main import app; app()", "run", "grpo", *args],
        cwd=Path(__file__).resolve().parents[1],
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    kill_when_committed(proc, state, 1)
    assert sorted(p.name for p in state.glob("published-v*.json")) == ["published-v0.json", "published-v1.json"]
    store = TrajectoryStore(runs / "trajectories")
    batch0 = {s.name: Path(s.path).read_bytes() for s in store.shards("a1", version=0, shard_prefix="b000000-")}
    assert batch0  # batch 0 was published with version 1

    summary = grpo(config=config, overrides=overrides)
    assert summary["published_version"] == 3
    assert {s.name: Path(s.path).read_bytes() for s in store.shards("a1", version=0, shard_prefix="b000000-")} == (
        batch0
    )  # nothing published was rewritten
    # batches 0 and 1 were both sampled by version 0, batch 2 by version 1: stored by that version, once each
    assert store.versions("a1") == [0, 1]
    assert [s.name for s in store.shards("a1")] == ["b000000-0.parquet", "b000001-0.parquet", "b000002-0.parquet"]
    prompts = set()
    for prefix, sampled_by in (("b000000-", 0), ("b000001-", 0), ("b000002-", 1)):
        records = store.read_records("a1", shard_prefix=prefix)
        assert len(records) == 8 and len({(r.group_id, r.sample_index) for r in records}) == 8
        assert {r.policy_version for r in records} == {sampled_by}
        batch_prompts = {r.prompt_id for r in records}
        assert not batch_prompts & prompts  # the data cursor moved on batch by batch, across the resume
        prompts |= batch_prompts
    markers = {v: json.loads((state / f"published-v{v}.json").read_text()) for v in (1, 2, 3)}
    assert [markers[v]["metrics"]["sampled_by_version"] for v in (1, 2, 3)] == [0, 0, 1]
    assert markers[2]["metrics"]["staleness_1_rows"] == 8 and "offpolicy_abs_diff_mean" in markers[2]["metrics"]
    assert "agreement_abs_diff_mean" in markers[1]["metrics"]  # batch 0 is on-policy
    assert not any((runs / "a1" / "staging").rglob("*.parquet"))

    # each batch's sampler log-probs are its sampling checkpoint's teacher-forced log-probs (fp32 engine)
    model = AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32).eval()
    ckpt = runs / "a1" / "checkpoints"
    w0, w1 = (load_file(ckpt / f"policy_v{v:06d}.safetensors") for v in (0, 1))
    assert any(not torch.equal(w0[k], w1[k]) for k in w0)  # so the check below tells the two versions apart
    for prefix, sampled_by in (("b000001-", 0), ("b000002-", 1)):
        model.load_state_dict(load_file(ckpt / f"policy_v{sampled_by:06d}.safetensors"), strict=False)
        model.tie_weights()
        for record in store.read_records("a1", shard_prefix=prefix):
            sample = record_to_sample(record)
            ids = torch.tensor([list(sample.prompt_ids) + list(sample.response_ids)])
            with torch.no_grad():
                logits = model(ids).logits[0, len(sample.prompt_ids) - 1 : -1]
            expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(sample.response_ids)[:, None])
            assert (expected.squeeze(-1) - torch.tensor(record.sampler_logprobs)).abs().max().item() < 1e-3


def test_config_hash_keeps_older_runs_resumable_and_ignores_placement():
    """A run started before rollout.max_staleness existed keeps its hash (the setting is left out at its default);
    threads and GPU shares say where a run computes, not what a version is."""
    from storage.hashing import config_hash

    base = config_hash(stages.lineage_config(_cfg()))
    assert "max_staleness" not in stages.lineage_config(_cfg())["rollout"]
    assert config_hash(stages.lineage_config(_cfg("rollout.threads=1", "rollout.gpu_memory_utilization=0.3"))) == base
    assert config_hash(stages.lineage_config(_cfg("rollout.max_staleness=1"))) != base
