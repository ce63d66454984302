"""A training flow run is created with the name it keeps (``<run_id> v<first>-<last>``), so the console's first
line ("Beginning flow run ...") names the run as both UIs do (issue 71: it printed Prefect's random name)."""

from __future__ import annotations

import json
import logging

import pytest
from prefect import flow
from prefect.runtime import flow_run

from llmrl_core.pipeline.grpo_config import GRPOConfig
from tasks.run_identity import collect_run_name, named_at_creation


@flow(name="named-like-grpo", flow_run_name=named_at_creation(GRPOConfig, lambda cfg: cfg.iterations))
def named_like_grpo(config: str | None = None, settings: dict | None = None, overrides: list[str] | None = None) -> str:
    return str(flow_run.name)


@pytest.fixture
def beginning_lines(caplog):
    """The engine's "Beginning flow run ..." lines, as the console prints them."""
    caplog.set_level(logging.INFO, logger="prefect")
    return lambda: [r.getMessage() for r in caplog.records if r.getMessage().startswith("Beginning flow run")]


def test_a_new_run_and_a_resume_are_named_from_the_start(tmp_path, beginning_lines):
    runs = tmp_path / "runs"
    overrides = ["run_id=nm", f"runs_dir={runs}", "iterations=3"]
    assert named_like_grpo(overrides=overrides) == "nm v0-3"
    # a run whose folder committed version 2 resumes there
    state = runs / "nm" / "state"
    state.mkdir(parents=True)
    for version in (0, 1, 2):
        (state / f"published-v{version}.json").write_text(json.dumps({"version": version, "metrics": {}}))
    assert named_like_grpo(overrides=[*overrides[:2], "iterations=5"]) == "nm v2-5"
    assert beginning_lines() == [
        "Beginning flow run 'nm v0-3' for flow 'named-like-grpo'",
        "Beginning flow run 'nm v2-5' for flow 'named-like-grpo'",
    ]


def test_a_config_that_does_not_load_still_names_the_run(tmp_path, beginning_lines):
    """The flow refuses a bad config in its own words; its name says the config was refused (no random name)."""
    name = named_like_grpo(overrides=["iterations=banana", f"runs_dir={tmp_path}"])
    assert name == "named-like-grpo (config refused)"


@flow(name="named-like-collect", flow_run_name=collect_run_name)
def named_like_collect(
    config: str | None = None,
    settings: dict | None = None,
    overrides: list[str] | None = None,
    policy_version: int = 0,
    batches: int = 1,
    out_run_id: str | None = None,
) -> str:
    return str(flow_run.name)


def test_a_collect_run_is_named_after_the_run_its_rows_go_to_and_the_version_that_samples():
    assert named_like_collect(overrides=["run_id=src"], policy_version=2) == "src-collect collect v2"
    assert named_like_collect(overrides=["run_id=src"], out_run_id="mine") == "mine collect v0"
    assert named_like_collect(overrides=["iterations=banana"]) == "collect (config refused)"
