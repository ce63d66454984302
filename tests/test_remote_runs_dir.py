"""A runs folder on another filesystem (``runs_dir: s3://...``): where each thing of a run goes, and the trainer's
checkpoints and optimizer state round-tripping through a local S3 (moto on 127.0.0.1)."""

from __future__ import annotations

import pytest
import torch

from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.pipeline.preflight import PreflightError, check_runs_dir
from llmrl_core.uris import S3_REQUEST_TIMEOUT_S, split_s3_timeouts
from storage.filesystems import (
    is_remote_uri,
    join_uri,
    read_bytes,
    resolve_filesystem,
    split_uri,
    write_bytes_atomic,
)
from storage.layout import RunLayout

URI = "s3://bucket/runs?endpoint_override=127.0.0.1:9000&scheme=http"


def test_join_and_split_keep_uri_options_at_the_end():
    assert (
        join_uri(URI, "r1", "checkpoints")
        == "s3://bucket/runs/r1/checkpoints?endpoint_override=127.0.0.1:9000&scheme=http"
    )
    assert join_uri("/data/runs/", "r1", "/staging/") == "/data/runs/r1/staging"
    assert join_uri("/data/with?mark", "x") == "/data/with?mark/x"  # a '?' in a local path is part of the name
    folder, name = split_uri(join_uri(URI, "r1", "policy_v000002.safetensors"))
    assert (folder, name) == (join_uri(URI, "r1"), "policy_v000002.safetensors")
    assert is_remote_uri(URI) and is_remote_uri("memory://x")
    assert not any(is_remote_uri(x) for x in ("/a/b", "file:///a/b", "rel/dir", None))


