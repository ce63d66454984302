"""Loading the code a run's config names (:func:`import_object`: ``module:attribute``), and the error of that code
(a reward function, an env factory, an env transform): its message names the setting or class and what went wrong,
so the command line prints it in one line (the traceback stays in the worker's log), and a retry would only fail
the same way."""

from __future__ import annotations

import importlib
from typing import Any


class UserCodeError(ValueError):
    """Code the run's config names failed; the message says which and how (the cause is chained)."""


def import_object(path: str, setting: str) -> Any:
    """The object named by ``module:attribute`` (``setting`` names the config key in errors)."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{setting}: {path!r} must look like 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # user code may fail to import for any reason: say which setting
        raise ValueError(f"{setting}: cannot import module {module_name!r} ({type(err).__name__}: {err})") from err
    obj = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{setting}: module {module_name!r} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{setting}: {path!r} is not callable")
    return obj
