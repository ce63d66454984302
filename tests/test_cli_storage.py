"""``llmrl trajectories show|list`` and ``llmrl lineage`` on a store and MLflow records built here."""

from __future__ import annotations

import json

import pytest
import torch
from storage_records import make_records
from typer.testing import CliRunner

from llmrl_cli.main import app
from storage.checkpoints import CheckpointStore
from storage.layout import RunLayout
from storage.lineage import LineageRecorder
from storage.trajectories import TrajectoryStore

runner = CliRunner()


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    """A runs root with run 'gsm8k-1': trajectories for versions 0-3, checkpoints and lineage for 1-3."""
    root = tmp_path_factory.mktemp("runs")
    layout = RunLayout("gsm8k-1", runs_root=root)
    store = TrajectoryStore(layout.trajectories_uri)
    checkpoints = CheckpointStore(layout.checkpoints_dir)
    config = {"lr": 5e-6, "group_size": 4}
    with LineageRecorder(layout.run_dir, pipeline="grpo", run_id="gsm8k-1", config=config) as recorder:
        checkpoints.save({"w": torch.zeros(2)}, 0)
        for version in range(4):
            rows = make_records("gsm8k-1", version, n_prompts=3, group_size=4)
            store.write_shard("gsm8k-1", version, 0, rows[:6])
            store.write_shard("gsm8k-1", version, 1, rows[6:])
            if version == 3:
                break
            partition = recorder.log_trajectory_partition(store, version)
            manifest = checkpoints.save({"w": torch.full((2,), version + 1.0)}, version + 1, parent_version=version)
            recorder.log_version(
                version + 1,
                checkpoint=manifest,
                checkpoint_uri=str(checkpoints.weights_path(version + 1)),
                data=[partition],
                metrics={"reward_mean": 0.1 * version},
            )
    return root


@pytest.mark.parametrize("args", [["trajectories"], ["trajectories", "show"], ["trajectories", "list"], ["lineage"]])
def test_new_commands_have_help(args):
    result = runner.invoke(app, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_trajectories_show_top_k(runs_dir):
    result = runner.invoke(
        app, ["trajectories", "show", "gsm8k-1", "--version", "3", "--top", "5", "--runs-dir", str(runs_dir)]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "run gsm8k-1  policy_version 3  (2 shard(s), 12 rows)"
    assert "top 5 by reward:" in result.output
    assert sum(line.lstrip().startswith("#") for line in lines) == 5
    assert "<answer>" in result.output and "finish: stop 9, length 3" in result.output


def test_trajectories_show_json_matches_an_independent_ranking(runs_dir):
    args = ["trajectories", "show", "gsm8k-1", "-v", "2", "--top", "4", "--json", "--runs-dir", str(runs_dir)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    rows = make_records("gsm8k-1", 2, n_prompts=3, group_size=4)
    ranked = sorted(rows, key=lambda r: (-r.reward, r.prompt_id, r.sample_index))[:4]
    assert [(s["prompt_id"], s["sample_index"]) for s in data["top"]] == [(r.prompt_id, r.sample_index) for r in ranked]
    assert data["summary"]["rows"] == 12
    assert data["summary"]["reward_mean"] == pytest.approx(sum(r.reward for r in rows) / 12)
    assert data["top"][0]["response"] == ranked[0].messages[-1]["content"]


def test_trajectories_show_defaults_to_latest_and_lists(runs_dir):
    result = runner.invoke(app, ["trajectories", "show", "gsm8k-1", "--top", "1", "--runs-dir", str(runs_dir)])
    assert result.exit_code == 0 and "policy_version 3" in result.output.splitlines()[0]
    result = runner.invoke(app, ["trajectories", "list", "--runs-dir", str(runs_dir)])
    assert result.exit_code == 0, result.output
    assert "policy_version    3: 2 shard(s), 12 rows" in result.output


def test_trajectories_show_reports_unknown_run_and_version(runs_dir):
    result = runner.invoke(app, ["trajectories", "show", "nope", "--runs-dir", str(runs_dir)])
    assert result.exit_code == 1 and "no trajectories for run 'nope'" in result.output
    result = runner.invoke(app, ["trajectories", "show", "gsm8k-1", "-v", "9", "--runs-dir", str(runs_dir)])
    assert result.exit_code == 1 and "has no policy version 9 (versions: [0, 1, 2, 3])" in result.output


def test_lineage_names_data_config_code_and_parent(runs_dir):
    result = runner.invoke(app, ["lineage", "gsm8k-1", "--version", "3", "--runs-dir", str(runs_dir)])
    assert result.exit_code == 0, result.output
    manifest = CheckpointStore(runs_dir / "gsm8k-1" / "checkpoints").manifest(3)
    digest = TrajectoryStore(runs_dir / "trajectories").partition_digest("gsm8k-1", 2)[0]
    assert "run gsm8k-1  policy version 3" in result.output
    assert "parent        version 2" in result.output
    assert manifest.sha256 in result.output
    assert "trajectories/gsm8k-1/policy_version=2 (sampled by version 2)  rows=12" in result.output
    assert digest[:16] in result.output and "config hash" in result.output and "code          git" in result.output
    as_json = json.loads(runner.invoke(app, ["lineage", "gsm8k-1", "--json", "--runs-dir", str(runs_dir)]).output)
    assert as_json["policy_version"] == 3 and as_json["checkpoint"]["sha256"] == manifest.sha256


def test_lineage_reports_missing_store_and_version(runs_dir, tmp_path):
    result = runner.invoke(app, ["lineage", "gsm8k-1", "-v", "7", "--runs-dir", str(runs_dir)])
    assert result.exit_code == 1 and "no lineage record for policy version 7 (recorded: [1, 2, 3])" in result.output
    result = runner.invoke(app, ["lineage", "gsm8k-1", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 1 and "no lineage store for run 'gsm8k-1'" in result.output


def test_trajectories_show_prints_tool_turns_readably(runs_dir):
    result = runner.invoke(
        app, ["trajectories", "show", "gsm8k-1", "--version", "3", "--top", "12", "--runs-dir", str(runs_dir)]
    )
    assert result.exit_code == 0, result.output
    tool_rows = [
        r
        for r in TrajectoryStore(RunLayout("gsm8k-1", runs_root=runs_dir).trajectories_uri).read_records(
            "gsm8k-1", version=3
        )
        if r.num_tool_calls
    ]
    assert tool_rows
    assert result.output.count("tool call(s), 0 failed; conversation after the prompt:") == len(tool_rows)
    assert "[assistant] <tool>python</tool>" in result.output
    assert "[tool] " in result.output
