"""A bound on how long a local Dask worker process takes to end once it has closed.

A worker that held a vLLM CPU engine ends its Python code at once when the flow closes the cluster, then spends
seconds in the native libraries' own teardown (no Python frame left: measured with ``faulthandler``) until the
Nanny gives up after 4 s and SIGKILLs it ("Worker process still alive after 4.0 seconds, killing"). Every flow
run paid those seconds at its end. :class:`BoundedExit` lets the interpreter's exit handlers run (vLLM's and
torch's, logging's flush) and ends the process with ``_exit`` if the native teardown outlasts
:data:`NATIVE_TEARDOWN_S`. Only a worker that closed normally is bounded; one that crashes exits as it would.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

NATIVE_TEARDOWN_S = 1.0  # after the last exit handler of ours: the native libraries' teardown, normally < 1 s


class BoundedExit(WorkerPlugin):
    """A worker plugin: once its worker has closed normally, the process's native teardown gets at most
    :data:`NATIVE_TEARDOWN_S` (then ``_exit``), instead of running until the Nanny kills it."""

    name = "llmrl-bounded-exit"

    def setup(self, worker: Any) -> None:
        """Register the exit handler in the worker process: before the engines import vLLM and torch, so their
        own exit handlers (registered later) run first."""
        self._closed = False
        atexit.register(self._bound_native_teardown)

    def teardown(self, worker: Any) -> None:
        """The worker is closing normally (the cluster is being closed)."""
        self._closed = True

    def _bound_native_teardown(self) -> None:
        if not self._closed:
            return
        sink = os.open(os.devnull, os.O_WRONLY)  # the watchdog needs a file; it has nothing to report
        # a C-level timer: it fires even during interpreter finalization, where no Python code runs any more
        faulthandler.dump_traceback_later(NATIVE_TEARDOWN_S, exit=True, file=sink)
