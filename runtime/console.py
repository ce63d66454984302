"""A quiet console: llmrl's own lines on the terminal, every library's log in files under the run folder.

By default (``LLMRL_VERBOSE`` unset; ``llmrl run ... -v`` sets it) a flow run writes

* ``<run>/logs/libraries.log``: the flow process's library loggers (Dask's scheduler and nannies, MLflow,
  transformers, httpx, Prefect's task-run lines, Python warnings), which no longer reach the console;
* ``<run>/logs/<worker>.log``: everything a local Dask worker process prints (vLLM's engine log and progress
  bars, the trainer's step bars, C++ warnings), its stdout and stderr redirected there when it starts
  (:mod:`runtime.worker_console`, a Dask worker preload).

The console keeps the flow's own lines (Prefect's flow-run logger: start, placement, dtype, versions, warnings
that need the user, the result and its paths), warnings and errors of every library, and llmrl's progress bar.
With ``-v`` nothing is redirected and the libraries log live, as before.

:func:`progress_bar` is that bar, the one of every long command (grpo's versions, the evaluation's answers,
collect's batches, sft's and offline's epochs): tqdm on stderr, like the flow's log lines.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

VERBOSE = "LLMRL_VERBOSE"
WORKER_LOG = "LLMRL_WORKER_LOG"

# The flow process's library loggers: everything (from INFO) to the file unless -v, and from this level on the
# console too. Dask's and vLLM's warnings are about their own set-up (a worker slow to exit, thread binding,
# LD_PRELOAD hints): the file has them; their errors still show. Python warnings (deprecations) stay in the file.
LIBRARY_LOGGERS = {
    "distributed": logging.ERROR,
    "mlflow": logging.WARNING,
    "alembic": logging.WARNING,
    "transformers": logging.WARNING,
    "httpx": logging.WARNING,
    "urllib3": logging.WARNING,
    "vllm": logging.ERROR,
    "py.warnings": logging.CRITICAL + 1,
}


def progress_bar(total: int, desc: str, unit: str, initial: int = 0, enabled: bool = True) -> Any:
    """llmrl's progress bar on the console (stderr): ``initial`` of ``total`` done (counted in ``unit``), with rate
    and ETA; ``None`` when ``enabled`` is off (a flow's ``progress`` setting) or nothing is left to do. Close it on
    every way out, so that an error line starts a line of its own."""
    if not enabled or initial >= total:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True)


def verbose() -> bool:
    """True when the libraries should log to the console (``llmrl run ... -v``)."""
    return os.environ.get(VERBOSE, "") == "1"


def logs_dir(run_dir: Path) -> Path:
    """The run folder's ``logs`` folder (created)."""
    path = Path(run_dir) / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def library_logs(run_dir: Path) -> Iterator[Path | None]:
    """While open, this process's library logs go to ``<run>/logs/libraries.log`` (console: their warnings and
    errors only); on leaving, every logger is as it was. Yields the file, or None with ``-v`` (nothing changes).
    Nested uses (a flow and the cluster it opens) each restore what they found."""
    if verbose():
        yield None
        return
    path = logs_dir(run_dir) / "libraries.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    consoles: dict[int, logging.Handler] = {}
    for level in sorted(set(LIBRARY_LOGGERS.values()) | {logging.WARNING}):
        consoles[level] = logging.StreamHandler()
        consoles[level].setLevel(level)
        consoles[level].setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        consoles[level].addFilter(not_an_echo)
    saved = {name: _state(logging.getLogger(name)) for name in (*LIBRARY_LOGGERS, "prefect.task_runs")}
    vllm_setting = os.environ.get("VLLM_CONFIGURE_LOGGING")
    # vLLM configures a console handler of its own when imported (an evaluation engine in this process): let its
    # records reach the "vllm" logger set up here instead. Workers get the default back (their output is a file).
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    logging.captureWarnings(True)
    try:
        for name, console_level in LIBRARY_LOGGERS.items():
            logger = logging.getLogger(name)
            for old in [h for h in logger.handlers if type(h) is logging.StreamHandler]:
                logger.removeHandler(old)  # the library's own console handler (Dask installs one)
            logger.addHandler(handler)
            logger.addHandler(consoles[console_level])
            logger.setLevel(logging.INFO)
            logger.propagate = False
        # Prefect's per-task "Finished in state Completed()" lines: kept in the UI (its API handler stays) and the
        # file, not echoed (Prefect's console handler sits on the "prefect" logger they would propagate to).
        tasks = logging.getLogger("prefect.task_runs")
        tasks.addHandler(handler)
        tasks.addHandler(consoles[logging.WARNING])
        tasks.propagate = False
        _quiet_progress_bars()
        yield path
    finally:
        for name, state in saved.items():
            _restore(logging.getLogger(name), state)
        logging.captureWarnings(False)
        if vllm_setting is None:
            os.environ.pop("VLLM_CONFIGURE_LOGGING", None)
        else:
            os.environ["VLLM_CONFIGURE_LOGGING"] = vllm_setting
        handler.close()


# The errors the command line reports in one line of its own (llmrl_cli/run_more.py: a lost worker, a stop by
# train.agreement_stop, the user's code that failed: a reward function, env factory, transform or agent), and the
# closed connections a lost worker leaves in Dask's logs.
_ONE_LINE_ERRORS = (
    "WorkerLost",
    "AgreementOff",
    "RewardFunctionError",
    "EnvFactoryError",
    "EnvTransformError",
    "AgentFailed",
    "CommClosedError",
    "StreamClosedError",
)


def not_an_echo(record: logging.LogRecord) -> bool:
    """Console filter: False for the library lines that echo an error the command line reports in one line
    (Prefect's task- and flow-failure records with their tracebacks, Dask's closed-connection errors after a lost
    worker); the run's log file keeps them."""
    if record.exc_info and record.exc_info[0] is not None:
        if record.exc_info[0].__name__ in _ONE_LINE_ERRORS:
            return False
    text = record.getMessage()
    return not any(name in text for name in _ONE_LINE_ERRORS)


@contextmanager
def flow_echoes_dropped() -> Iterator[None]:
    """While open (a command-line flow run), the console handlers of the root logger, where Prefect's flow-run
    records land, drop the echoes of an error the command line reports in one line (:func:`not_an_echo`): Prefect's
    "Encountered exception" traceback and its "Finished in state Failed(...)" line. Prefect's API handler (the UI)
    keeps them. Nothing changes with ``-v``."""
    handlers = [] if verbose() else [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)]
    for handler in handlers:
        handler.addFilter(not_an_echo)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(not_an_echo)


def _state(logger: logging.Logger) -> tuple[list[logging.Handler], int, bool]:
    return list(logger.handlers), logger.level, logger.propagate


def _restore(logger: logging.Logger, state: tuple[list[logging.Handler], int, bool]) -> None:
    handlers, level, propagate = state
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


def _quiet_progress_bars() -> None:
    """The libraries' own progress bars in this process (model conversion, weight loading)."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:  # pragma: no cover
        pass


def worker_log_options(logs: Path, name: str) -> tuple[dict, dict[str, str]]:
    """Extra Nanny options and environment of a local worker: Dask's own lines at WARNING, the process's output
    to ``<logs>/<name>.log``. Nothing with ``-v``."""
    if verbose():
        return {}, {}
    import dask

    configured = dask.config.get("distributed.worker.preload", None) or []  # the user's preloads stay
    configured = [configured] if isinstance(configured, str) else list(configured)
    options = {"silence_logs": logging.WARNING, "preload": [*configured, "runtime.worker_console"]}
    return options, {WORKER_LOG: str(logs / f"{name}.log"), "VLLM_CONFIGURE_LOGGING": "1"}
