"""Start a vLLM engine in a process whose modules vLLM's start-up scan cannot read.

vLLM 0.32's CPU kernel overrides (``vllm.triton_utils.dispatcher._rebind_kernels``, run by every engine start on
CPU) walk the globals of every module in ``sys.modules`` and call ``hasattr(value, "__dict__")`` on each. A
werkzeug ``LocalProxy`` global (``flask.request``, ``flask.current_app``, ... present once Flask is imported:
MLflow's or moto's server, a web app) raises ``RuntimeError: Working outside of application context`` there, and
the engine fails to start. :func:`modules_hidden_from_vllm_scan` takes such modules out of ``sys.modules`` while
the engine starts and puts them back after; they hold no kernel, so the scan loses nothing.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType


def _unreadable(module: ModuleType) -> bool:
    """Whether ``hasattr(value, "__dict__")`` raises for one of the module's globals (as vLLM's scan asks)."""
    try:
        namespace = vars(module)
        values = list(namespace.values())
    except Exception:
        return False  # vLLM's scan skips a module without a readable namespace too
    with warnings.catch_warnings():  # reading some globals warns (torch.distributed.reduce_op): not ours to say
        warnings.simplefilter("ignore")
        for value in values:
            try:
                hasattr(value, "__dict__")
            except Exception:
                return True
    return False


@contextmanager
def modules_hidden_from_vllm_scan() -> Iterator[list[str]]:
    """Within the block, the modules vLLM's start-up scan would fail on are out of ``sys.modules`` (their names
    are yielded); they are back after it, unless the block imported a module of the same name again."""
    hidden = {name: module for name, module in list(sys.modules.items()) if module is not None and _unreadable(module)}
    for name in hidden:
        sys.modules.pop(name, None)
    try:
        yield sorted(hidden)
    finally:
        for name, module in hidden.items():
            sys.modules.setdefault(name, module)
