"""MLGym (Meta's gym of machine-learning research tasks) for the LLM API, under TorchRL's names: :func:`make_mlgym`
builds MLGym tasks through MLGym's Gymnasium registration (``gymnasium.make("mlgym/<task>")``) when the ``mlgym``
package is installed, each played by :class:`MLGymTaskEnv` inside :class:`MLGymWrapper`
(:mod:`llmrl_core.envs.gym_wrapper`: any Gymnasium-style text game as a batched chat env, re-exported here).
Neither ``mlgym`` nor ``gymnasium`` is a dependency of llmrl and neither is imported unless :func:`make_mlgym` is
called.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from llmrl_core.envs.chat_env import InputMode
from llmrl_core.envs.gym_wrapper import (
    MLGymWrapper,
    TextGames,
    TextGymEnv,
    observation_text,
    split_step_result,
)

__all__ = ["MLGymTaskEnv", "MLGymWrapper", "TextGames", "TextGymEnv", "make_mlgym", "mlgym_score_reward"]

MLGYM_INSTALL_HINT = (
    "make_mlgym needs the 'mlgym' package (MLGym, https://github.com/facebookresearch/MLGym), which is not "
    "installed. Install it from source (git clone https://github.com/facebookresearch/MLGym && "
    "pip install -e ./MLGym); its tasks run in Docker or Podman containers. To play a local Gymnasium-style "
    "text environment instead, wrap it with llmrl_core.envs.MLGymWrapper(env_or_factory)."
)


# --- MLGym ---------------------------------------------------------------------------------------------------
_MLGYM_CWD_LOCK = threading.RLock()
_SCORE = re.compile(r"(Baseline|Evaluation) Score: \{'Score': ([-+0-9.eE]+|nan|inf)\}")


def _import_mlgym() -> tuple[Any, Any]:
    try:
        import mlgym
    except ImportError as err:
        raise ImportError(MLGYM_INSTALL_HINT) from err
    try:
        import gymnasium
    except ImportError as err:
        raise ImportError(
            "make_mlgym needs the 'gymnasium' package, which MLGym registers its tasks with: pip install gymnasium"
        ) from err
    return mlgym, gymnasium


def _mlgym_root(mlgym: Any) -> Path:
    root = getattr(mlgym, "REPO_ROOT", None)
    return Path(root) if root is not None else Path(mlgym.__file__).resolve().parent.parent


@contextlib.contextmanager
def _in_mlgym_dir() -> Iterator[None]:
    """MLGym resolves its config, task and container paths from its repository root: run its calls there.

    The working directory is process-wide, so these calls are serialised by a lock.
    """
    import mlgym

    with _MLGYM_CWD_LOCK:
        previous = os.getcwd()
        os.chdir(_mlgym_root(mlgym))
        try:
            yield
        finally:
            os.chdir(previous)


def mlgym_score_reward(text: str) -> float | None:
    """The reward in an MLGym evaluation output: evaluation score minus baseline score (None if not scored)."""
    scores = {kind: float(value) for kind, value in _SCORE.findall(text)}
    if "Evaluation" not in scores:
        return None
    return scores["Evaluation"] - scores.get("Baseline", 0.0)


class _FormatDict(dict):
    """``str.format_map`` values that leave unknown fields empty (templates differ between MLGym versions)."""

    def __missing__(self, key: str) -> str:
        return ""


def _command_file_entry(path: str | Path) -> dict[str, str]:
    """How MLGym's agent installs one command file in the container (script / sourced file / utility)."""
    path = Path(path)
    contents = path.read_text()
    if contents.strip().startswith("#!"):
        return {"contents": contents, "name": path.name.rsplit(".", 1)[0], "type": "script"}
    if path.name.endswith(".sh"):
        return {"contents": contents, "name": path.name, "type": "source_file"}
    if path.name.startswith("_"):
        return {"contents": contents, "name": path.name, "type": "utility"}
    raise ValueError(f"MLGym command file {path} has no shebang, is not a .sh file and does not start with '_'")


