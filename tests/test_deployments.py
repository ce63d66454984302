"""prefect.yaml end to end: a local Prefect server, ``prefect deploy --all``, a process worker, and
``prefect deployment run`` with parameter overrides, on the real flows and the packaged model.

The table ``SMOKE_RUNS`` says which deployments the round trip runs, with what overrides, and how
their outputs are checked; ``NOT_RUN`` lists those that are only deployed, with the reason. Every
deployment in prefect.yaml must be in exactly one of them, so a new deployment cannot go untested
by accident. Deploying (every deployment) is fast and runs always; running flows is ``slow``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect_server import PrefectServer, log_tail, prefect_server, process_worker

ROOT = Path(__file__).resolve().parents[1]
POOL = "llmrl-local"
EXAMPLE_CRON = ("0 3 * * *", "UTC")
SCHEDULER_LOOP_S = 2  # the test server's scheduler loops this often, so schedule effects show within seconds


def _check_gsm8k_demo(out: Path) -> None:
    rows = [json.loads(line) for line in (out / "responses.jsonl").read_text().splitlines()]
    assert len(rows) == 2  # questions=2 overrides the deployment's 8
    for row in rows:
        assert 0 < len(row["response_token_ids"]) <= 16  # max_tokens=16 overrides the deployment's 192
        assert len(row["sampler_logprobs"]) == len(row["response_token_ids"])
        assert all(lp <= 0.0 for lp in row["sampler_logprobs"])


@dataclass(frozen=True)
class SmokeRun:
    """One ``prefect deployment run``: ``--param`` overrides ("{out}" in a value becomes a fresh output
    folder), a check of what the run wrote there, and a bound on how long the run may take."""

    params: dict[str, Any]
    check: Callable[[Path], None]
    timeout_s: int = 600
    expected_state: str = "COMPLETED"


SMOKE_RUNS: dict[str, SmokeRun] = {
    "gsm8k-demo/answer-gsm8k": SmokeRun(
        params={"questions": 2, "max_tokens": 16, "out_dir": "{out}"},
        check=_check_gsm8k_demo,
    ),
}
NOT_RUN: dict[str, str] = {  # 'flow/deployment' -> why the round trip only deploys it
    "grpo/grpo-arithmetic": "a GRPO run takes minutes; tests/test_grpo_flow.py runs the flow itself end to end",
    "evaluate/evaluate-run": "needs a stored run; tests/test_evaluate_flow.py runs the flow itself end to end",
    "sft/sft-gsm8k": "training takes minutes; tests/test_sft_flow.py runs the flow itself end to end",
    "offline/offline-rescore": "needs a stored run; tests/test_offline_flow.py runs the flow itself end to end",
    "collect/collect-rollouts": "starts an engine for minutes; tests/test_collect_flow.py runs the flow end to end",
}


def _prefect_yaml() -> dict:
    return yaml.safe_load((ROOT / "prefect.yaml").read_text())


def test_prefect_yaml_shape():
    """Every deployment uses the process pool, schedules are off, and code is found from any clone."""
    config = _prefect_yaml()
    assert config["deployments"], "prefect.yaml has no deployments"
    names = [dep.get("name") for dep in config["deployments"]]
    assert len(set(names)) == len(names), f"deployment names must be distinct (the UI lists them by name): {names}"
    for dep in config["deployments"]:
        where = f"prefect.yaml deployment {dep.get('name')!r} ({dep.get('entrypoint')})"
        assert dep.get("entrypoint") and dep.get("name"), where
        assert dep["work_pool"]["name"] == POOL, where
        for schedule in dep.get("schedules") or []:
            assert schedule.get("active") is False, f"{where}: example schedules must be inactive"
    # The pull step must not depend on the worker's environment (a `{{ $VAR }}` is resolved there, and an
    # unset one silently leaves flow runs in a temporary folder): it takes the path recorded at deploy time.
    (pull,) = config["pull"]
    directory = pull["prefect.deployments.steps.set_working_directory"]["directory"]
    assert "$" not in directory
    step_id = re.fullmatch(r"\{\{ *([\w-]+)\.stdout *\}\}", directory).group(1)
    assert any(step["prefect.deployments.steps.run_shell_script"].get("id") == step_id for step in config["build"])


@pytest.fixture(scope="module")
def deployed(tmp_path_factory) -> PrefectServer:
    """A fresh local server with the process pool and every deployment of prefect.yaml deployed."""
    base = tmp_path_factory.mktemp("prefect-deploy")
    loop = str(SCHEDULER_LOOP_S)
    scheduler = {
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": loop,
        "PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS": loop,
    }
    t0 = time.monotonic()
    with prefect_server(base, **scheduler) as server:
        t1 = time.monotonic()
        server.cli("work-pool", "create", POOL, "--type", "process", cwd=base)
        t2 = time.monotonic()
        server.cli("deploy", "--all", cwd=ROOT)  # from the repository root, as a user does
        server.deployed_at = time.monotonic()
        print(f"server up {t1 - t0:.1f} s, pool {t2 - t1:.1f} s, deploy --all {server.deployed_at - t2:.1f} s")
        yield server


def _registered(server: PrefectServer) -> dict[str, dict]:
    """prefect.yaml entries by 'flow/deployment', matched to the server's records by name and entrypoint."""
    found = {name: server.deployment(name) for name in server.deployment_names()}
    by_key = {(r["name"], r["entrypoint"]): (name, r) for name, r in found.items()}
    out = {}
    for dep in _prefect_yaml()["deployments"]:
        key = (dep["name"], dep["entrypoint"])
        assert key in by_key, f"prefect.yaml deployment {key} is not registered; server has {sorted(found)}"
        name, record = by_key[key]
        out[name] = {"yaml": dep, "record": record}
    return out


