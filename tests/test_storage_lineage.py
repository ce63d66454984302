"""MLflow lineage: experiment/run per pipeline/run, inputs with digests, versions findable by policy version."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from storage_records import make_records

from storage.checkpoints import CheckpointStore
from storage.hashing import config_hash
from storage.lineage import LineageConfig, LineageError, LineageRecorder, default_tracking_uri
from storage.lineage_query import version_lineage
from storage.trajectories import TrajectoryStore

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT / "llmrl_core" / "builtin_data" / "gsm8k"
CONFIG = {"pipeline": "grpo", "model": {"id": "SmolLM2-135M-Instruct", "dtype": "bfloat16"}, "lr": 5e-6, "group": 8}


def _weights(version: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((2, 2), float(version))}


def _simulate_run(run_dir: Path, store: TrajectoryStore, versions: int = 3, **kwargs) -> LineageRecorder:
    """Three GRPO iterations of run ``run_dir.name``: version v's trajectories train version v+1."""
    checkpoints = CheckpointStore(run_dir / "checkpoints")
    run_id = run_dir.name
    recorder = LineageRecorder(run_dir, pipeline="grpo", run_id=run_id, config=CONFIG, **kwargs)
    prompts = recorder.log_training_dataset(next(GSM8K.glob("*train*")), name="gsm8k-train")
    checkpoints.save(_weights(0), 0, config=CONFIG)
    for version in range(versions):
        store.write_shard(run_id, version, 0, make_records(run_id, version))
        partition = recorder.log_trajectory_partition(store, version)
        manifest = checkpoints.save(_weights(version + 1), version + 1, parent_version=version, config=CONFIG)
        recorder.log_version(
            version + 1,
            checkpoint=manifest,
            checkpoint_uri=str(checkpoints.weights_path(version + 1)),
            data=[partition, prompts],
            params={"optimizer_steps": 4, "iteration": version},
            metrics={"reward_mean": 0.25 * version, "loss": 1.0 / (version + 1)},
        )
    return recorder


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    base = tmp_path_factory.mktemp("lineage")
    store = TrajectoryStore(base / "trajectories")
    settings = LineageConfig(registered_model="grpo-policy")
    recorder = _simulate_run(base / "run-a", store, lineage_config=settings)
    recorder.end()
    return base, store, recorder