class MLGymTaskEnv:
    """One MLGym task container as a Gymnasium-style text game (str observations, five-tuple step).

    Does around MLGym's ``MLGymEnv`` what MLGym's own agent loop (and TorchRL's transforms) do: at reset it
    installs the agent's tools and state command in the container and answers the task prompt (the agent
    config's task and strategy templates) with the system prompt in ``info["system_prompt"]``; at each step it
    extracts the command from the reply with the agent config's output parser (a reply it cannot parse costs
    ``reward_wrong_format`` and the format-error message comes back, the container untouched), runs it, and
    answers with the next-step template filled with the command's output and the shell state. The reward is
    the evaluation score minus the baseline score when the output holds a score (``validate`` / ``submit``),
    plus MLGym's own reward. With several ``task_ids`` a task is drawn per reset (seeded), or named by
    ``options["task"]``.
    """

    def __init__(
        self,
        task_ids: Sequence[str],
        agent_config: Any,
        *,
        devices: Sequence[str] = ("cpu_0",),
        reward_wrong_format: float | None = None,
    ) -> None:
        if not task_ids:
            raise ValueError("MLGymTaskEnv needs at least one task id")
        self.task_ids = list(task_ids)
        self.config = agent_config
        self.devices = list(devices)
        self.reward_wrong_format = reward_wrong_format
        tools = getattr(agent_config, "tools_handler", None)
        self.tools = tools if tools is not None else agent_config
        self.env: Any = None
        self.task_id: str | None = None
        self._resets = 0
        try:
            from mlgym.exceptions import FormatError
        except ImportError:  # older / newer layouts: any ValueError from the parser is a format error
            FormatError = ValueError  # noqa: N806
        self._format_error: type[Exception] = FormatError

    # --- template values -------------------------------------------------------------------------
    def _task_values(self) -> dict[str, Any]:
        task_args = getattr(self.env, "task_args", None)
        if dataclasses.is_dataclass(task_args) and not isinstance(task_args, type):
            return dataclasses.asdict(task_args)
        return dict(vars(task_args)) if task_args is not None else {}

    def _system_values(self) -> dict[str, Any]:
        return {
            "command_docs": getattr(self.tools, "command_docs", ""),
            **dict(getattr(self.tools, "env_variables", None) or {}),
        }

    def _state_values(self) -> dict[str, Any]:
        state_command = getattr(self.tools, "state_command", None) or getattr(self.config, "state_command", None)
        name = getattr(state_command, "name", None)
        raw = self.env.communicate(name) if name else ""
        try:
            state = json.loads(raw) if raw and raw.strip() else {}
        except json.JSONDecodeError:
            state = {}
        state = dict(state) if isinstance(state, Mapping) else {}
        current = int(getattr(self.env, "current_step", 0) or 0)
        state["current_step"] = current
        state["remaining_steps"] = int(getattr(self.env, "max_steps", current) or current) - current
        return state

    def _fill(self, template: str | None, observation: str = "", state: Mapping[str, Any] | None = None) -> str:
        if not template:
            return observation
        values = _FormatDict({**self._task_values(), **self._system_values(), **dict(state or {})})
        values["observation"] = observation
        return template.format_map(values)

    # --- container set-up ------------------------------------------------------------------------
    def _install_tools(self) -> None:
        state_command = getattr(self.tools, "state_command", None) or getattr(self.config, "state_command", None)
        lines = [state_command.code] if getattr(state_command, "code", None) else []
        variables = getattr(self.config, "env_variables", None) or getattr(self.tools, "env_variables", None) or {}
        lines += [f"{key}={value}" for key, value in dict(variables).items()]
        if lines:
            output = self.env.communicate("\n".join(lines))
            if getattr(self.env, "returncode", 0) not in (0, None):
                raise RuntimeError(f"MLGym: setting the agent's environment failed ({self.env.returncode}): {output}")
        tools_config = getattr(self.tools, "config", None)
        files = getattr(tools_config, "command_files", None) or getattr(self.config, "command_files", None) or []
        if files and hasattr(self.env, "add_commands"):
            self.env.add_commands([_command_file_entry(f) for f in files])

    def _close_env(self) -> None:
        if self.env is not None:
            with contextlib.suppress(Exception):
                self.env.close()
        self.env = None

    # --- gym interface ---------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """(Re)start the task container; returns the task prompt and ``{"system_prompt", "mlgym_task"}``."""
        import gymnasium

        task = (options or {}).get("task")
        if task is None:
            task = self.task_ids[0] if len(self.task_ids) == 1 else random.Random(seed).choice(self.task_ids)
        with _in_mlgym_dir():
            if self.env is None or task != self.task_id:
                self._close_env()
                self.env = gymnasium.make(f"mlgym/{task}", devices=self.devices).unwrapped
                self.task_id = task
            elif self._resets:
                self.env.reset_container()  # a fresh container for every episode after the first
            workspace = getattr(self.env, "task_workspace", None)
            if workspace is not None:
                self.env.communicate(f"cd {Path(workspace).parent}")
            self.env.reset(seed=seed)
            self._install_tools()
            state = self._state_values()
            templates = [self.config.task_template, getattr(self.config, "strategy_template", None)]
            prompt = "\n".join(self._fill(t, "", state) for t in templates if t)
            system_prompt = self._fill(getattr(self.config, "system_template", None))
        self._resets += 1
        return prompt, {"system_prompt": system_prompt, "mlgym_task": task}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run the command in the reply; returns the next prompt, reward, terminated, truncated=False, info."""
        if self.env is None:
            raise RuntimeError("MLGymTaskEnv.step() called before reset()")
        parser = getattr(self.config, "output_parser", None)
        command = action
        if callable(parser):
            try:
                _thought, command = parser(action, list(getattr(self.tools, "commands", None) or []))
            except self._format_error:
                message = getattr(self.config, "format_error_template", None) or "Your reply was not formatted right."
                penalty = float(self.reward_wrong_format or 0.0)
                return message, penalty, False, False, {"format_error": True, "mlgym_task": self.task_id}
        guard = getattr(self.tools, "guard_multiline_input", None)
        command = (guard(command) if callable(guard) else command).strip()
        with _in_mlgym_dir():
            observation, reward, terminated, truncated, info = split_step_result(self.env.step(command))
            text = observation_text(observation)
            if command and command == getattr(self.tools, "submit_command", None):
                terminated = True
            score = mlgym_score_reward(text)
            if score is not None:
                reward += score
            if terminated or truncated:
                message = text
            else:
                template = "next_step_template" if text.strip() else "next_step_no_output_template"
                message = self._fill(getattr(self.config, template, None), text, self._state_values())
        info = {k: v for k, v in info.items() if isinstance(k, str)}
        info.update({"format_error": False, "mlgym_task": self.task_id, "command": command})
        return message, reward, terminated, truncated, info

    def close(self) -> None:
        """Stop the task container."""
        if self.env is not None:
            with _in_mlgym_dir():
                self._close_env()


def _register_mlgym_task(task: str, **environment_args: Any) -> str:
    """Register ``task`` (``configs/tasks/<task>.yaml``) with Gymnasium as MLGym's runner does; returns its id."""
    from mlgym.environment.env import EnvironmentArguments
    from mlgym.environment.registration import register_task

    arguments = EnvironmentArguments(task_config_path=f"tasks/{task}.yaml", verbose=False, **environment_args)
    register_task(arguments)
    return arguments.task.id


