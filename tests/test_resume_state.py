"""A resume whose optimizer/RNG state is missing is an error naming the file, before any worker starts, unless
``train.resume_without_state=true``; that setting never changes the run's config hash (a resume may set it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.pipeline.sft_config import SFTConfig
from storage.hashing import config_hash
from storage.layout import RunLayout
from tasks.commits import check_resume_state
from tasks.epoch_stages import lineage_config as epoch_lineage_config
from tasks.grpo_stages import lineage_config


def test_a_missing_trainer_state_stops_the_resume_unless_allowed(tmp_path):
    layout = RunLayout.for_runs_dir("r", str(tmp_path))
    with pytest.raises(RuntimeError) as caught:
        check_resume_state(layout, 3, without_state=False)
    assert "resuming at version 3: its optimizer/RNG state" in str(caught.value)
    assert "trainer-v3.pt is missing" in str(caught.value) and "train.resume_without_state=true" in str(caught.value)
    assert check_resume_state(layout, 3, without_state=True) is False
    state = tmp_path / "r" / "state"
    state.mkdir(parents=True, exist_ok=True)
    (state / "trainer-v3.pt").write_bytes(b"saved")
    assert check_resume_state(layout, 3, without_state=False) is True


def test_the_resume_setting_and_defaults_added_later_leave_the_config_hash_alone():
    base = config_hash(lineage_config(load_config(GRPOConfig)))
    allowed = load_config(GRPOConfig, None, ["train.resume_without_state=true"])
    assert config_hash(lineage_config(allowed)) == base
    recorded = lineage_config(load_config(GRPOConfig))
    assert "init" not in recorded and "reward_errors" not in recorded["env"]  # as runs recorded before they existed
    forked = lineage_config(load_config(GRPOConfig, None, ["init.from=a@1"]))
    assert forked["init"] == {"from_": "a@1"}  # the fork point is part of what the run is; defaults stay out
    # a run recorded before rollout.backend, dask.restarts and train.agreement_stop existed still resumes
    golden = Path(__file__).parent / "goldens" / "grpo_default_config_as_recorded_by_741be58.json"
    as_then = lineage_config(load_config(GRPOConfig), keep_where=True)  # where-only settings were in the hash then
    assert json.loads(json.dumps(as_then, default=str)) == json.loads(golden.read_text())
    assert config_hash(json.loads(golden.read_text())) == config_hash(as_then)  # the hash the flows accept
    assert config_hash(recorded) != config_hash(as_then) and "runs_dir" not in recorded
    behaviour = ["dask.restarts=0", "train.agreement_stop=true"]
    assert config_hash(lineage_config(load_config(GRPOConfig, None, behaviour))) == base
    # where the run's files, records and console go: the same run (moved, joined to a cluster, without bars)
    where = ["runs_dir=/elsewhere", "tracking_uri=sqlite:////elsewhere/m.db", "progress=false"]
    where += ["dask.address=tcp://127.0.0.1:8786", "dask.local_directory=/scratch"]
    assert config_hash(lineage_config(load_config(GRPOConfig, None, where))) == base
    sft_where = [w for w in where if not w.startswith("progress=")]  # SFT has no progress bars setting
    assert config_hash(epoch_lineage_config(load_config(SFTConfig, None, sft_where))) == config_hash(
        epoch_lineage_config(load_config(SFTConfig))
    )
    assert config_hash(lineage_config(load_config(GRPOConfig, None, ["rollout.backend=transformers"]))) != base
    sft = load_config(SFTConfig)
    assert config_hash(epoch_lineage_config(sft)) == config_hash(
        epoch_lineage_config(load_config(SFTConfig, None, ["train.resume_without_state=true"]))
    )
