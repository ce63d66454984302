"""The main job (`llmrl run grpo` with no --config): the shipped config loads, and a shortened run ends with the
held-out evaluation line (run in a subprocess: its evaluation engine must not share this process's vLLM state)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from cli_runs import run_llmrl

ROOT = Path(__file__).resolve().parents[1]


def test_the_main_job_config_is_the_arithmetic_task_with_a_final_evaluation():
    from llmrl_cli.run import MAIN_JOB
    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig

    cfg = load_config(GRPOConfig, MAIN_JOB)
    assert cfg.data.source.startswith("arithmetic:train") and cfg.task.eval_source.startswith("arithmetic:test")
    assert cfg.final_eval.questions == 100 and cfg.task.format_reward == 0.0
    assert load_config(GRPOConfig, ROOT / "recipes" / "gsm8k-demo.yaml").data.source == "gsm8k:train"


@pytest.mark.slow
def test_a_short_main_job_prints_the_held_out_accuracy(tmp_path):
    overrides = [
        f"runs_dir={tmp_path / 'runs'}",
        "iterations=1",
        "progress=false",
        "data.prompts_per_iteration=2",
        "data.group_size=2",
        "rollout.dtype=float32",
        "final_eval.questions=6",
    ]
    env = {k: v for k, v in os.environ.items() if k != "LLMRL_VERBOSE"}  # the user's default: a quiet console
    proc = run_llmrl("run", "grpo", settings=overrides, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the console: llmrl's lines, not the libraries' (those are in the run folder's logs/)
    console = (proc.stderr + proc.stdout).splitlines()
    first_version = next(i for i, line in enumerate(console) if "version 0 (base model) published" in line)
    assert first_version < 40, "\n".join(console[:first_version])
    assert not [line for line in console if "Failed to load weights" in line or "were not loaded" in line]
    assert not [line for line in console if re.search(r"INFO\W+distributed\.|distributed\.\w+ - INFO", line)]
    assert not [line for line in console if "Dask Worker process" in line or "Task run" in line]
    logs = tmp_path / "runs" / "arithmetic-quickstart" / "logs"
    assert "distributed.scheduler" in (logs / "libraries.log").read_text()
    engine_log = (logs / "rollout-0.log").read_text()  # vLLM's engine log, in the worker's file
    assert "Loading weights took" in engine_log  # vLLM's own line at start-up
    assert "Reloading weights" in engine_log  # each version's reload (the in-place one logs in vLLM's namespace)
    assert (logs / "trainer.log").is_file()
    line = re.search(r"held-out accuracy (\d\.\d\d) -> (\d\.\d\d) \(([+-]\d\.\d\d) ± (\d\.\d\d)", proc.stdout)
    assert line, proc.stdout
    base, last, delta = (float(line.group(i)) for i in (1, 2, 3))
    assert delta == pytest.approx(last - base, abs=0.011)
    assert "6 problems of arithmetic:test" in proc.stdout
    report = re.search(r"evaluation:\s+(\S+)", proc.stdout).group(1)
    text = Path(report).read_text()
    assert "| 0 | greedy" in text and "| 1 | greedy" in text
    assert Path(re.search(r"curves:\s+(\S+)", proc.stdout).group(1)).is_file()
