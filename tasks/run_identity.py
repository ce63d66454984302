"""One run, one identity in both UIs: the Prefect flow run is named after the llmrl run and tagged with it, the
MLflow run carries the Prefect flow run's id and address, and the Prefect run links to the MLflow run.

Addresses are those of ``llmrl ui`` (its running instance, else its defaults ``http://127.0.0.1:4200`` and
``http://127.0.0.1:5000``): the links work whenever the UI serves this home, which is where llmrl's runs are
browsed. Outside a flow run (a library call) nothing is done.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from prefect.artifacts import create_link_artifact

from tasks.ui_state import running_ui

DEFAULT_PREFECT_UI = "http://127.0.0.1:4200"
DEFAULT_MLFLOW_UI = "http://127.0.0.1:5000"


def ui_addresses() -> tuple[str, str]:
    """The Prefect and MLflow UI addresses of ``llmrl ui`` (running, else its defaults)."""
    ui = running_ui() or {}
    return ui.get("prefect_ui_url", DEFAULT_PREFECT_UI), ui.get("mlflow_url", DEFAULT_MLFLOW_UI)


def flow_run_name(run_id: str, first: int, last: int) -> str:
    """``<run_id> v<first>-<last>``: the versions this flow run makes."""
    return f"{run_id} v{first}-{last}"


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
            tags = set(client.read_flow_run(flow_run_id).tags) | {"llmrl", f"run:{run_id}"}
            client.update_flow_run(flow_run_id, name=name, tags=sorted(tags))
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


_CURRENT: dict[str, Any] = {}  # the flow run identify_run named last in this process


def mark_stopped(reason: str) -> bool:
    """Mark the flow run :func:`identify_run` named last as Cancelled (a run stopped by Ctrl-C or SIGTERM, which
    Prefect would otherwise show as Crashed); returns whether it was marked. Its MLflow run is marked KILLED by
    the lineage recorder itself."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    flow_run_id = _CURRENT.pop("flow_run_id", None)
    if flow_run_id is None:
        return False
    try:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run_id, Cancelled(message=reason), force=True)
        return True
    except Exception as err:  # the API may already be gone; the run's data are unaffected
        logging.getLogger(__name__).warning("could not mark flow run %s cancelled: %s", flow_run_id, err)
        return False
