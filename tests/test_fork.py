"""Forks (N7) before anything starts: ``init.from`` is RUN@V or RUN; the source run, its published version and
that version's checkpoint must exist, and a run cannot fork itself; ``llmrl lineage RUN --tree``."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from llmrl_cli.main import app
from llmrl_core.pipeline.config_io import ConfigError, load_config, to_dict
from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.pipeline.init_config import InitConfig
from llmrl_core.pipeline.sft_config import SFTConfig
from storage.checkpoints import CheckpointStore
from storage.layout import RunLayout
from tasks.fork import check_fork, fork_tree, resolve_fork


def _source(runs, run_id="src", published=(0, 1, 2), kept=(1, 2)):
    """A run folder with commit markers for ``published`` and checkpoints for ``kept``."""
    layout = RunLayout.for_runs_dir(run_id, str(runs))
    state = layout.run_dir / "state"
    state.mkdir(parents=True)
    for v in published:
        (state / f"published-v{v}.json").write_text(json.dumps({"version": v, "primer_state": {"drawn": 10 * v}}))
    store = CheckpointStore(layout.checkpoints_uri)
    for v in kept:
        store.seal(store.write_weights({"w": torch.full((2,), float(v))}, v))
    return layout


def test_init_from_is_written_from_and_read_back():
    cfg = load_config(GRPOConfig, None, ["init.from=gsm8k-001@4", "init.data_cursor=true"])
    assert cfg.init.source() == ("gsm8k-001", 4) and cfg.init.data_cursor
    assert to_dict(cfg)["init"] == {"from": "gsm8k-001@4", "data_cursor": True}
    assert InitConfig(from_="gsm8k-001").source() == ("gsm8k-001", None) and InitConfig().source() is None
    assert load_config(SFTConfig, None, ["init.from=a@0"]).init.source() == ("a", 0)
    for bad in ("x@y", "@3", "a b@1", "a@-1"):
        with pytest.raises(ConfigError, match=r"init.from must be RUN@VERSION \(e.g. gsm8k-001@4\)"):
            load_config(GRPOConfig, None, [f"init.from='{bad}'"])
    with pytest.raises(ConfigError, match="override 'init.from=@3': the value is not valid YAML"):
        load_config(GRPOConfig, None, ["init.from=@3"])


def test_a_fork_point_is_checked_before_anything_starts(tmp_path):
    _source(tmp_path)
    fork = resolve_fork("new", str(tmp_path), InitConfig(from_="src@1"))
    assert (fork.source_run, fork.version, fork.label, fork.primer_state) == ("src", 1, "src@1", {"drawn": 10})
    assert resolve_fork("new", str(tmp_path), InitConfig(from_="src")).version == 2  # its last published one
    assert resolve_fork("new", str(tmp_path), InitConfig()) is None
    cases = [
        ("nowhere@1", "init.from: run 'nowhere' has no published version under"),
        ("src@5", r"init.from: run 'src' has not published version 5 \(published: \[0, 1, 2\]\)"),
        ("src@0", r"the checkpoint of src@0 was not kept \(keep_checkpoints / keep_every\); kept versions: \[1, 2\]"),
        ("new@1", "a run cannot fork itself"),
    ]
    for point, message in cases:
        with pytest.raises(ValueError, match=message):
            resolve_fork("new", str(tmp_path), InitConfig(from_=point))


def test_a_run_with_versions_resumes_instead_of_forking_again(tmp_path):
    _source(tmp_path)
    cfg = load_config(GRPOConfig, None, [f"runs_dir={tmp_path}", "run_id=new", "init.from=src@1"])
    assert check_fork(cfg).label == "src@1"
    _source(tmp_path, "new", published=(0,), kept=(0,))
    assert check_fork(cfg) is None
    broken = load_config(GRPOConfig, None, [f"runs_dir={tmp_path}", "run_id=other", "init.from=src@0"])
    with pytest.raises(ValueError, match="was not kept"):
        check_fork(broken)


def test_the_cli_refuses_a_bad_fork_point_before_starting(tmp_path):
    result = CliRunner().invoke(app, ["run", "grpo", "--set", f"runs_dir={tmp_path}", "--set", "init.from=src@1"])
    assert result.exit_code == 2
    assert "error: init.from: run 'src' has no published version under" in result.output
    assert "temporary server" not in result.output


def test_the_fork_tree_follows_each_runs_init_from(tmp_path):
    for run, point in [("a", None), ("b", "a@1"), ("c", "b@2"), ("d", "a@3"), ("e", "z@1")]:
        (tmp_path / run).mkdir()
        init = {"from_": point, "data_cursor": False} if point else None
        (tmp_path / run / "config.json").write_text(json.dumps({"run_id": run, **({"init": init} if init else {})}))
    assert fork_tree(tmp_path, "a") == [(1, "b", "a@1"), (2, "c", "b@2"), (1, "d", "a@3")]
    shown = CliRunner().invoke(app, ["lineage", "a", "--tree", "--runs-dir", str(tmp_path)])
    assert shown.exit_code == 0
    assert shown.output.splitlines() == ["a", "└── b  (from a@1)", "    └── c  (from b@2)", "└── d  (from a@3)"]
    missing = CliRunner().invoke(app, ["lineage", "nope", "--tree", "--runs-dir", str(tmp_path)])
    assert missing.exit_code == 1 and "no run 'nope'" in missing.output
