"""Shared test set-up: quiet, offline, sandboxed state dirs, and session-wide model fixtures.

Expensive things are built once per session: the prepared default model (in the user's
``$LLMRL_HOME``, which ``scripts/install.sh`` fills), an fp32 transformers copy of it for
reference scoring, and one fp32 vLLM engine (exact log-probs; vLLM runs in-process).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

_STATE = tempfile.mkdtemp(prefix="llmrl-tests-")
atexit.register(shutil.rmtree, _STATE, ignore_errors=True)
for key, value in {
    "PREFECT_HOME": os.path.join(_STATE, "prefect"),
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    # The ephemeral Prefect API can take longer than its 20 s default to start on a loaded 2-core machine.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    # Flows run in this process keep the libraries' loggers as they are (tests read them with caplog); the quiet
    # console (runtime/console.py) is tested through the CLI in a process of its own (tests/test_main_job.py).
    "LLMRL_VERBOSE": "1",
}.items():
    os.environ.setdefault(key, value)


# The default run (scripts/test.sh, CI's) runs the quick tests on two pytest-xdist workers (README). The tests
# marked ``xdist_group("dev-shm")`` run one after another on one worker: some kill a trainer, whose /dev/shm
# handoff folder stays until a later trainer sweeps it, and one asserts that its own run left nothing there to sweep.


def _pin_xdist_worker() -> None:
    """Give each pytest-xdist worker its own share of the cores (``gw0``: cores 0, N, 2N, ...; with 2 workers on 2
    cores, one core each), before torch is imported: its flows then size their CPU threads from that share
    (``runtime.placement_plan.available_cores``), and the processes they start inherit it. Two flows whose threads
    each fill every core slow down several-fold (runtime/placement_plan.py); on a core each they do not meet."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= count:
        os.sched_setaffinity(0, cores[int(worker[2:]) % count :: count])


_pin_xdist_worker()


# Fixtures that start an engine or a server: a test using one (directly or through another fixture) is marked
# ``engine``, which the contributor tier (``scripts/test.sh --fast``) leaves out.
ENGINE_FIXTURES = {"vllm_engine_fp32", "endpoint", "trainer_worker", "deployed", "fresh_home", "eager_vllm", "flow_run"}


@pytest.hookimpl(tryfirst=True)
def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark ``engine`` the tests that use an :data:`ENGINE_FIXTURES` fixture (before ``-m`` selects)."""
    if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.engine)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--dist loadgroup`` on a worker: each test marked ``xdist_group`` gets the ``@<group>`` suffix the scheduler
    groups by. pytest-xdist 3.8 sets it on ``Item._nodeid``, which pytest 9.2 no longer reads (its node ids live in
    ``Item._id``): without this, the group's tests ran at once on both workers."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        marks = item.iter_markers("xdist_group")
        groups = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks}
        suffix = "@" + "_".join(sorted(groups))
        if groups and not item.nodeid.endswith(suffix):
            if hasattr(item, "_id"):
                item._id = type(item._id).parse(item.nodeid + suffix)
            else:
                item._nodeid = item.nodeid + suffix


ISOLATED = "LLMRL_TEST_ISOLATED"  # set in the child process of an ``isolated`` test


def _temporary_prefect_apis() -> list:
    """The temporary Prefect API servers that flow runs in this process started (none before Prefect is imported)."""
    import sys

    server_module = sys.modules.get("prefect.server.api.server")
    return [] if server_module is None else list(server_module.SubprocessASGIServer._instances.values())


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run a test marked ``isolated`` in a fresh pytest process and report its outcome here.

    End-to-end flows with a held-out evaluation build vLLM engines in the test process; an engine's memory is not
    given back when it is dropped, and a whole CI session in one process ran out of memory (24 GiB) with them.
    """
    if pyfuncitem.get_closest_marker("isolated") is None or os.environ.get(ISOLATED) == "1":
        return None
    import subprocess
    import sys

    root = str(pyfuncitem.config.rootpath)
    from cli_runs import cli_env

    env = cli_env(**{ISOLATED: "1"})  # the child records into this process's Prefect API instead of starting its own
    nodeid = pyfuncitem.nodeid
    if nodeid.rfind("@") > nodeid.rfind("]"):  # pytest-xdist's --dist loadgroup appends "@<xdist_group>"
        nodeid = nodeid.rsplit("@", 1)[0]
    proc = subprocess.run(
        # -m "": the test was selected here; the child must not deselect it again (addopts leave "extended" out)
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-m", "", nodeid],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"isolated run of {nodeid} failed (rc {proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}",
            pytrace=False,
        )
    if " passed" not in proc.stdout.splitlines()[-1]:
        pytest.fail(f"isolated run of {nodeid} did not pass: {proc.stdout[-2000:]}", pytrace=False)
    return True


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Send the flow runs' queued log lines, then stop the temporary Prefect API that flows run in this process
    started, while the output it logs to still exists (Prefect's own exit hook ran after pytest closed it: a
    "--- Logging error ---" traceback ended the run)."""
    import sys

    handlers = sys.modules.get("prefect.logging.handlers")
    if handlers is not None:  # the runs' last log lines go to the API first ("Error logging to API" after it stopped)
        handlers.APILogWorker.drain_all(timeout=10)
    for server in _temporary_prefect_apis():
        server.stop()


@pytest.fixture(scope="session")
def default_model_path() -> str:
    """The prepared packaged SmolLM2-135M-Instruct folder (prepared on first use)."""
    from llmrl_core.model_store import ensure_default_model

    return str(ensure_default_model())


@pytest.fixture(scope="session")
def hf_model_fp32(default_model_path):
    """(model, tokenizer): the packaged model in fp32 with transformers, eval mode."""
    from llmrl_core.modules.backends.transformers.scoring import load_causal_lm

    return load_causal_lm(default_model_path, dtype="float32")


@pytest.fixture(scope="session")
def vllm_engine_fp32(default_model_path):
    """One in-process fp32 vLLM engine on the packaged model, shared by the whole session.

    Tests that push weights into it must restore the original weights before they end.
    """
    from llmrl_core.modules.backends.types import EngineConfig
    from llmrl_core.modules.backends.vllm.engine import make_llm

    return make_llm(
        EngineConfig(model=default_model_path, dtype="float32", kv_cache_gb=1, seed=0, weight_sync_extension=True)
    )


@pytest.fixture
def s3_server():
    """A local S3 (moto on 127.0.0.1, bucket ``llmrl``, see ``tests/s3_server.py``): ``s3_server.uri("x/y")`` is a
    pyarrow URI of that path; skipped when moto is not installed."""
    pytest.importorskip("moto.server", reason="moto is not installed (pip install 'moto[s3,server]')")
    from s3_server import moto_s3

    with moto_s3() as server:
        yield server
