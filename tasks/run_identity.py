"""One run, one identity in both UIs: the Prefect flow run is named after the llmrl run and tagged with it, the
MLflow run carries the Prefect flow run's id and address, and the Prefect run links to the MLflow run.

Addresses are those of ``llmrl ui`` (its running instance, else its defaults ``http://127.0.0.1:4200`` and
``http://127.0.0.1:5000``): the links work whenever the UI serves this home, which is where llmrl's runs are
browsed. Outside a flow run (a library call) nothing is done.
"""

from __future__ import annotations

import logging
import re
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from prefect.artifacts import create_link_artifact
from prefect.exceptions import Pause

from tasks.ui_state import running_ui

T = TypeVar("T")
DEFAULT_PREFECT_UI = "http://127.0.0.1:4200"
DEFAULT_MLFLOW_UI = "http://127.0.0.1:5000"


def ui_addresses() -> tuple[str, str]:
    """The Prefect and MLflow UI addresses of ``llmrl ui`` (running, else its defaults)."""
    ui = running_ui() or {}
    return ui.get("prefect_ui_url", DEFAULT_PREFECT_UI), ui.get("mlflow_url", DEFAULT_MLFLOW_UI)


def flow_run_name(run_id: str, first: int, last: int) -> str:
    """``<run_id> v<first>-<last>``: the versions this flow run makes."""
    return f"{run_id} v{first}-{last}"


def named_at_creation(config_class: type, last: Callable[[Any], int]) -> Callable[[], str]:
    """A flow's ``flow_run_name``: Prefect creates the flow run with the name :func:`identify_run` gives it (``<run_id>
    v<first>-<last>``), so the console's first line ("Beginning flow run ...") names the run as both UIs do. The
    config comes from the flow run's parameters; ``first`` is the last version the run's own folder has committed
    (0 for a new run), ``last`` is ``last(config)``. A config that does not load gives ``<flow> (config refused)``:
    the flow then refuses it in its own words. :func:`identify_run` renames the run if the commit markers of a
    remote ``runs_dir`` say otherwise."""

    def name() -> str:
        from prefect.runtime import flow_run

        from llmrl_core.pipeline.config_io import load_config
        from storage.layout import RunLayout
        from tasks.commits import latest_published

        params = flow_run.parameters
        try:
            cfg = load_config(
                config_class, params.get("config"), params.get("overrides") or [], settings=params.get("settings")
            )
            published = latest_published(RunLayout.for_runs_dir(cfg.run_id, cfg.runs_dir).run_dir)
        except Exception:  # the flow refuses the config itself, with the reason
            return f"{flow_run.flow_name} (config refused)"
        first = published[0] if published else 0
        return flow_run_name(cfg.run_id, first, max(first, last(cfg)))

    return name


def collect_run_name() -> str:
    """The collect flow's ``flow_run_name``: ``<out run> collect v<version>`` (the run its rows are stored under and
    the version that samples them), from the flow run's parameters; ``collect (config refused)`` when the config does
    not load (the flow then refuses it in its own words)."""
    from prefect.runtime import flow_run

    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig

    params = flow_run.parameters
    try:
        cfg = load_config(
            GRPOConfig, params.get("config"), params.get("overrides") or [], settings=params.get("settings")
        )
    except Exception:  # the flow refuses the config itself, with the reason
        return "collect (config refused)"
    out_run = params.get("out_run_id") or f"{cfg.run_id}-collect"
    return f"{out_run} collect v{params.get('policy_version', 0)}"


