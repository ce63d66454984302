"""``llmrl ui`` end to end, driven as a user would, through headless Chromium:

start ``llmrl ui`` (its own LLMRL_HOME, free ports), open the Prefect UI, find the GRPO deployment among
distinctly named ones, start a *custom* run with changed settings in the typed run form, see it complete
and show its artifacts; open the MLflow UI on the same run in the training-runs view; stop the UI with
Ctrl-C and find nothing left running. Screenshots of each step go to the test's folder (and to
``$LLMRL_SCREENSHOTS`` when set, which is how the README's screenshots were made).

Also, without a browser: ``llmrl run`` commands record into the UI's Prefect home, or into the running
UI's server (the one-home logic of :mod:`llmrl_cli.prefect_home`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import typing
import urllib.request
from pathlib import Path

import psutil
import pytest
from prefect_server import free_port, log_tail
from ui_driver import PageDriver

from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.tools.browser_cdp import ChromiumBrowser, find_chromium

ROOT = Path(__file__).resolve().parents[1]
LLMRL = str(Path(sys.executable).with_name("llmrl"))
RUN_ID = "grpo-from-the-ui"
CHANGED = {  # the custom run's settings (dotted), typed into the form (the deployment's are the 10-minute main job)
    "run_id": RUN_ID,
    "iterations": "1",
    "data.prompts_per_iteration": "2",
    "data.group_size": "2",
    "rollout.max_new_tokens": "8",
    "final_eval.questions": "0",
}


def _settings_count(cls: type) -> int:
    """How many settings (sections included) config dataclass ``cls`` has, nested."""
    hints = typing.get_type_hints(cls)
    return sum(
        1 + (_settings_count(hints[f.name]) if dataclasses.is_dataclass(hints[f.name]) else 0)
        for f in dataclasses.fields(cls)
    )


def _dotted(config: dict, key: str):
    for part in key.split("."):
        config = config[part]
    return config


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as reply:
        return json.loads(reply.read())


def _shot(page: PageDriver, folder: Path, name: str) -> None:
    page.screenshot(folder / f"{name}.png")
    if os.environ.get("LLMRL_SCREENSHOTS"):
        shutil.copy(folder / f"{name}.png", Path(os.environ["LLMRL_SCREENSHOTS"]) / f"{name}.png")


@pytest.mark.extended  # the long tier: pytest -m extended (README "Tests")
@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="needs Debian's chromium (scripts/install.sh installs it)")
def test_llmrl_ui_runs_a_custom_grpo_run_and_shows_it_in_both_uis(tmp_path):
    home, shots = tmp_path / "home", tmp_path / "screenshots"
    shots.mkdir()
    prefect_port, mlflow_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "LLMRL_RUNS_DIR"}
    env["LLMRL_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"  # ui.out shows what `llmrl ui` printed up to a hang
    out = tmp_path / "ui.out"
    with open(out, "wb") as sink:
        ui = subprocess.Popen(
            [LLMRL, "ui", "--prefect-port", str(prefect_port), "--mlflow-port", str(mlflow_port)],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # as a script's `llmrl ui &` starts it: Ctrl-C must stop it all the same
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    browser = None
    try:
        deadline = time.monotonic() + 420
        while "MLflow UI:" not in out.read_text():
            assert ui.poll() is None, f"llmrl ui exited {ui.returncode}:\n{out.read_text()}"
            assert time.monotonic() < deadline, f"llmrl ui not up after 420 s:\n{out.read_text()}"
            time.sleep(1)
        state = json.loads((home / "ui.json").read_text())
        prefect_url, mlflow_url = state["prefect_ui_url"], state["mlflow_url"]
        assert prefect_url == f"http://127.0.0.1:{prefect_port}" and mlflow_url == f"http://127.0.0.1:{mlflow_port}"
        assert prefect_url in out.read_text() and state["mlflow_runs_url"] in out.read_text()
        listening = {c.laddr for p in psutil.Process(ui.pid).children(recursive=True) for c in _listening(p)}
        assert {("127.0.0.1", prefect_port), ("127.0.0.1", mlflow_port)} <= {(a.ip, a.port) for a in listening}
        assert all(a.ip == "127.0.0.1" for a in listening if a.port in (prefect_port, mlflow_port))

        # `llmrl run` in another shell finds the running UI and reports to it
        probe = subprocess.run(
            [sys.executable, "-c", "from llmrl_cli.prefect_home import use_llmrl_prefect; print(use_llmrl_prefect())"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert probe.stdout.strip() == state["prefect_api_url"], probe.stderr

        browser = ChromiumBrowser()
        page = PageDriver(browser)
        page.goto(f"{prefect_url}/deployments")
        for name in ("answer-gsm8k", "grpo-arithmetic", "evaluate-run", "sft-gsm8k", "collect-rollouts"):
            page.wait_text(name, 90)
        _shot(page, shots, "prefect-deployments")
        page.click_text("grpo-arithmetic", "a")
        page.wait_text("Parameters", 60)
        page.click_text("Run")
        page.click_text("Custom run", "*")
        page.wait_text("final_eval", 60)
        every = _settings_count(GRPOConfig) + 3  # and config, settings, overrides
        page.wait_for(f"document.querySelectorAll('.schema-form-property').length >= {every}", 60, "the whole form")
        labels = page.eval(  # every setting, nested by section: (label, depth, has a description)
            "[...document.querySelectorAll('.schema-form-property')].map(p => ["
            "p.querySelector('.schema-form-property__label').innerText.split(' ')[0], "
            "p.parentElement.closest('.schema-form-property') ? 1 : 0, "
            "!!p.querySelector(':scope > .p-label__header > .p-label__description "
            ".schema-form-property__description')])"
        )
        nested = {label for label, depth, _ in labels if depth == 1}
        assert {"data", "rollout", "train", "final_eval", "group_size", "lr", "kl_coef", "max_new_tokens"} <= nested
        undescribed = [label for label, _, described in labels if not described]
        assert len(labels) == every and not undescribed, f"settings without a description: {undescribed}"
        for field, value in CHANGED.items():
            page.set_field(field.rpartition(".")[2], value)
        page.set_field("group_size", "2.5")  # not an integer: the form refuses to submit
        page.click_text("Submit")
        time.sleep(3)
        assert page.eval("location.pathname.endsWith('/run')"), "the form submitted group_size=2.5"
        assert page.eval("document.querySelector('[data-llmrl-field]:invalid') !== null")
        page.set_field("group_size", CHANGED["data.group_size"])
        _shot(page, shots, "prefect-custom-run")
        deployment = _post(f"{state['prefect_api_url']}/deployments/filter", {})
        grpo_dep = next(d for d in deployment if d["name"] == "grpo-arithmetic")
        _submit(page, state["prefect_api_url"], grpo_dep["id"])
        deadline = time.monotonic() + 180
        while not (
            runs := _post(
                f"{state['prefect_api_url']}/flow_runs/filter", {"deployments": {"id": {"any_": [grpo_dep["id"]]}}}
            )
        ):
            assert time.monotonic() < deadline, "no flow run was created by the form"
            time.sleep(1)
        flow_run = runs[0]
        typed = {k: (v if k == "run_id" else int(v)) for k, v in CHANGED.items()}
        settings = flow_run["parameters"]["settings"]
        assert {k: _dotted(settings, k) for k in CHANGED} == typed, "the run did not get the settings from the form"
        page.goto(f"{prefect_url}/runs/flow-run/{flow_run['id']}")
        page.wait_for(
            "!!document.querySelector("
            "'.state-badge.state--completed, .state-badge.state--failed, .state-badge.state--crashed')",
            900,
            "the flow run to finish",
        )
        worker_log = log_tail(home / "ui" / "worker.log")
        assert page.eval("!!document.querySelector('.state-badge.state--completed')"), f"run failed:\n{worker_log}"
        page.click_text("Artifacts", "*")
        page.wait_text(f"{RUN_ID}-metrics", 60)
        page.wait_text(f"{RUN_ID}-curves", 60)
        text = page.text()  # one live table of each per run, not one per iteration
        assert text.count(f"{RUN_ID}-metrics-all") == 1 and text.count(f"{RUN_ID}-metrics") == 2
        _shot(page, shots, "prefect-run-artifacts")
        assert (home / "runs" / RUN_ID / "checkpoints" / "policy_v000001.safetensors").is_file()
        config = json.loads((home / "runs" / RUN_ID / "config.json").read_text())
        defining = {k: v for k, v in typed.items() if k != "iterations"}  # config.json: what defines the versions
        assert {k: _dotted(config, k) for k in defining} == defining, "the run's config.json lacks the form's settings"
        assert config["train"]["lr"] == 1e-5 and config["data"]["source"].startswith("arithmetic:")  # the main job
        assert not (home / "runs" / RUN_ID / "checkpoints" / "policy_v000002.safetensors").exists()  # 1, not 10

        experiment = _get_json(f"{mlflow_url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=grpo")[
            "experiment"
        ]
        page.goto(f"{mlflow_url}/#/experiments/{experiment['experiment_id']}?workflowType=machine_learning")
        page.wait_text(RUN_ID, 120)
        _shot(page, shots, "mlflow-runs")
        href = page.eval(f"[...document.querySelectorAll('a')].find(a => a.innerText.trim() === '{RUN_ID}').href")
        page.goto(f"{href}?workflowType=machine_learning")
        page.wait_text("reward_mean", 120)
        page.wait_text("Finished", 60)
        _shot(page, shots, "mlflow-run")
    finally:
        if browser is not None:
            browser.close()
        family = _family(ui)
        ui.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            ui.wait(timeout=120)
        except subprocess.TimeoutExpired:
            stacks = _stacks(ui.pid)
            os.killpg(ui.pid, signal.SIGKILL)
            for member in family:  # the services live in sessions of their own
                with contextlib.suppress(psutil.NoSuchProcess):
                    member.kill()
            raise AssertionError(f"llmrl ui still running 120 s after Ctrl-C:\n{out.read_text()}\n{stacks}") from None
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"left running after Ctrl-C: {[p.pid for p in alive]}\n{out.read_text()}"
    assert ui.returncode == 0 and not (home / "ui.json").exists()


FORM_STATE = """JSON.stringify({
    path: location.pathname,
    invalid: [...document.querySelectorAll(':invalid')].filter(e => e.tagName !== 'FORM').map(
        e => (e.closest('.schema-form-property')?.querySelector('.schema-form-property__label')?.innerText
              || e.name || e.tagName) + '=' + e.value),
    submit: [...document.querySelectorAll('button')].filter(b => b.innerText.trim() === 'Submit').map(
        b => ({disabled: b.disabled, busy: b.getAttribute('aria-busy')})),
    errors: [...document.querySelectorAll('[class*=error], [class*=invalid], [role=alert], .p-toast')].map(
        e => e.innerText.trim()).filter(t => t).slice(0, 10)})"""


def _submit(page: PageDriver, api_url: str, deployment_id: str, tries: int = 3) -> None:
    """Click the run form's Submit until the page leaves the form (a click that lands while the long form
    re-renders is lost, as a user's would be: they click again). Never clicks again once the server has the flow
    run, so one click makes one run; fails with what the form shows (invalid fields, errors, the button)."""
    created = {"deployments": {"id": {"any_": [deployment_id]}}}
    seen = []
    for _ in range(tries):
        page.click_text("Submit")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if page.eval("!location.pathname.endsWith('/run')"):
                return
            if _post(f"{api_url}/flow_runs/filter", created):  # submitted: the page is only slow to move on
                page.wait_for("!location.pathname.endsWith('/run')", 180, "the page after the submitted form")
                return
            page.browser.pump(1.0)
        seen.append(page.eval(FORM_STATE))
    raise AssertionError(f"the run form was not submitted after {tries} clicks on Submit; the form showed: {seen}")


def _post(url: str, body: dict) -> list[dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def _listening(proc: psutil.Process) -> list:
    try:
        return [c for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def _stacks(pid: int) -> str:
    """The Python stacks of ``pid`` when py-spy is installed (to see where a process hangs), else ''."""
    if shutil.which("py-spy") is None:
        return ""
    return subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60).stdout


def _family(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_llmrl_run_records_into_the_one_prefect_home(tmp_path):
    """Without a running UI, commands use Prefect's ephemeral API over $LLMRL_HOME/prefect (what `llmrl ui`
    serves); a stale ui.json (nothing answering) is ignored; a PREFECT_API_URL the user set wins."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    home = tmp_path / "fresh" / "home"  # not there yet: the Prefect home is made, parents too
    env["LLMRL_HOME"] = str(home)
    script = (
        "import os; from llmrl_cli.prefect_home import use_llmrl_prefect; where = use_llmrl_prefect(); "
        "print(where); print(os.environ.get('PREFECT_HOME')); print(os.environ.get('PREFECT_API_URL'))"
    )
    for _ in ("no ui.json", "a stale ui.json"):
        lines = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
        where, prefect_home, api = lines.stdout.splitlines()
        assert prefect_home == str(home / "prefect") and Path(prefect_home).is_dir()
        assert api == "None" and where.startswith("ephemeral")
        (home / "ui.json").write_text(json.dumps({"prefect_api_url": f"http://127.0.0.1:{free_port()}/api"}))
    env["PREFECT_API_URL"] = "http://127.0.0.1:1/api"
    lines = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert lines.stdout.splitlines()[2] == "http://127.0.0.1:1/api"