def _mlgym_agent_config(agent_config: str | Path | None) -> Any:
    from mlgym import CONFIG_DIR
    from mlgym.agent.base import AgentArguments
    from mlgym.backend.base import ModelArguments

    path = Path(agent_config) if agent_config is not None else Path(CONFIG_DIR) / "agents" / "default.yaml"
    # The model is the policy being trained; MLGym still wants model arguments, so a placeholder is given.
    return AgentArguments(model=ModelArguments(""), agent_config_path=path).config


def make_mlgym(
    task: str | None = None,
    *,
    tasks: Sequence[str] | None = None,
    tokenizer: Any = None,
    device: torch.device | str | None = "cpu",
    reward_wrong_format: float | None = None,
    input_mode: InputMode = "history",
    batch_size: int = 1,
    repeats: int = 1,
    seed: int | None = 0,
    max_turns: int | None = None,
    max_steps: int = 10,
    container_type: str = "docker",
    devices: Sequence[str] = ("cpu_0",),
    agent_config: str | Path | None = None,
    aliases_file: str | None = None,
    **wrapper_kwargs: Any,
) -> MLGymWrapper:
    """An MLGym task (``task``, e.g. ``"prisonersDilemma"``) or a set of tasks drawn per reset (``tasks``) as an
    :class:`MLGymWrapper` of :class:`MLGymTaskEnv` games, one task container per slot.

    Needs the ``mlgym`` package (and ``gymnasium``, which it registers its tasks with); raises ImportError
    naming what is missing otherwise. ``max_steps`` / ``container_type`` / ``aliases_file`` (default: the
    checkout's ``docker/aliases.sh`` or ``dockerfiles/aliases.sh``) go to MLGym's ``EnvironmentArguments``,
    ``agent_config`` names the agent config with the prompt templates and tools (default:
    ``configs/agents/default.yaml``), ``reward_wrong_format`` is the reward of an unparsable reply, and the
    remaining keywords go to :class:`MLGymWrapper`. ``tokenizer`` may be a model path. ``device`` (TorchRL's,
    default ``"cpu"``) is the env's ``device``, where its TensorDict outputs are placed; a CUDA device on a
    machine without CUDA raises ValueError. The task containers use ``devices`` (MLGym's own device names).
    """
    env_device = _env_device(device)
    mlgym, _gymnasium = _import_mlgym()
    if (task is None) == (tasks is None) or (tasks is not None and not tasks):
        raise ValueError(
            f"make_mlgym: give either task or tasks (a non-empty list), got task={task!r}, tasks={tasks!r}"
        )
    names = [task] if task is not None else list(tasks or [])
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    root = _mlgym_root(mlgym)
    if aliases_file is None:
        found = [p for p in ("docker/aliases.sh", "dockerfiles/aliases.sh") if (root / p).exists()]
        aliases_file = found[0] if found else None
    with _in_mlgym_dir():
        task_ids = [
            _register_mlgym_task(
                name,
                max_steps=max_steps,
                seed=seed if seed is not None else 42,
                container_type=container_type,
                aliases_file=aliases_file,
            )
            for name in names
        ]
        config = _mlgym_agent_config(agent_config)

    def factory() -> MLGymTaskEnv:
        return MLGymTaskEnv(task_ids, config, devices=devices, reward_wrong_format=reward_wrong_format)

    env = MLGymWrapper(
        factory,
        tokenizer=tokenizer,
        input_mode=input_mode,
        batch_size=batch_size,
        repeats=repeats,
        seed=seed,
        max_turns=max_turns,
        **wrapper_kwargs,
    )
    env.device = env_device
    return env


def _env_device(device: torch.device | str | None) -> torch.device | None:
    """``device`` as a ``torch.device`` (None stays None); ValueError for a CUDA device without CUDA."""
    if device is None:
        return None
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"make_mlgym: device {device!r} is not a torch device ({err})") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"make_mlgym: device {device!r} asks for CUDA, which is not available on this machine")
    return resolved
