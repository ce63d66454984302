"""Prefect artifacts of a training run: one live metrics table and one curves artifact per flow run, updated in
place each iteration (not a new copy per iteration), with the latest data; a new flow run gets its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.runtime import flow_run

from tasks.reporting import BackgroundReports, artifact_key, report_iteration


@flow(name="report-twice")
def report_twice(report_dir: str) -> str:
    spread = {"reward_p10": 0.0, "reward_p50": 0.5, "reward_p90": 1.0, "engine_reload_s": 0.5}
    history = [{"version": 1, "reward_mean": 0.25, "accuracy": 0.5, **spread}]
    report_iteration("Run_A", history, Path(report_dir))
    history.append({"version": 2, "reward_mean": 0.75, "accuracy": float("nan"), **spread})
    report_iteration("Run_A", history, Path(report_dir))
    return str(flow_run.get_id())


def _artifacts_of(run_id: str) -> list:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )
    return sorted(found, key=lambda a: a.key)


@pytest.mark.engine
def test_one_live_table_and_curve_per_flow_run(tmp_path):
    first = report_twice(str(tmp_path))
    artifacts = _artifacts_of(first)
    # one of each, not one per iteration: the main columns, every metric, the curves
    assert [a.key for a in artifacts] == ["run-a-curves", "run-a-metrics", "run-a-metrics-all"]
    table = json.loads(artifacts[1].data)
    assert [row["version"] for row in table] == [1, 2] and table[1]["accuracy"] is None  # latest data, NaN sanitised
    assert list(table[0]) == ["version", "reward_mean", "reward_p10", "reward_p90", "accuracy"]  # the lead columns
    assert "engine_reload_s" in json.loads(artifacts[2].data)[0]  # the rest: in metrics-all
    assert "data:image/png;base64," in artifacts[0].data
    second = report_twice(str(tmp_path))  # a resumed run is a new flow run: its own artifacts
    assert second != first and len(_artifacts_of(second)) == 3 and len(_artifacts_of(first)) == 3


def test_artifact_keys_are_valid_prefect_keys():
    assert artifact_key("Run_A", "metrics") == "run-a-metrics"
    assert artifact_key("evaluate-grpo.demo v2") == "evaluate-grpo-demo-v2"
    assert len(artifact_key("x" * 300)) == 100 and artifact_key("__") == "llmrl"


@flow(name="report-in-background")
def report_in_background(report_dir: str, fail_at: int | None = None) -> tuple[str, list[str]]:
    """Three versions' reports, each submitted while the "next iteration" (here: reading the previous PNG) runs."""
    seen = []
    history: list[dict] = []
    with BackgroundReports() as reports:
        for version in (1, 2, 3):
            history = [*history, {"version": version, "reward_mean": version / 4}]
            reports.submit("Run_B", history, Path(report_dir))
            if fail_at == version:
                raise RuntimeError(f"iteration {version} failed")
            seen.append(reports.wait() or "")
    return str(flow_run.get_id()), seen


@pytest.mark.engine
def test_background_reports_give_the_same_artifacts_in_order(tmp_path):
    run, pngs = report_in_background(str(tmp_path))
    assert pngs == [str(tmp_path / "curves.png")] * 3
    artifacts = _artifacts_of(run)
    assert [a.key for a in artifacts] == ["run-b-curves", "run-b-metrics", "run-b-metrics-all"]
    assert [row["version"] for row in json.loads(artifacts[1].data)] == [1, 2, 3]  # the last report landed last


def test_a_failing_iteration_keeps_its_own_error_and_waits_for_the_report(tmp_path):
    with pytest.raises(RuntimeError, match="iteration 2 failed"):
        report_in_background(str(tmp_path), fail_at=2)
    assert (tmp_path / "curves.png").is_file()  # the report submitted before the failure was written


def test_a_failed_report_is_raised_when_waited_for(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the report folder should be")
    with pytest.raises(Exception, match="not-a-folder"):
        report_in_background(str(blocker))
