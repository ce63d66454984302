"""The run's quiet console (runtime/console.py): what a lost worker leaves on it, and the workers' preloads."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import dask

from runtime.actor_calls import WorkerLost
from runtime.console import not_an_echo, worker_log_options


def _record(name: str, message: str, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord(name, logging.ERROR, __file__, 1, message, (), exc_info)


def test_the_console_drops_the_library_echoes_of_a_lost_worker_and_keeps_other_errors():
    lost = WorkerLost("the rollout worker tcp://127.0.0.1:1 died during rollout of version 1")
    assert not not_an_echo(_record("prefect.task_runs", "Task run failed with exception", lost))
    assert not not_an_echo(
        _record("distributed.scheduler", "broadcast to tcp://127.0.0.1:1 failed: CommClosedError: in <TCP (closed)>")
    )
    try:
        raise ValueError("a reward function returned a string")
    except ValueError:
        error = _record("prefect.task_runs", "Task run failed with exception")
        error.exc_info = sys.exc_info()
    assert not_an_echo(error)  # any other failure still reaches the console
    assert not_an_echo(_record("distributed.worker", "Compute failed"))


def test_the_console_drops_prefects_echo_of_an_agreement_stop():
    from tasks.grpo_stages import AgreementOff

    stop = AgreementOff("version 0: sampler and trainer disagree before training")
    assert not not_an_echo(_record("prefect.flow_runs", "Encountered exception during execution", stop))
    assert not not_an_echo(_record("prefect.flow_runs", "Finished in state Failed('... AgreementOff: version 0')"))


def test_local_workers_keep_the_users_preloads(monkeypatch):
    monkeypatch.delenv("LLMRL_VERBOSE", raising=False)
    with dask.config.set({"distributed.worker.preload": ["my_site.preload"]}):
        options, env = worker_log_options(Path("/tmp"), "rollout-0")
    assert options["preload"] == ["my_site.preload", "runtime.worker_console"]
    assert env["LLMRL_WORKER_LOG"] == "/tmp/rollout-0.log"
    monkeypatch.setenv("LLMRL_VERBOSE", "1")
    assert worker_log_options(Path("/tmp"), "rollout-0") == ({}, {})


def test_the_evaluation_bar_counts_every_versions_answers_and_drops_a_reused_one(capsys):
    from tasks.evaluate import EvaluationBar, answers_per_version

    per_version = answers_per_version({"n_questions": 5, "greedy": True, "n_samples": 1})
    bar = EvaluationBar("r", [0, 2, 3], per_version)
    assert per_version == 10 and bar.bar.total == 30 and bar.bar.n == 0
    report = bar.for_version(0)
    report(0, 10)
    report(4, 10)
    report(2, 10)  # a retry of the version starts it again
    assert bar.bar.n == 2
    report(10, 10)
    bar.finished(0, reused=False)
    bar.finished(2, reused=True)  # its result file was reused: nothing sampled
    assert (bar.bar.n, bar.bar.total) == (10, 20)
    bar.for_version(3)(6, 10)
    assert bar.bar.n == 16
    bar.finished(3, reused=False)
    bar.close()
    err = capsys.readouterr().err
    assert "evaluate r" in err and "20/20" in err and "version 3 (3/3)" in err
    assert EvaluationBar("r", [0], 10, enabled=False).for_version(0) is None