def test_deploy_registers_every_deployment(deployed):
    registered = _registered(deployed)
    assert len(registered) == len(_prefect_yaml()["deployments"])
    assert not set(SMOKE_RUNS) & set(NOT_RUN)
    untested = set(registered) - set(SMOKE_RUNS) - set(NOT_RUN)
    assert not untested, f"add a SmokeRun (or a NOT_RUN reason) in tests/test_deployments.py for {sorted(untested)}"
    for name, both in registered.items():
        dep, record = both["yaml"], both["record"]
        assert record["work_pool_name"] == POOL, name
        assert record["parameters"] == dep.get("parameters", {}), name
        (pull,) = record["pull_steps"]
        directory = pull["prefect.deployments.steps.set_working_directory"]["directory"]
        assert Path(directory).resolve() == ROOT, f"{name}: flow runs would start in {directory}, not {ROOT}"
        wanted = [(s["cron"], s["timezone"], s["active"]) for s in dep.get("schedules") or []]
        got = [(s["schedule"]["cron"], s["schedule"]["timezone"], s["active"]) for s in record["schedules"]]
        assert got == wanted, name


def _wait_for(condition: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(poll_s)
    return value


def test_example_schedule_is_off_and_fires_when_switched_on(deployed):
    name = "gsm8k-demo/answer-gsm8k"
    record = deployed.deployment(name)
    (schedule,) = record["schedules"]
    assert (schedule["schedule"]["cron"], schedule["schedule"]["timezone"]) == EXAMPLE_CRON
    # Inactive: three scheduler loops after deploying, it has created no run.
    time.sleep(max(0.0, deployed.deployed_at + 3 * SCHEDULER_LOOP_S - time.monotonic()))
    assert deployed.flow_runs(record["id"]) == []
    # Switched on, the scheduler fills in upcoming 03:00 UTC runs; switched off again, they are removed.
    path = f"/deployments/{record['id']}/schedules/{schedule['id']}"
    deployed.request("PATCH", path, {"active": True})
    switched_on = time.monotonic()
    try:
        runs = _wait_for(lambda: deployed.flow_runs(record["id"]), 90, "runs from the switched-on schedule")
        print(f"switched-on schedule: {len(runs)} runs after {time.monotonic() - switched_on:.1f} s")
    finally:
        deployed.request("PATCH", path, {"active": False})
        time.sleep(2 * SCHEDULER_LOOP_S)  # let a scheduler loop that began before the switch-off finish
        for run in deployed.flow_runs(record["id"]):
            if run["state"]["type"] == "SCHEDULED":
                deployed.request("DELETE", f"/flow_runs/{run['id']}")
    for run in runs:
        assert run["auto_scheduled"] and run["state"]["type"] == "SCHEDULED"
        assert run["expected_start_time"][11:19] == "03:00:00", run["expected_start_time"]  # UTC ISO time
        assert run["parameters"] == record["parameters"]
    assert deployed.flow_runs(record["id"]) == []


def _param_args(params: dict[str, Any], out: Path) -> list[str]:
    args = []
    for key, value in params.items():
        value = value.replace("{out}", str(out)) if isinstance(value, str) else value
        args += ["--param", f"{key}={json.dumps(value)}"]
    return args


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMOKE_RUNS))
def test_deployment_run_completes(deployed, name, tmp_path):
    """The round trip: a worker picks up `prefect deployment run NAME --param ...` and the run completes."""
    spec = SMOKE_RUNS[name]
    out = tmp_path / "out"
    args = _param_args(spec.params, out)
    with process_worker(deployed, POOL, cwd=tmp_path, PREFECT_WORKER_QUERY_SECONDS="2") as worker_log:
        started = time.monotonic()
        proc = deployed.cli(
            "deployment", "run", name, *args, "--watch", "--watch-interval", "3", "--watch-timeout",
            str(spec.timeout_s), cwd=tmp_path, timeout=spec.timeout_s + 60, check=False,
        )  # fmt: skip
        elapsed = time.monotonic() - started
        context = f"\n--- deployment run ---\n{proc.stdout[-3000:]}\n--- worker ---\n{log_tail(worker_log, 6000)}"
        run_id = re.search(r"UUID: ([0-9a-f-]{36})", proc.stdout)
        assert run_id, context
        run = deployed.request("GET", f"/flow_runs/{run_id.group(1)}")
    print(f"{name}: run {run['state']['type']} in {elapsed:.1f} s (submit to terminal state)")
    assert run["state"]["type"] == spec.expected_state, context
    assert proc.returncode == 0, context
    deployment = deployed.deployment(name)
    assert run["deployment_id"] == deployment["id"]
    overridden = {k: json.loads(a.split("=", 1)[1]) for k, a in zip(spec.params, args[1::2], strict=True)}
    assert run["parameters"] == {**deployment["parameters"], **overridden}
    spec.check(out)
    # The inactive example schedule created nothing in all that time: the only run is ours.
    assert [r["id"] for r in deployed.flow_runs(deployment["id"])] == [run["id"]]