def identify_run(run_id: str, first: int, last: int, lineage: Any) -> dict[str, str]:
    """Name and tag the current Prefect flow run, cross-link it with ``lineage``'s MLflow run; returns the links.

    A failure to reach either service is logged and does not stop the run (the run's data are unaffected).
    """
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    flow_run_id = flow_run.get_id()
    if flow_run_id is None:
        return {}
    name = flow_run_name(run_id, first, last)
    _CURRENT["flow_run_id"] = flow_run_id
    prefect_ui, mlflow_ui = ui_addresses()
    links = {
        "prefect_flow_run_url": f"{prefect_ui}/runs/flow-run/{flow_run_id}",
        "mlflow_run_url": f"{mlflow_ui}/#/experiments/{lineage.experiment_id}/runs/{lineage.mlflow_run_id}",
    }
    try:
        with get_client(sync_client=True) as client:
            crash_orphaned_flow_runs(client)
            tags = set(client.read_flow_run(flow_run_id).tags) | {"llmrl", f"run:{run_id}", *_process_tags()}
            client.update_flow_run(flow_run_id, name=name, tags=sorted(tags))
        _rename_in_context(name)
        lineage.set_tags(
            {
                "prefect.flow_run_id": str(flow_run_id),
                "prefect.flow_run_name": name,
                "prefect.flow_run_url": links["prefect_flow_run_url"],
            }
        )
        create_link_artifact(
            links["mlflow_run_url"],
            link_text=f"MLflow run of {run_id}",
            key=re.sub(r"[^a-z0-9-]+", "-", f"mlflow-{run_id.lower()}")[:100],
            description=f"The MLflow run of llmrl run {run_id}: metrics, lineage and models of every version.",
        )
    except Exception as err:  # a UI link must never fail a training run
        logging.getLogger(__name__).warning("could not link the Prefect and MLflow runs of %s: %s", run_id, err)
    return links


def _rename_in_context(name: str) -> None:
    """Give this process's flow run context the name too (the loggers made from it from now on say it)."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is not None and context.flow_run is not None:
        context.flow_run.name = name


_CURRENT: dict[str, Any] = {}  # the flow run identify_run named last in this process


def tag_flow_run(*tags: str) -> None:
    """Add ``tags`` to the current Prefect flow run (nothing outside a flow run; a failure is logged, not raised)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    flow_run_id = flow_run.get_id()
    if flow_run_id is None:
        return
    try:
        with get_client(sync_client=True) as client:
            current = set(client.read_flow_run(flow_run_id).tags)
            client.update_flow_run(flow_run_id, tags=sorted(current | set(tags)))
    except Exception as err:  # a tag must never fail a run
        logging.getLogger(__name__).warning("could not tag flow run %s: %s", flow_run_id, err)


def _process_tags() -> list[str]:
    """The tags that say which process runs a flow run (``host:<name>``, ``pid:<pid>``), so a later start can tell
    a flow run whose process was killed (SIGKILL reports nothing) from one still running."""
    import os
    import socket

    return [f"host:{socket.gethostname()}", f"pid:{os.getpid()}"]


def crash_orphaned_flow_runs(client: Any) -> list[str]:
    """Mark Crashed each llmrl flow run that Prefect shows Running but whose process on this host is gone (killed
    by SIGKILL or the OOM killer, it could not report its end); returns their names. Run at every flow's start, so
    the UI's Running runs are true after the next run on the host."""
    import datetime as dt
    import socket

    import psutil
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    running = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            tags=FlowRunFilterTags(all_=["llmrl", f"host:{socket.gethostname()}"]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING])),
        )
    )
    crashed = []
    for run in running:
        pid = next((int(t[4:]) for t in run.tags if t.startswith("pid:") and t[4:].isdigit()), None)
        if pid is None or _alive_since(psutil, pid, run.start_time or dt.datetime.now(dt.UTC)):
            continue
        message = f"its flow process (pid {pid}) ended without reporting (killed); found by the next run's start"
        client.set_flow_run_state(run.id, Crashed(message=message), force=True)
        crashed.append(run.name)
    if crashed:
        logging.getLogger(__name__).warning("flow runs whose process was killed, now marked Crashed: %s", crashed)
    return crashed


def _alive_since(psutil: Any, pid: int, started: Any) -> bool:
    """Whether process ``pid`` exists and is older than ``started`` (a newer one reuses a dead run's pid)."""
    try:
        created = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:  # a zombie too: it has ended
        return False
    except psutil.AccessDenied:  # another user's process: it exists
        return True
    return created <= started.timestamp() + 1


