"""The ``llmrl`` command line: help on every command, version, models, doctor, demo."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from llmrl_cli.main import app

runner = CliRunner()


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["version"],
        ["models"],
        ["models", "prepare"],
        ["models", "verify"],
        ["models", "path"],
        ["doctor"],
        ["demo"],
    ],
)
def test_every_command_has_help(args):
    result = runner.invoke(app, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_version_matches_package():
    from llmrl_core import __version__

    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"llmrl {__version__}"


def test_models_prepare_and_verify_on_prepared_default(default_model_path):
    result = runner.invoke(app, ["models", "prepare"])
    assert result.exit_code == 0, result.output
    assert "already prepared" in result.output and default_model_path in result.output
    result = runner.invoke(app, ["models", "verify"])
    assert result.exit_code == 0 and "ok:" in result.output


def test_models_verify_reports_unprepared_home(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMRL_HOME", str(tmp_path))
    result = runner.invoke(app, ["models", "verify"])
    assert result.exit_code == 1
    assert "not prepared yet" in result.output


def test_doctor_reports_versions_without_engine(default_model_path):
    result = runner.invoke(app, ["doctor", "--skip-engine"])
    assert result.exit_code == 0, result.output
    for label in ("torch", "vllm", "prefect", "mlflow", "dask", "cpu", "gpu", "model"):
        assert any(line.startswith(label) for line in result.output.splitlines()), label
    assert "MISSING" not in result.output
    assert "prepared" in result.output


@pytest.mark.slow
def test_doctor_starts_a_vllm_engine(default_model_path):
    """Runs in a subprocess: a second in-process engine in the test process would double memory."""
    proc = subprocess.run(
        [sys.executable, "-m", "llmrl_cli.main", "doctor"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "vllm engine   ok" in proc.stdout


@pytest.mark.slow
def test_demo_answers_gsm8k_with_logprobs(default_model_path, tmp_path):
    out = tmp_path / "responses.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "llmrl_cli.main", "demo", "-n", "3", "--max-tokens", "24", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        assert row["gold"] and row["response"]
        assert len(row["sampler_logprobs"]) == len(row["response_token_ids"]) > 0
        assert all(lp <= 0 for lp in row["sampler_logprobs"])


def test_run_grpo_show_config_applies_overrides():
    result = runner.invoke(app, ["run", "grpo", "--show-config", "--set", "train.lr=1e-6", "--set", "run_id=x1"])
    assert result.exit_code == 0, result.output
    assert "run_id: x1" in result.output and "lr: 1.0e-06" in result.output


def test_run_grpo_rejects_unknown_settings():
    result = runner.invoke(app, ["run", "grpo", "--set", "train.nope=1"])
    assert result.exit_code == 2
    assert "unknown config key 'train.nope'" in result.output


@pytest.mark.parametrize(
    ("flow", "setting", "message"),
    [
        ("grpo", "rollout.tensor_parallel_size=2", "rollout.tensor_parallel_size=2 needs 2 CUDA GPUs per engine"),
        ("grpo", "rollout.weight_sync=cuda_ipc", "rollout.weight_sync=cuda_ipc needs the trainer and every engine"),
        ("grpo", "rollout.weight_sync=nccl", "rollout.weight_sync=nccl needs the trainer and every engine on CUDA"),
        ("collect", "rollout.sleep_level=1", "rollout.sleep_level=1 lets a CUDA engine give its GPU memory"),
    ],
)
def test_a_placement_that_cannot_work_here_is_one_line_before_anything_starts(tmp_path, monkeypatch, flow, setting,
                                                                              message):  # fmt: skip
    """GPUs, weight route and memory plan of the local cluster: checked by the CLI (exit 2, one line), not met as
    the flow's traceback after its Prefect API and cluster started."""
    import runtime.memory_check

    monkeypatch.setattr(runtime.memory_check, "visible_gpus", lambda: [])  # a CPU host, whatever this machine has
    result = runner.invoke(app, ["run", flow, "--set", f"runs_dir={tmp_path}", "--set", setting])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1].startswith(f"error: {message}")
    assert "Traceback" not in result.output and not (tmp_path / "arithmetic-quickstart").exists()


def test_run_evaluate_refuses_missing_versions_and_sources_before_starting(tmp_path):
    """A version the run does not have and a source that does not open: one line, exit 2, no Prefect API, no
    engine (the CLI checks them before the flow)."""
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "config.json").write_text("{}")
    base = ["run", "evaluate", "r1", "--runs-dir", str(tmp_path), "-n", "2"]
    missing = runner.invoke(app, [*base, "--versions", "0,99"])
    assert missing.exit_code == 2 and "has no checkpoint for version(s) [99]" in missing.output
    garbage = runner.invoke(app, [*base, "--versions", "0", "--source", str(tmp_path / "garbage.jsonl")])
    assert garbage.exit_code == 2 and "--source: source" in garbage.output and "no such file" in garbage.output
    assert "temporary server" not in missing.output + garbage.output


def test_run_collect_refuses_a_missing_version_before_starting(tmp_path):
    """``collect --version 99`` of a run without that checkpoint: one line naming the run and what it has, exit 2,
    before the Prefect API or any engine starts; a negative version likewise."""
    base = ["run", "collect", "--set", f"runs_dir={tmp_path}", "--set", "run_id=r1"]
    missing = runner.invoke(app, [*base, "--version", "99"])
    assert missing.exit_code == 2, missing.output
    assert "run 'r1' has no checkpoint 99: it has no saved version (only 0, the base model)" in missing.output
    negative = runner.invoke(app, [*base, "--version", "-1"])
    assert negative.exit_code == 2 and "--version must be 0 (the base model)" in negative.output
    assert "temporary server" not in missing.output + negative.output
    assert not (tmp_path / "r1-collect").exists()


def test_llmrl_plan_is_a_command():
    result = runner.invoke(app, ["plan", "--help"])
    assert result.exit_code == 0 and "optimizer state" in result.output and "KV cache" in result.output