def test_a_remote_runs_dir_puts_the_workers_data_there_and_the_flow_hosts_records_at_home(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMRL_RUNS_DIR", str(tmp_path / "home-runs"))
    layout = RunLayout.for_runs_dir("r1", URI)
    query = "?endpoint_override=127.0.0.1:9000&scheme=http"
    assert layout.checkpoints_uri == f"s3://bucket/runs/r1/checkpoints{query}"
    assert layout.staging_uri == f"s3://bucket/runs/r1/staging{query}"
    assert layout.trainer_state_uri == f"s3://bucket/runs/r1/state{query}"
    assert layout.trajectories_uri == f"s3://bucket/runs/trajectories{query}"
    assert layout.run_dir == tmp_path / "home-runs" / "r1"  # config.json, commit markers, reports, MLflow
    assert layout.markers_uri == f"s3://bucket/runs/r1/state{query}"  # a copy of each commit marker

    local = RunLayout.for_runs_dir("r1", str(tmp_path / "runs"))
    assert local.data_uri is None and local.run_dir == tmp_path / "runs" / "r1"
    assert local.checkpoints_uri == str(tmp_path / "runs" / "r1" / "checkpoints")
    assert local.staging_uri == str(tmp_path / "runs" / "r1" / "staging")
    assert local.trainer_state_uri == str(tmp_path / "runs" / "r1" / "state")
    assert local.trajectories_uri == str(tmp_path / "runs" / "trajectories")
    assert local.markers_uri is None  # one host: the markers stay in the run folder only
    assert RunLayout.for_runs_dir("r1", f"file://{tmp_path}/runs").run_dir == local.run_dir
    assert RunLayout.for_runs_dir("r1", None).run_dir == tmp_path / "home-runs" / "r1"


def test_commit_markers_go_to_the_data_store_too_and_another_flow_host_fetches_them(tmp_path):
    """Host A commits versions 0 and 1; host B (an empty runs folder) fetches both markers and resumes after 1;
    what B commits next reaches A the same way. Without a markers URI (a local run) nothing is fetched."""
    from tasks.commits import commit_version, fetch_markers, latest_published

    markers = f"memory://markers-{tmp_path.name}/runs/r1/state"
    host_a, host_b = tmp_path / "a" / "r1", tmp_path / "b" / "r1"
    commit_version.fn(host_a, 0, None, {}, markers)
    commit_version.fn(host_a, 1, {"cursor": 8}, {"reward_mean": 0.5}, markers)
    assert latest_published(host_b) is None
    assert fetch_markers(host_b, markers) == [0, 1]
    assert latest_published(host_b) == (
        1,
        {"version": 1, "primer_state": {"cursor": 8}, "metrics": {"reward_mean": 0.5}},
    )
    assert fetch_markers(host_b, markers) == []  # nothing new since
    commit_version.fn(host_b, 2, {"cursor": 16}, {}, markers)
    assert fetch_markers(host_a, markers) == [2] and latest_published(host_a)[0] == 2
    assert fetch_markers(tmp_path / "c" / "r1", None) == [] and latest_published(tmp_path / "c" / "r1") is None


def test_preflight_names_a_remote_runs_dir_that_a_flow_cannot_use():
    check_runs_dir(URI)
    check_runs_dir("/any/local/folder")
    with pytest.raises(PreflightError, match=r"runs_dir='nosuchscheme://x/y': cannot open this filesystem URI"):
        check_runs_dir("nosuchscheme://x/y")
    check_runs_dir(f"{URI}&request_timeout=600&connect_timeout=5")
    with pytest.raises(PreflightError, match=r"request_timeout='soon' must be a positive number of seconds"):
        check_runs_dir(f"{URI}&request_timeout=soon")


def test_s3_uris_wait_for_slow_answers_unless_they_say_otherwise():
    """The AWS SDK's 3 s request timeout is raised for every S3 URI; the URI's own timeouts win."""
    fs, path = resolve_filesystem(URI)
    options = fs.__reduce__()[1][0]
    assert path == "bucket/runs" and options["endpoint_override"] == "127.0.0.1:9000"
    assert options["request_timeout"] == S3_REQUEST_TIMEOUT_S and options["connect_timeout"] == -1
    fs, _ = resolve_filesystem(f"{URI}&request_timeout=7.5&connect_timeout=2")
    options = fs.__reduce__()[1][0]
    assert (options["request_timeout"], options["connect_timeout"], options["scheme"]) == (7.5, 2.0, "http")
    with pytest.raises(ValueError, match="connect_timeout='0'"):
        resolve_filesystem(f"{URI}&connect_timeout=0")
    assert split_s3_timeouts("memory://x?request_timeout=1") == ("memory://x?request_timeout=1", {})


def test_an_atomic_write_survives_a_server_side_copy_slower_than_the_sdk_default(s3_server, monkeypatch):
    """The rename of an atomic write is a CopyObject that answers only when done (moto, MinIO): one that takes 4 s
    failed with the SDK's 3 s timeout (seen in CI on a trainer state); the file lands and no temporary is left."""
    import time

    from moto.s3.models import S3Backend

    copy = S3Backend.copy_object

    def slow_copy(self, *args, **kwargs):
        time.sleep(4.0)
        return copy(self, *args, **kwargs)

    monkeypatch.setattr(S3Backend, "copy_object", slow_copy)
    fs, root = resolve_filesystem(s3_server.uri("slow"))
    write_bytes_atomic(fs, f"{root}/state.pt", b"x" * 1000)
    assert read_bytes(fs, f"{root}/state.pt") == b"x" * 1000
    assert s3_server.keys("slow") == ["slow/state.pt"]


@pytest.mark.slow
def test_the_trainer_publishes_restores_and_prunes_through_s3(s3_server, default_model_path, tmp_path, monkeypatch):
    """TrainerWorker on a remote runs folder: weights, manifests and optimizer/RNG state all land in the bucket
    (nothing on the local disk), a fresh trainer restores the optimizer state from there, old states are pruned."""
    from runtime.trainer_actor import TrainerWorker

    monkeypatch.setenv("LLMRL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LLMRL_RUNS_DIR", raising=False)
    runs = s3_server.uri("runs")
    cfg = load_config(
        GRPOConfig,
        None,
        ["run_id=r1", f"runs_dir={runs}", f"model={default_model_path}", "train.mixed_precision=no", "progress=false"],
    )
    layout = RunLayout.for_runs_dir(cfg.run_id, cfg.runs_dir)
    trainer = TrainerWorker(cfg, layout=layout)
    first = trainer.trainer.optimizer.param_groups[0]["params"][0]
    for version in range(3):  # an optimizer step between publishes, so each state differs
        first.grad = torch.full_like(first, 0.01 * (version + 1))
        trainer.trainer.optimizer.step()
        trainer.trainer.optimizer.zero_grad()
        info = trainer.publish(version, {"k": 1})
        assert info["checkpoint"] == join_uri(layout.checkpoints_uri, f"policy_v{version:06d}.safetensors")
    keys = s3_server.keys("runs/r1/")
    assert [k for k in keys if "/state/" in k] == ["runs/r1/state/trainer-v1.pt", "runs/r1/state/trainer-v2.pt"]
    assert "runs/r1/checkpoints/policy_v000002.manifest.json" in keys
    assert not (tmp_path / "home" / "runs" / "r1").exists()  # nothing of the trainer's on the local disk

    again = TrainerWorker(cfg, layout=layout)
    again.restore(2)
    saved = trainer.trainer.optimizer.state_dict()["state"][0]["exp_avg"]
    restored = again.trainer.optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(saved, restored) and again.trainer.step_count == trainer.trainer.step_count
    name = next(iter(dict(trainer.model.named_parameters())))
    assert torch.equal(dict(again.model.named_parameters())[name], dict(trainer.model.named_parameters())[name])


@pytest.mark.extended  # the long tier: pytest -m extended (README "Tests")
@pytest.mark.slow
def test_sft_on_a_remote_runs_dir_keeps_its_data_in_the_bucket_and_resumes_from_another_host(
    s3_server, tmp_path, monkeypatch
):
    """The SFT flow with ``runs_dir: s3://...``: the tokenized training set, checkpoints and optimizer states go to
    the bucket (the trainer reads the set from there), the flow host keeps only its records; a second flow host
    (another runs root, nothing of the first one's disk) resumes the run for epoch 2."""
    from flows.sft import sft
    from storage.checkpoints import CheckpointStore

    runs = s3_server.uri("runs")
    settings = ["run_id=rs", f"runs_dir={runs}", "data.limit=4", "data.max_length=192", "train.batch_size=4"]
    settings += ["train.lr=5e-5", "train.mixed_precision=no"]
    monkeypatch.setenv("LLMRL_RUNS_DIR", str(tmp_path / "host-a"))
    summary = sft(overrides=[*settings, "epochs=1"])
    assert summary["published_version"] == 1
    assert summary["samples"] == join_uri(runs, "rs", "sft-data", "samples.parquet")
    assert summary["checkpoints"] == join_uri(runs, "rs", "checkpoints")
    keys = s3_server.keys("runs/rs/")
    assert "runs/rs/sft-data/samples.parquet" in keys
    assert {"runs/rs/state/published-v0.json", "runs/rs/state/published-v1.json", "runs/rs/state/trainer-v1.pt"} <= set(
        keys
    )
    assert CheckpointStore(join_uri(runs, "rs", "checkpoints")).versions() == [0, 1]
    local = [p for p in (tmp_path / "host-a").rglob("*") if p.suffix in (".safetensors", ".parquet", ".pt")]
    assert not local, local  # the flow host kept its records only (markers, config, MLflow)

    monkeypatch.setenv("LLMRL_RUNS_DIR", str(tmp_path / "host-b"))
    summary = sft(overrides=[*settings, "epochs=2"])
    assert summary["published_version"] == 2
    loss = summary["data_loss"]  # version 0 and 1 from the markers fetched from the bucket, 2 trained here
    assert sorted(loss) == [0, 1, 2] and loss[2] < loss[1] < loss[0], loss
    assert CheckpointStore(join_uri(runs, "rs", "checkpoints")).versions() == [0, 1, 2]
    assert not [p for p in (tmp_path / "host-b").rglob("*") if p.suffix in (".safetensors", ".parquet", ".pt")]
