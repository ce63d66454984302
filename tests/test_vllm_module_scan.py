"""An in-process vLLM engine starts in a process that imported Flask (MLflow's or moto's server, a web app).

vLLM 0.32's start-up scan on CPU (``vllm.triton_utils.dispatcher._rebind_kernels``) asks ``hasattr(value,
"__dict__")`` of every module global, and Flask's ``LocalProxy`` globals raise there; the CI run whose slow tests
started their first in-process engine after the S3 tests had imported moto's Flask server failed so."""

from __future__ import annotations

import sys

import pytest


def test_the_modules_vllm_cannot_scan_are_hidden_while_an_engine_starts():
    import flask.globals  # noqa: F401  (request, current_app, ...: LocalProxy globals)
    from vllm.triton_utils.dispatcher import _rebind_kernels

    from llmrl_core.modules.backends.vllm.module_scan import modules_hidden_from_vllm_scan

    with pytest.raises(RuntimeError, match="application context"):
        _rebind_kernels([])  # vLLM's own scan, as an engine start runs it, with Flask imported
    with modules_hidden_from_vllm_scan() as hidden:
        assert "flask.globals" in hidden and "flask.globals" not in sys.modules
        assert "torch" not in hidden and "vllm" not in hidden
        _rebind_kernels([])  # the same scan passes
    assert "flask.globals" in sys.modules and sys.modules["flask"].globals is sys.modules["flask.globals"]
