"""The GRPO flow end to end on the packaged model: 2 iterations, a crash after a stage, and a resume."""

from __future__ import annotations

import json

import pytest
import torch

from llmrl_core.pipeline.config_io import ConfigError, load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig


def test_config_loads_yaml_and_overrides(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text("run_id: exp1\ntrain:\n  lr: 1.0e-5\ndata:\n  group_size: 8\n")
    cfg = load_config(GRPOConfig, path, ["train.lr=1e-6", "rollout.workers=2", "dask.address=null"])
    assert (cfg.run_id, cfg.train.lr, cfg.data.group_size, cfg.rollout.workers) == ("exp1", 1e-6, 8, 2)
    with pytest.raises(ConfigError, match=r"unknown config key 'train.lrr'"):
        load_config(GRPOConfig, path, ["train.lrr=1"])
    path.write_text("data:\n  group_size: many\n")
    with pytest.raises(ConfigError, match=r"grpo.yaml: data.group_size: expected int"):
        load_config(GRPOConfig, path)
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        load_config(GRPOConfig, None, ["train.lr"])


def _tiny(tmp_path, *extra):
    return [
        "run_id=t1",
        f"runs_dir={tmp_path / 'runs'}",
        "iterations=2",
        "data.prompts_per_iteration=2",
        "data.group_size=2",
        "rollout.max_new_tokens=24",
        "rollout.dtype=float32",
        "rollout.temperature=1.0",
        "train.entropy_coeff=0.01",
        "train.lr=1e-5",
        "keep_checkpoints=5",
        *extra,
    ]


@pytest.mark.slow
def test_two_iterations_crash_and_resume(tmp_path, default_model_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from flows.grpo import InjectedFailure, grpo
    from storage.lineage_query import version_lineage
    from storage.trajectories import TrajectoryStore
    from tasks.records import record_to_sample

    # 1) crash after the train stage of iteration 1: version 1 is published, version 2 is not
    with pytest.raises(InjectedFailure):
        grpo(overrides=_tiny(tmp_path, "fail_after_stage=train@1"))
    runs = tmp_path / "runs"
    state = runs / "t1" / "state"
    assert sorted(p.name for p in state.glob("published-v*.json")) == ["published-v0.json", "published-v1.json"]
    store = TrajectoryStore(runs / "trajectories")
    v0_before = {s.name: s for s in store.shards("t1", version=0)}
    v0_bytes = {name: open(s.path, "rb").read() for name, s in v0_before.items()}

    # 2) resume with the same run id: only the unpublished iteration runs again
    summary = grpo(overrides=_tiny(tmp_path))
    assert summary["published_version"] == 2
    assert store.versions("t1") == [0, 1]
    assert {name: open(s.path, "rb").read() for name, s in v0_before.items()} == v0_bytes  # nothing repeated
    for version in (0, 1):
        records = store.read_records("t1", version=version)
        assert len(records) == 4  # 2 prompts x 2 samples, not duplicated by the retry
        assert all(r.advantage is not None and r.policy_version == version for r in records)
        assert len({r.group_id for r in records}) == 2
    # the two iterations drew different prompts (the data cursor moved on and was restored on resume)
    prompts = [{r.prompt_id for r in store.read_records("t1", version=v)} for v in (0, 1)]
    assert not prompts[0] & prompts[1]
    assert json.loads((state / "published-v2.json").read_text())["version"] == 2
    # optimizer states older than the previous version are pruned (each is 2x the model)
    assert sorted(p.name for p in state.glob("trainer-v*.pt")) == ["trainer-v1.pt", "trainer-v2.pt"]

    # checkpoints: version 1 differs from version 0
    ckpt = runs / "t1" / "checkpoints"
    w0, w1 = load_file(ckpt / "policy_v000000.safetensors"), load_file(ckpt / "policy_v000001.safetensors")
    assert any(not torch.equal(w0[k], w1[k]) for k in w0)

    # the engine held exactly checkpoint 1 when it sampled version 1's rollouts:
    # its sampler log-probs (fp32 engine) equal checkpoint 1's teacher-forced log-probs
    model = AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32).eval()
    model.load_state_dict(w1, strict=False)
    model.tie_weights()
    for record in store.read_records("t1", version=1):
        sample = record_to_sample(record)
        ids = torch.tensor([list(sample.prompt_ids) + list(sample.response_ids)])
        with torch.no_grad():
            logits = model(ids).logits[0, len(sample.prompt_ids) - 1 : -1]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(sample.response_ids)[:, None]).squeeze(-1)
        assert (expected - torch.tensor(record.sampler_logprobs)).abs().max().item() < 1e-3

    # MLflow lineage for every published version, with its data and parent
    for version in (1, 2):
        info = version_lineage("t1", version, run_dir=runs / "t1")
        assert info["policy_version"] == version and info["parent_version"] == version - 1
        assert any(d["policy_version"] == version - 1 for d in info["data"])
