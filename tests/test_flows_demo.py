"""The gsm8k-demo flow and the deployments in prefect.yaml."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _deployments():
    return yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]


@pytest.mark.parametrize("deployment", _deployments(), ids=lambda d: d["name"])
def test_deployment_entrypoints_are_flows_with_those_parameters(deployment):
    from prefect import Flow

    module_path, name = deployment["entrypoint"].split(":")
    module = importlib.import_module(module_path.removesuffix(".py").replace("/", "."))
    flow = getattr(module, name)
    assert isinstance(flow, Flow)
    accepted = set(inspect.signature(flow.fn).parameters)
    assert set(deployment.get("parameters", {})) <= accepted


@pytest.mark.extended  # the long tier: pytest -m extended (README "Tests")
@pytest.mark.slow
def test_gsm8k_demo_flow_runs_for_real(default_model_path, tmp_path):
    code = (
        "import json; from flows.gsm8k_demo import gsm8k_demo; "
        f"print(json.dumps(gsm8k_demo(questions=2, max_tokens=16, out_dir={str(tmp_path)!r})))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["questions"] == 2 and summary["tokens"] > 0
    rows = [json.loads(line) for line in Path(summary["path"]).read_text().splitlines()]
    assert len(rows) == 2 and all(len(r["sampler_logprobs"]) == len(r["response_token_ids"]) for r in rows)