def test_default_tracking_store_is_one_sqlite_per_runs_root(recorded):
    base, _, recorder = recorded
    assert recorder.tracking_uri == f"sqlite:///{base / 'mlflow.db'}"
    assert (base / "mlflow.db").is_file() and not (base / "run-a" / "mlflow.db").exists()
    client = MlflowClient(recorder.tracking_uri)
    experiment = client.get_experiment_by_name("grpo")
    assert experiment.artifact_location == (base / "mlartifacts").as_uri()
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # MLflow UI: training-runs view
    run = client.get_run(recorder.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run-a"
    assert run.data.tags["llmrl_run_id"] == "run-a" and run.data.tags["llmrl_config_hash"] == config_hash(CONFIG)
    assert run.data.params["model.dtype"] == "bfloat16" and run.data.params["lr"] == "5e-06"
    config_text = client.download_artifacts(run.info.run_id, "config.json", str(base))
    assert json.loads(Path(config_text).read_text()) == CONFIG


def test_code_version_is_the_git_commit(recorded):
    _, _, recorder = recorded
    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if git.returncode != 0:
        assert recorder.git_commit is None
        return
    run = MlflowClient(recorder.tracking_uri).get_run(recorder.mlflow_run_id)
    assert run.data.tags["mlflow.source.git.commit"] == git.stdout.strip() == recorder.git_commit


def test_metrics_params_and_models_are_found_by_policy_version(recorded):
    _, store, recorder = recorded
    client = MlflowClient(recorder.tracking_uri)
    history = {p.step: p.value for p in client.get_metric_history(recorder.mlflow_run_id, "reward_mean")}
    assert history == {1: 0.0, 2: 0.25, 3: 0.5}

    [model] = client.search_logged_models(
        [recorder.experiment_id], filter_string="tags.llmrl_run_id = 'run-a' AND tags.policy_version = '2'"
    )
    assert model.tags["parent_version"] == "1" and model.params["iteration"] == "1"
    assert model.name == "run-a-v2"  # named by run and version, not all "policy" (issue 71)
    manifest = CheckpointStore(Path(recorder.run_dir) / "checkpoints").manifest(2)
    assert model.tags["checkpoint_sha256"] == manifest.sha256
    assert model.tags["parent_model_id"] == recorder.find_model_id(1)
    assert json.loads(model.tags["trained_on"]) == ["trajectories/run-a/policy_version=1", "gsm8k-train"]

    version = client.get_model_version_by_alias("grpo-policy", "policy_v2")
    assert version.tags["policy_version"] == "2" and version.tags["llmrl_model_id"] == model.model_id
    assert version.source == model.artifact_location and version.run_id == recorder.mlflow_run_id

    inputs = client.get_run(recorder.mlflow_run_id).inputs.dataset_inputs
    by_version = {
        tag.value: item for item in inputs for tag in item.tags if tag.key == "policy_version"
    }  # input tag -> input
    assert sorted(by_version) == ["0", "1", "2"]
    digest, rows, _ = store.partition_digest("run-a", 1)
    assert by_version["1"].dataset.digest == digest[:36]
    assert json.loads(by_version["1"].dataset.source)["uri"] == store.partition_uri("run-a", 1)
    assert json.loads(by_version["1"].dataset.profile) == {"num_rows": rows}


def test_training_dataset_digest_is_the_file_sha256(recorded):
    _, _, recorder = recorded
    inputs = MlflowClient(recorder.tracking_uri).get_run(recorder.mlflow_run_id).inputs.dataset_inputs
    [prompts] = [i for i in inputs if i.dataset.name == "gsm8k-train"]
    path = next(GSM8K.glob("*train*"))
    assert prompts.dataset.digest == hashlib.sha256(path.read_bytes()).hexdigest()[:36]
    assert {t.key: t.value for t in prompts.tags}["mlflow.data.context"] == "training"


def test_version_lineage_answers_what_produced_a_version(recorded):
    base, store, recorder = recorded
    info = version_lineage("run-a", 3, run_dir=base / "run-a")
    assert info["policy_version"] == 3 and info["parent_version"] == 2
    assert info["config_hash"] == config_hash(CONFIG) and info["git_commit"] == recorder.git_commit
    assert info["checkpoint"]["sha256"] == CheckpointStore(base / "run-a" / "checkpoints").manifest(3).sha256
    assert [d["name"] for d in info["data"]] == ["trajectories/run-a/policy_version=2", "gsm8k-train"]
    assert info["data"][0]["digest"] == store.partition_digest("run-a", 2)[0]
    assert info["step_metrics"] == {"reward_mean": 0.5, "loss": pytest.approx(1 / 3)}
    assert info["model_id"] == recorder.find_model_id(3)
    with pytest.raises(LineageError, match=r"no lineage record for policy version 9 \(recorded: \[1, 2, 3\]\)"):
        version_lineage("run-a", 9, run_dir=base / "run-a")
    with pytest.raises(LineageError, match="no MLflow run for llmrl run 'run-z'"):
        version_lineage("run-z", 1, run_dir=base / "run-a")


def test_a_pruned_checkpoint_is_marked_in_the_lineage(tmp_path):
    """keep_checkpoints deleted versions 1 and 2: their logged models are tagged pruned (the MLflow UI and
    ``llmrl lineage`` say so instead of pointing at a deleted file as if it were there); version 3 stays kept."""
    from storage.lineage_query import format_lineage

    recorder = _simulate_run(tmp_path / "run-p", TrajectoryStore(tmp_path / "trajectories"))
    checkpoints = CheckpointStore(tmp_path / "run-p" / "checkpoints")
    for version in (1, 2):
        checkpoints.delete(version)
    assert recorder.mark_pruned(checkpoints.versions()) == [1, 2]
    assert recorder.mark_pruned(checkpoints.versions()) == []  # marked once
    recorder.end()
    states = {v: version_lineage("run-p", v, run_dir=tmp_path / "run-p")["checkpoint_state"] for v in (1, 2, 3)}
    assert states == {1: "pruned", 2: "pruned", 3: "kept"}
    model = recorder.client.get_logged_model(recorder.find_model_id(2))
    assert model.tags["checkpoint"] == "pruned" and model.tags["checkpoint_uri"].endswith("policy_v000002.safetensors")
    assert "(pruned: deleted by keep_checkpoints)" in format_lineage(
        version_lineage("run-p", 1, run_dir=tmp_path / "run-p")
    )
    assert "deleted by keep_checkpoints" not in format_lineage(version_lineage("run-p", 3, run_dir=tmp_path / "run-p"))


def test_reopening_a_run_resumes_it_and_rerecording_a_version_replaces_it(tmp_path):
    store = TrajectoryStore(tmp_path / "trajectories")
    first = _simulate_run(tmp_path / "run-a", store, versions=2)
    first.end("FAILED")  # a crash
    again = LineageRecorder(tmp_path / "run-a", pipeline="grpo", run_id="run-a", config=CONFIG)
    assert again.mlflow_run_id == first.mlflow_run_id
    again.log_version(2, parent_version=1, metrics={"reward_mean": 0.9})
    client = MlflowClient(again.tracking_uri)
    models = client.search_logged_models([again.experiment_id], filter_string="tags.policy_version = '2'")
    assert len(models) == 1 and models[0].tags["checkpoint_sha256"] == ""
    assert version_lineage("run-a", 2, run_dir=tmp_path / "run-a")["metrics"] == {"reward_mean": 0.9}
    with pytest.raises(LineageError, match="a changed config needs a new run id"):
        LineageRecorder(tmp_path / "run-a", pipeline="grpo", run_id="run-a", config={**CONFIG, "lr": 1e-5})
    # the hash an older llmrl recorded for the same settings (accepted_hashes) resumes; another one still refuses
    from storage.hashing import config_hash

    trimmed = {k: v for k, v in CONFIG.items() if k != "group"}  # e.g. a setting that left the hash since
    resumed = LineageRecorder(
        tmp_path / "run-a", pipeline="grpo", run_id="run-a", config=trimmed, accepted_hashes={config_hash(CONFIG)}
    )
    assert resumed.mlflow_run_id == first.mlflow_run_id
    assert client.get_run(first.mlflow_run_id).data.tags["llmrl_config_hash"] == config_hash(CONFIG)  # kept
    with pytest.raises(LineageError, match="a changed config needs a new run id"):
        LineageRecorder(
            tmp_path / "run-a",
            pipeline="grpo",
            run_id="run-a",
            config={**trimmed, "lr": 1e-5},
            accepted_hashes={config_hash({**CONFIG, "lr": 1e-6})},
        )


def test_a_new_run_replaces_the_record_of_an_earlier_attempt_with_other_settings(tmp_path):
    """A run with no published version (its first attempt failed early, or its folder was removed) may change its
    config: the earlier attempt's MLflow run is deleted (restorable) and a new one carries the new settings."""
    from storage.hashing import config_hash

    first = LineageRecorder(tmp_path / "run-a", pipeline="grpo", run_id="run-a", config=CONFIG)
    first.end("FAILED")
    same = LineageRecorder(tmp_path / "run-a", pipeline="grpo", run_id="run-a", config=CONFIG, new_run=True)
    assert same.mlflow_run_id == first.mlflow_run_id and same.replaced_run is None  # same settings: same record
    changed = {**CONFIG, "lr": 1e-5}
    fresh = LineageRecorder(tmp_path / "run-a", pipeline="grpo", run_id="run-a", config=changed, new_run=True)
    assert fresh.replaced_run == first.mlflow_run_id and fresh.mlflow_run_id != first.mlflow_run_id
    client = MlflowClient(fresh.tracking_uri)
    old = client.get_run(first.mlflow_run_id)
    assert old.info.lifecycle_stage == "deleted" and old.data.tags["llmrl_replaced_by_config"] == config_hash(changed)
    new = client.get_run(fresh.mlflow_run_id)
    assert new.data.tags["llmrl_config_hash"] == config_hash(changed) and new.data.params["lr"] == "1e-05"
    # the new record is the run's from now on: a resume finds it, and one with the first settings is refused
    assert LineageRecorder(tmp_path / "run-a", pipeline="grpo", run_id="run-a", config=changed).mlflow_run_id == (
        fresh.mlflow_run_id
    )
    with pytest.raises(LineageError, match="a changed config needs a new run id"):
        LineageRecorder(tmp_path / "run-a", pipeline="grpo", run_id="run-a", config=CONFIG)


def test_any_tracking_uri_from_config(tmp_path):
    elsewhere = tmp_path / "shared-tracking"
    elsewhere.mkdir()
    settings = LineageConfig(
        tracking_uri=f"sqlite:///{elsewhere / 'tracking.db'}", artifact_location=(elsewhere / "art").as_uri()
    )
    with LineageRecorder(
        tmp_path / "run-b", pipeline="sft", run_id="run-b", config={"lr": 1e-5}, lineage_config=settings
    ) as recorder:
        recorder.log_metrics(0, {"loss": 2.0})
        recorder.log_version(1, parent_version=0, metrics={"loss": 1.5})
    assert (elsewhere / "tracking.db").is_file() and not (tmp_path / "mlflow.db").exists()
    info = version_lineage("run-b", 1, tracking_uri=settings.tracking_uri)
    assert info["experiment"] == "sft" and info["parent_version"] == 0 and info["step_metrics"] == {"loss": 1.5}
    assert MlflowClient(settings.tracking_uri).get_run(recorder.mlflow_run_id).info.status == "FINISHED"


@pytest.fixture
def mlflow_server(tmp_path):
    """A real MLflow tracking server (sqlite backend, proxied artifacts) on a free local port."""
    import os
    import signal
    import sys
    import time
    import urllib.request

    from llmrl_core.ports import free_port

    port = free_port()
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    command = [str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}"]
    command += ["--artifacts-destination", str(tmp_path / "server-artifacts")]
    log = open(tmp_path / "server.log", "wb")
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no background job workers
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start: {(tmp_path / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its worker, started in their own session
        proc.wait(timeout=30)
        log.close()


@pytest.mark.engine
def test_lineage_against_an_mlflow_tracking_server(mlflow_server, tmp_path):
    store = TrajectoryStore(tmp_path / "trajectories")
    settings = LineageConfig(tracking_uri=mlflow_server, registered_model="grpo-policy")
    _simulate_run(tmp_path / "run-a", store, versions=2, lineage_config=settings).end()
    assert not (tmp_path / "mlflow.db").exists()
    info = version_lineage("run-a", 2, tracking_uri=mlflow_server)
    assert info["parent_version"] == 1 and info["data"][0]["name"] == "trajectories/run-a/policy_version=1"
    assert info["checkpoint"]["sha256"] == CheckpointStore(tmp_path / "run-a" / "checkpoints").manifest(2).sha256
    client = MlflowClient(mlflow_server)
    assert client.get_model_version_by_alias("grpo-policy", "policy_v2").tags["policy_version"] == "2"
    experiment = client.get_experiment_by_name("grpo").experiment_id
    [model] = client.search_logged_models([experiment], filter_string="tags.policy_version = '1'")
    assert model.tags["llmrl_run_id"] == "run-a"


def test_runs_under_one_root_share_the_store_and_old_per_run_stores_are_kept(tmp_path):
    """Two runs under one runs root land in one sqlite store (one MLflow UI shows both); a run recorded
    before the store was shared (its own run_dir/mlflow.db) keeps using that store."""
    store = TrajectoryStore(tmp_path / "trajectories")
    for name in ("run-x", "run-y"):
        _simulate_run(tmp_path / name, store).end()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    names = {r.info.run_name for r in client.search_runs([client.get_experiment_by_name("grpo").experiment_id])}
    assert names == {"run-x", "run-y"}
    legacy = tmp_path / "legacy" / "old-run"
    legacy.mkdir(parents=True)
    (legacy / "mlflow.db").touch()
    assert default_tracking_uri(legacy) == f"sqlite:///{legacy / 'mlflow.db'}"
    assert default_tracking_uri(tmp_path / "new-run") == f"sqlite:///{tmp_path / 'mlflow.db'}"
