"""Prompt rows from an installed `verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environment.

``verifiers`` is an optional extra (``pip install 'llmrl[verifiers]'``). A run names an installed environment and the
arguments of its ``load_environment`` (``env.verifiers: {id: my-env, args: {...}}``); the environment is loaded with
verifiers' own ``vf.load_environment`` (once per process) and its own datasets are the prompts:

- ``verifiers:train``: the environment's dataset (``env.get_dataset()``);
- ``verifiers:eval``: its eval dataset (``env.get_eval_dataset()``; an environment without one falls back to its
  train dataset, as verifiers itself does, and logs a warning).

Each row keeps the environment's own prompt (``verifiers_prompt``, its messages as JSON), ``answer``, ``info`` and
``example_id``, and the environment it came from (``verifiers_env``), so the agent that runs the environment's
rollout (:mod:`llmrl_core.agents.verifiers_agent`) needs nothing but the row. ``question`` is the text of the last
user message (what logs and the stored row show).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import threading
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

SETTING = "env.verifiers"
SOURCE_PREFIX = "verifiers:"
SPLITS = ("train", "eval")

_LOADED: dict[str, Any] = {}
_LOCK = threading.Lock()


def _verifiers() -> Any:
    try:
        import verifiers
    except ImportError as err:
        raise ValueError(
            f"{SETTING} needs the optional 'verifiers' package: pip install 'llmrl[verifiers]' ({err})"
        ) from err
    return verifiers


@dataclass(frozen=True)
class VerifiersSpec:
    """Which installed verifiers environment, loaded with which ``load_environment`` arguments."""

    id: str
    args: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, value: Any, setting: str = SETTING) -> VerifiersSpec:
        """From a run's ``env.verifiers`` mapping (shape errors name the setting; nothing is imported)."""
        if isinstance(value, VerifiersSpec):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"{setting} must be a mapping {{id: <installed env id>, args: {{...}}}}, got {value!r}")
        unknown = sorted(set(value) - {"id", "args"})
        if unknown:
            raise ValueError(f"{setting}: unknown key(s) {unknown}; valid: ['args', 'id']")
        env_id = value.get("id")
        if not isinstance(env_id, str) or not env_id.strip():
            raise ValueError(f"{setting}.id: name an installed verifiers environment (e.g. vf-math), got {env_id!r}")
        args = value.get("args") or {}
        if not isinstance(args, Mapping):
            raise ValueError(f"{setting}.args must be a mapping of load_environment arguments, got {args!r}")
        return cls(env_id.strip(), dict(args))

    def to_json(self) -> str:
        """The spec as the JSON string rows carry (``verifiers_env``)."""
        return json.dumps({"id": self.id, "args": dict(self.args)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> VerifiersSpec:
        """The spec a row carries."""
        return cls.from_config(json.loads(text))


def load_env(spec: VerifiersSpec, setting: str = SETTING) -> Any:
    """The loaded environment (``vf.load_environment(id, **args)``), once per process and spec. Errors name
    ``setting.id`` (not installed, no ``load_environment``) or ``setting.args`` (the loader refused them)."""
    key = spec.to_json()
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
        vf = _verifiers()
        _check_args(spec, setting)
        try:
            with _own_signal_handlers():
                env = vf.load_environment(spec.id, **dict(spec.args))
        except ValueError as err:  # verifiers' "Could not import '<id>' environment"
            raise ValueError(f"{setting}.id: cannot load verifiers environment {spec.id!r}: {err}") from err
        except Exception as err:  # the env's own loader refused its arguments (or failed on them)
            cause = err.__cause__ or err
            raise ValueError(
                f"{setting}.args: verifiers environment {spec.id!r} failed to load with args {dict(spec.args)}: "
                f"{type(cause).__name__}: {cause}"
            ) from err
        if not isinstance(env, vf.Environment):
            raise ValueError(f"{setting}.id: {spec.id!r}'s load_environment returned {type(env).__name__}")
        _LOADED[key] = env
        return env


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """While an environment is built, verifiers' ``Environment`` would install SIGINT/SIGTERM handlers of its own
    (``signal.signal`` raises outside the main thread, where Dask workers build it, and in the main thread it would
    replace the flow's handlers). Its module's ``signal.signal`` is a no-op meanwhile; its atexit teardown stays."""
    import signal

    try:
        module = importlib.import_module("verifiers.envs.environment")
    except ImportError:
        module = None
    if module is None or getattr(module, "signal", None) is not signal:
        yield
        return
    shim = types.SimpleNamespace(**{k: getattr(signal, k) for k in dir(signal) if not k.startswith("__")})
    shim.signal = lambda signum, handler: signal.getsignal(signum)
    module.signal = shim  # type: ignore[attr-defined]
    try:
        yield
    finally:
        module.signal = signal  # type: ignore[attr-defined]


def _check_args(spec: VerifiersSpec, setting: str) -> None:
    """Argument names ``load_environment`` does not take, said before it runs (when its module imports)."""
    import inspect

    module_name = spec.id.replace("-", "_").split("/")[-1]  # verifiers' own rule for an env id's module
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(
            f"{setting}.id: no installed verifiers environment {spec.id!r} (cannot import {module_name!r}: {err})"
        ) from err
    loader = getattr(module, "load_environment", None)
    if not callable(loader):
        raise ValueError(f"{setting}.id: module {module_name!r} has no load_environment function")
    parameters = inspect.signature(loader).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = sorted(set(spec.args) - set(parameters))
    if unknown:
        raise ValueError(
            f"{setting}.args: unknown argument(s) {unknown} for {spec.id!r}'s load_environment; "
            f"valid: {sorted(parameters)}"
        )


def is_verifiers_source(source: Any) -> bool:
    """Whether a source string names a split of the run's verifiers environment."""
    return isinstance(source, str) and source.startswith(SOURCE_PREFIX)


def _last_user_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    for message in reversed(list(prompt or [])):
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            return " ".join(str(p.get("text", "")) for p in content or [] if isinstance(p, Mapping))
    return ""


def verifiers_rows(source: str, env_options: Mapping[str, Any] | None, n: int | None = None) -> list[dict[str, Any]]:
    """The rows of ``verifiers:<split>`` for the environment in ``env_options["verifiers"]`` (a run's env options,
    see :class:`~llmrl_core.pipeline.env_config.EnvConfig`), the first ``n`` (all when None)."""
    split = source.removeprefix(SOURCE_PREFIX)
    if split not in SPLITS:
        raise ValueError(f"source {source!r}: expected verifiers:train or verifiers:eval")
    if not env_options or not env_options.get("verifiers"):
        raise ValueError(f"source {source!r} needs env.verifiers naming an installed verifiers environment")
    spec = VerifiersSpec.from_config(env_options["verifiers"])
    env = load_env(spec)
    dataset = env.get_dataset(n=-1 if n is None else n) if split == "train" else env.get_eval_dataset(n=n or -1)
    env_json = spec.to_json()
    rows = []
    for record in dataset:
        prompt = record.get("prompt")
        rows.append(
            {
                "question": _last_user_text(prompt),
                "answer": str(record.get("answer") or ""),
                "verifiers_prompt": json.dumps(prompt),
                "verifiers_info": json.dumps(record.get("info") or {}),
                "verifiers_example_id": int(record.get("example_id", len(rows))),
                "verifiers_task": str(record.get("task") or ""),
                "verifiers_env": env_json,
            }
        )
    if not rows:
        raise ValueError(f"source {source!r}: verifiers environment {spec.id!r} has no rows in that split")
    return rows