def mark_stopped(reason: str) -> bool:
    """Mark this process's current flow run (else the one :func:`identify_run` named last) Cancelled, and its task
    run in progress: a run stopped by Ctrl-C or SIGTERM, which Prefect would otherwise show as Crashed; returns
    whether it was marked. Inside the flow, Prefect's engines also learn the states, so they report no crash. Its
    MLflow run is marked KILLED by the lineage recorder itself."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.states import Cancelled

    flow_context, task_context = FlowRunContext.get(), TaskRunContext.get()
    current = flow_context.flow_run if flow_context is not None else None
    flow_run_id = _CURRENT.pop("flow_run_id", None) if current is None else current.id
    if flow_run_id is None:
        return False
    if task_context is not None and task_context.task_run is not None:
        _cancel_task_run(task_context.task_run, reason)
    try:
        with get_client(sync_client=True) as client:
            result = client.set_flow_run_state(flow_run_id, Cancelled(message=reason), force=True)
        if current is not None and result.state is not None:
            current.state = result.state  # the engine then sees a final state and reports no crash
        _CURRENT.pop("flow_run_id", None)
        return True
    except Exception as err:  # the API may already be gone; the run's data are unaffected
        logging.getLogger(__name__).warning("could not mark flow run %s cancelled: %s", flow_run_id, err)
        return False


def _cancel_task_run(task_run: Any, reason: str) -> None:
    """Mark the task run in progress Cancelled as Prefect's task engine marks its states: in the run object it
    holds, and by the state-change event the API records task states from (task runs are not set through the API)."""
    from prefect.states import Cancelled
    from prefect.utilities.engine import emit_task_run_state_change_event

    last = task_run.state
    task_run.state = new = Cancelled(message=reason)
    new.state_details.task_run_id = task_run.id
    new.state_details.flow_run_id = task_run.flow_run_id
    task_run.state_id, task_run.state_type, task_run.state_name = new.id, new.type, new.name
    try:
        emit_task_run_state_change_event(task_run=task_run, initial_state=last, validated_state=new)
    except Exception as err:  # the events client may be gone; the run's data are unaffected
        logging.getLogger(__name__).warning("could not mark task run %s cancelled: %s", task_run.name, err)


class StoppedByCtrlC(Pause, KeyboardInterrupt):
    """Ctrl-C inside a flow: a ``KeyboardInterrupt`` that Prefect's task engine passes on without calling it a
    crash (it is also a Prefect control signal), raised once the run is marked Cancelled."""


class StoppedBySigterm(Pause, SystemExit):
    """SIGTERM inside a flow: ``SystemExit(143)``, passed on by Prefect's task engine as :class:`StoppedByCtrlC`."""


def _stop(signum: int, _frame: object) -> None:
    ctrl_c = signum == signal.SIGINT
    mark_stopped("stopped by Ctrl-C" if ctrl_c else "stopped by SIGTERM")
    raise StoppedByCtrlC() if ctrl_c else StoppedBySigterm(128 + signum)


@contextmanager
def stops_cancel_the_flow_run() -> Iterator[None]:
    """Around a flow's body: Ctrl-C or SIGTERM marks the flow run and its task run in progress Cancelled, with what
    stopped them, before the stop is raised (as :class:`StoppedByCtrlC` / :class:`StoppedBySigterm`), so each
    state history goes Running -> Cancelled with no Crashed and the console shows no "Crash detected!". Outside the
    main thread (no signal handlers there), a stop that arrives as an exception is marked on its way out."""
    from prefect.exceptions import TerminationSignal

    try:
        previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        previous = {}
    task_lines = logging.getLogger("prefect.task_runs")
    task_lines.addFilter(_cancelled_is_not_an_error)
    try:
        yield
    except (StoppedByCtrlC, StoppedBySigterm):
        raise
    except (KeyboardInterrupt, SystemExit, TerminationSignal) as stop:
        mark_stopped("stopped by Ctrl-C" if isinstance(stop, KeyboardInterrupt) else "stopped by SIGTERM")
        raise
    finally:
        task_lines.removeFilter(_cancelled_is_not_an_error)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def attempts(attempt: Callable[[], T], restarts: int, log: Any, again: str | None = None) -> T:
    """A flow's body: ``attempt()`` with stops that cancel the flow run (:func:`stops_cancel_the_flow_run`) and, after
    a lost worker, up to ``restarts`` new attempts (:func:`runtime.actor_calls.with_restarts`; ``again`` says where
    the next one starts)."""
    from runtime.actor_calls import with_restarts

    with stops_cancel_the_flow_run():  # Ctrl-C / SIGTERM: Cancelled, not Crashed
        if again is None:
            return with_restarts(attempt, restarts, log)
        return with_restarts(attempt, restarts, log, again=again)


def _cancelled_is_not_an_error(record: logging.LogRecord) -> bool:
    """Prefect logs every task run that did not complete at ERROR; one the user stopped is logged at INFO."""
    if record.levelno == logging.ERROR and str(record.msg).startswith("Finished in state Cancelled("):
        record.levelno, record.levelname = logging.INFO, "INFO"
    return True
