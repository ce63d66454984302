"""Dask worker preload of a quiet run (:mod:`runtime.console`): the worker process's stdout and stderr go to the
file ``LLMRL_WORKER_LOG`` names, from its start, so vLLM's engine log, progress bars and C++ warnings stay off the
console (file descriptors 1 and 2 are redirected, which catches output of native code too)."""

from __future__ import annotations

import os
import sys
from typing import Any

from runtime.console import WORKER_LOG


def redirect_output(path: str) -> None:
    """Point this process's stdout and stderr (Python's and the file descriptors) at ``path`` (appended)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def dask_setup(worker: Any) -> None:
    """Dask's preload hook, run in the worker process when it starts."""
    path = os.environ.get(WORKER_LOG)
    if path:
        redirect_output(path)
