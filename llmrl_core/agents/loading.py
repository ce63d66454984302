"""Naming an agent in a config (``env.agent: "module:function"``): import it and check its signature early, before
any engine starts, with errors that name the setting."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from llmrl_core.user_code import import_object

SETTING = "env.agent"


def load_agent(path: str, setting: str = SETTING) -> Callable[..., Any]:
    """The callable named by ``module:function`` (dots in the function part reach attributes), checked to take
    ``(row, client)``; raises ValueError naming ``setting`` otherwise."""
    if not isinstance(path, str) or ":" not in path:
        raise ValueError(f"{setting} must look like 'module:function', got {path!r}")
    obj = import_object(path, setting)
    try:
        inspect.signature(obj).bind({}, object())
    except TypeError as err:
        raise ValueError(f"{setting}: {path!r} must accept (row, client): {err}") from err
    except ValueError:  # no signature to read (a builtin): trust it
        pass
    return obj


def is_async_agent(agent: Callable[..., Any]) -> bool:
    """Whether ``agent`` is a coroutine function (it gets an ``openai.AsyncOpenAI`` client) or a plain one (an
    ``openai.OpenAI`` client); a callable object counts by its ``__call__``."""
    if inspect.iscoroutinefunction(agent):
        return True
    return not inspect.isroutine(agent) and inspect.iscoroutinefunction(type(agent).__call__)


def check_agent_env(env: Any) -> None:
    """The ``env`` section with an agent: the agent imports and takes ``(row, client)``, and no setting that only
    applies to an env is set beside it (``factory``, ``transforms``, ``rewards``)."""
    if getattr(env, "agent", None) is None:
        return
    load_agent(env.agent)
    for key in ("factory", "transforms", "rewards"):
        if getattr(env, key, None):
            raise ValueError(
                f"env.{key} does not apply with env.agent (the agent talks to the model and returns the reward): "
                f"unset one of them"
            )