def test_deployment_parameters_are_parameters_of_their_flows():
    """A parameter in prefect.yaml that the flow does not take fails only when a run starts: catch it here."""
    import importlib
    import inspect

    for dep in _prefect_yaml()["deployments"]:
        path, name = dep["entrypoint"].split(":")
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)
        unknown = set(dep.get("parameters") or {}) - set(inspect.signature(flow.fn).parameters)
        assert not unknown, f"prefect.yaml deployment {dep['name']!r}: {flow.name} takes no {sorted(unknown)}"


def test_deployment_settings_are_valid_configs_and_the_grpo_form_holds_the_main_job():
    """Each deployment's ``settings`` is a valid config of its flow (checked as a run would, before the run), and
    the GRPO deployment's form shows exactly the main job (llmrl_cli/main_job.yaml) under its own run id."""
    import importlib
    import inspect
    import typing

    from llmrl_core.pipeline.config_io import ConfigError, load_config, read_yaml

    with_settings = 0
    for dep in _prefect_yaml()["deployments"]:
        settings = (dep.get("parameters") or {}).get("settings")
        if settings is None:
            continue
        path, name = dep["entrypoint"].split(":")
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)
        config_cls = next(
            t
            for t in typing.get_args(typing.get_type_hints(flow.fn)["settings"])
            if inspect.isclass(t) and t is not type(None)
        )
        params = dep["parameters"]
        cfg = load_config(config_cls, params.get("config"), params.get("overrides") or [], settings)
        assert cfg.run_id == settings["run_id"], dep["name"]
        with pytest.raises(ConfigError, match=r"unknown config key 'no_such_setting'"):
            load_config(config_cls, None, [], {**settings, "no_such_setting": 1})
        with_settings += 1
    assert with_settings >= 4
    grpo = next(d for d in _prefect_yaml()["deployments"] if d["name"] == "grpo-arithmetic")["parameters"]
    main_job = read_yaml((ROOT / "llmrl_cli" / "main_job.yaml").read_text())
    assert grpo["config"] is None
    assert {**grpo["settings"], "run_id": main_job["run_id"]} == main_job
