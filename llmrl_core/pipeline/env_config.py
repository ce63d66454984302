"""``EnvConfig``: the ``env`` section of a run — which chat environment the rollout workers build, with which
tools, transforms and reward functions — and :func:`build_env`, which builds it on a worker.

Three ways to name an environment, all checked by :func:`validate_env_config` before any engine starts:

- a built-in ``name`` (:data:`BUILTIN_ENVS`): ``gsm8k`` / ``arithmetic`` (answer-tag reward; the prompt format
  and reward values come from the run's ``task`` section), their tool-using variants ``gsm8k_python`` /
  ``arithmetic_python`` (sandboxed Python interpreter) and ``arithmetic_mcp`` (the shipped MCP calculator
  server), ``ifeval`` (IFEval's 25 instruction checkers), ``guess_number`` (a Gymnasium-style text game
  through :class:`~llmrl_core.envs.gym_wrapper.MLGymWrapper`) and ``reasoning_gym`` (any dataset of the optional
  ``reasoning-gym`` package, named with its config in ``args``: ``{dataset: chain_sum, config: {...}}``; its own
  ``score_answer`` pays, see :class:`~llmrl_core.envs.reasoning_gym_env.ReasoningGymEnv`) and ``countdown`` (the
  numbers game, :class:`~llmrl_core.envs.countdown.CountdownEnv`: an arithmetic expression checked against the
  problem's numbers and target; ``args`` sizes the problems: ``{num_count: 3, max_number: 20}``);
- ``factory: "my_pkg.my_module:make_env"``: any importable function returning a
  :class:`~llmrl_core.envs.chat_env.ChatEnv` (with its transforms), called as
  ``factory(tokenizer=..., input_mode=..., **options)``;
- on top of either, ``transforms`` (a list of ``{name: {options}}``: :data:`TRANSFORMS`, or ``module:Class``
  naming your own TorchRL ``Transform`` subclass) appends tools and transforms, and ``rewards`` adds reward
  functions named ``module:function`` with weights. A reward function
  takes ``(prompt, completion, row)`` — the text of the user message the episode answers (not a few-shot
  example's), the episode's last assistant message and the prompt row's fields — and returns a float; TRL
  users know the convention. It is called once per episode, when the episode ends; its weighted value is
  added to the reward and kept under its ``name`` in ``reward_components``. ``env_reward: false`` drops the
  environment's own reward (the episode still ends where the env says). A function that raises or returns
  anything but a finite number stops the run with one line naming it and the row (``reward_errors: raise``, the
  default); ``reward_errors: skip`` fails that episode alone (counted as ``reward_errors``, not trained on).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from llmrl_core.data.chat_templates import MODEL_TEMPLATE
from llmrl_core.pipeline.config_types import AtLeast1
from llmrl_core.pipeline.reward_functions import RewardFunctionConfig, RewardFunctions
from llmrl_core.user_code import UserCodeError, import_object

SINGLE_TURN = ("gsm8k", "arithmetic")
PYTHON_TOOL = ("gsm8k_python", "arithmetic_python")
BUILTIN_ENVS: tuple[str, ...] = (
    *SINGLE_TURN,
    *PYTHON_TOOL,
    "arithmetic_mcp",
    "ifeval",
    "guess_number",
    "reasoning_gym",
    "countdown",
)
TOOL_MAX_TURNS = 3

PYTHON_TOOL_PROMPT = (
    "You can run Python: put code in a ```python block and you will get what it prints. "
    "When you know the result, give it as <answer>NUMBER</answer>."
)
MCP_TOOL_PROMPT = (
    'You can call a calculator: write <tool_call>{{"name": "calc.evaluate", "arguments": {{"expression": "2*3"}}}}'
    "</tool_call> and you will get the result. When you know the result, give it as <answer>NUMBER</answer>."
)


@dataclass
class EnvConfig:
    """The rollout environment: a built-in ``name`` or a ``factory``, extra ``transforms`` and ``rewards``."""

    name: str = "gsm8k"
    factory: str | None = None  # "module:function" returning a ChatEnv; wins over name
    options: dict[str, Any] = field(default_factory=dict)  # keyword options of the factory / built-in
    args: dict[str, Any] = field(default_factory=dict)  # another name for options (reasoning_gym's spelling)
    # [{python_interpreter: {timeout: 5}}, {"my_module:MyTransform": {option: 1}}, ...]: built-ins or your own
    transforms: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[RewardFunctionConfig] = field(default_factory=list)
    env_reward: bool = True  # also pay the env's own reward (the task's answer check)
    max_turns: AtLeast1 | None = None  # None: 1 for single-turn envs, 3 for the tool variants
    query_field: str | None = None  # the data row field holding the prompt (default: question; ifeval: prompt)
    agent: str | None = None  # "module:function": an OpenAI-API agent (docs/agents.md); the env name is then unused
    # {id: <installed verifiers env id>, args: {...}}: the env's own rollout through the agent route (docs/verifiers.md)
    verifiers: dict[str, Any] = field(default_factory=dict)  # empty: not this route
    # a reward function that raises or returns a non-number: stop the run (raise), or fail that episode alone (skip)
    reward_errors: Literal["raise", "skip"] = "raise"

    def __post_init__(self) -> None:
        if self.verifiers:
            self._verifiers_route()
        elif self.agent is not None:
            from llmrl_core.agents.loading import check_agent_env

            check_agent_env(self)  # importable, takes (row, client), no env-only setting beside it
        if self.args:  # one mechanism: args is options under the name the ecosystem's env configs use
            if self.options and self.options != self.args:
                raise ValueError("env.args and env.options are the same setting: give one of them")
            self.options, self.args = dict(self.args), {}
        if self.factory is None and self.name not in BUILTIN_ENVS:
            raise ValueError(f"env.name must be one of {list(BUILTIN_ENVS)} (or set env.factory), got {self.name!r}")
        if not self.env_reward and not self.rewards:
            raise ValueError("env.env_reward is false but env.rewards is empty: nothing would pay")

    def _verifiers_route(self) -> None:
        """``env.verifiers`` is an agent (the env's own rollout against the endpoint) whose rows come from the env's
        datasets: its spec goes into ``options`` (where the ``verifiers:`` sources read it), the agent is set."""
        from llmrl_core.agents.verifiers_agent import AGENT_PATH
        from llmrl_core.builtin_data.verifiers_data import VerifiersSpec

        spec = VerifiersSpec.from_config(self.verifiers)
        if self.agent not in (None, AGENT_PATH):
            raise ValueError("env.verifiers and env.agent are two routes: unset one of them")
        for key in ("factory", "transforms", "rewards", "args"):
            if getattr(self, key, None):
                raise ValueError(f"env.{key} does not apply with env.verifiers (the environment brings its own)")
        if self.options and self.options != {"verifiers": {"id": spec.id, "args": dict(spec.args)}}:
            raise ValueError("env.options does not apply with env.verifiers: give the arguments as env.verifiers.args")
        self.verifiers = {"id": spec.id, "args": dict(spec.args)}
        self.options = {"verifiers": dict(self.verifiers)}
        self.agent = AGENT_PATH

    @property
    def prompt_field(self) -> str:
        """The field of a data row that becomes the user's message."""
        if self.query_field:
            return self.query_field
        return "prompt" if self.factory is None and self.name == "ifeval" else "question"


# --- resolving names ---------------------------------------------------------------------------------------
TRANSFORMS: dict[str, str] = {  # config name -> the transform class (imported when used)
    "python_interpreter": "llmrl_core.tools.python_interpreter:PythonInterpreter",
    "mcp": "llmrl_core.tools.mcp_transform:MCPToolTransform",
    "few_shot": "llmrl_core.envs.transforms.few_shot:FewShotExamples",
    "add_thinking_prompt": "llmrl_core.envs.transforms.thinking:AddThinkingPrompt",
    "browser": "llmrl_core.tools.browser:BrowserTransform",
}


def _transform_class(name: str) -> Any:
    """The class behind a transform name (for checking options without constructing it): a built-in's, or a user's
    ``module:Class`` (a subclass of TorchRL's env ``Transform``)."""
    if ":" in name:
        from llmrl_core.envs.transforms.td_base import Transform

        cls = import_object(name, f"env.transforms.{name}")
        if not (isinstance(cls, type) and issubclass(cls, Transform)):
            raise ValueError(f"env.transforms: {name!r} must name a subclass of llmrl_core.envs.Transform")
        return cls
    return import_object(TRANSFORMS[name], f"env.transforms.{name}")


def make_transform(name: str, **options: Any) -> Any:
    """Build transform ``name`` from config options, filling what a config cannot hold or may leave out."""
    if name == "mcp":
        options["servers"] = dict(options.get("servers") or calculator_servers())
    elif name == "few_shot":
        options["examples"] = list(options.get("examples") or [])
    elif name == "add_thinking_prompt":
        options.setdefault("cond", lambda td: True)  # a config cannot hold a callable: think on every turn
    return _transform_class(name)(**options)


def calculator_servers() -> dict[str, Any]:
    """The shipped MCP calculator server, started over stdio by the worker that uses it."""
    return {"calc": {"command": sys.executable, "args": ["-m", "llmrl_core.tools.servers.calculator"]}}


def _transform_items(cfg: EnvConfig) -> list[tuple[str, dict[str, Any]]]:
    items = []
    for index, entry in enumerate(cfg.transforms):
        where = f"env.transforms[{index}]"
        if not isinstance(entry, Mapping) or len(entry) != 1:
            raise ValueError(f"{where}: expected one {{name: options}} mapping, got {entry!r}")
        ((name, options),) = entry.items()
        if name not in TRANSFORMS and ":" not in name:
            raise ValueError(
                f"{where}: unknown transform {name!r}; known: {sorted(TRANSFORMS)}, or 'module:Class' (your own)"
            )
        if name == "few_shot" and isinstance(options, list):
            options = {"examples": options}
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ValueError(f"{where}.{name}: options must be a mapping, got {options!r}")
        if name == "add_thinking_prompt" and options.get("edit_last_turn", True):
            raise ValueError(
                f"{where}.{name}: the flows run the env in tokens mode (the sampled ids are kept), where the answer "
                "cannot be rewritten: set edit_last_turn: false and role: user (the prompt follows the answer)"
            )
        items.append((name, dict(options)))
    return items


def _check_options(target: Any, options: Mapping[str, Any], where: str) -> None:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        return
    unknown = sorted(set(options) - set(signature.parameters))
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {unknown}; valid: {sorted(signature.parameters)}")
    _check_option_types(target, options, where)


def _check_option_types(target: Any, options: Mapping[str, Any], where: str) -> None:
    """Each option's value fits its parameter's annotation (pydantic's lax validation: ``5`` for a float passes,
    ``"abc"`` does not), so a wrong type is named here rather than as a TypeError on a worker; parameters whose
    annotations cannot be resolved or checked are left to the class."""
    import typing

    from pydantic import ConfigDict, TypeAdapter, ValidationError

    try:
        hints = typing.get_type_hints(target.__init__ if isinstance(target, type) else target)
    except Exception:  # an annotation that names what this process cannot import
        return
    for name, value in options.items():
        if name not in hints:
            continue
        try:
            adapter = TypeAdapter(hints[name], config=ConfigDict(arbitrary_types_allowed=True))
        except Exception:  # a type pydantic has no schema for
            continue
        try:
            adapter.validate_python(value)
        except ValidationError as err:
            reason = err.errors()[0]["msg"] if err.errors() else str(err)
            raise ValueError(f"{where}.{name}={value!r}: {reason}") from None


def validate_env_config(cfg: EnvConfig) -> None:
    """Check names, import paths and option names without building anything (raises ValueError naming the key)."""
    if cfg.verifiers:  # loads the env: an unknown id or arguments it refuses are said here
        from llmrl_core.builtin_data.verifiers_data import VerifiersSpec, load_env

        load_env(VerifiersSpec.from_config(cfg.verifiers))
    elif cfg.factory is not None:
        _check_options(import_object(cfg.factory, "env.factory"), cfg.options, "env.options")
    elif cfg.name == "reasoning_gym":
        from llmrl_core.builtin_data.reasoning_gym_data import ReasoningGymSpec

        ReasoningGymSpec.from_options(cfg.options).validate()
    elif cfg.name == "countdown":
        from llmrl_core.builtin_data.countdown_data import countdown_options

        countdown_options(cfg.options)
    elif cfg.name == "guess_number":
        from llmrl_core.envs.gym_wrapper import MLGymWrapper
        from llmrl_core.envs.text_games import GuessNumberEnv

        valid = set(inspect.signature(GuessNumberEnv).parameters) | set(inspect.signature(MLGymWrapper).parameters)
        unknown = sorted(set(cfg.options) - valid)
        if unknown:
            raise ValueError(f"env.options: unknown option(s) {unknown} for guess_number; valid: {sorted(valid)}")
    for name, options in _transform_items(cfg):
        _check_options(_transform_class(name), options, f"env.transforms.{name}")
        if name == "mcp":
            _check_mcp_servers(options.get("servers") or {})
    for index, spec in enumerate(cfg.rewards):
        fn = import_object(spec.function, f"env.rewards[{index}].function")
        try:
            inspect.signature(fn).bind("prompt", "completion", {})
        except TypeError as err:
            raise ValueError(
                f"env.rewards[{index}].function {spec.function!r} must accept (prompt, completion, row): {err}"
            ) from err


def _check_mcp_servers(servers: Mapping[str, Any]) -> None:
    """Each MCP server's entry, and the command of a stdio server: it must exist here (each worker starts it), so a
    typo is said before the engines start rather than as the first rollout's traceback."""
    import shutil

    from llmrl_core.tools.mcp_client import MCPServerSpec

    if not isinstance(servers, Mapping):
        raise ValueError(f"env.transforms.mcp.servers: expected {{name: {{command, args}}}}, got {servers!r}")
    for name, entry in servers.items():
        try:
            spec = MCPServerSpec.from_config(str(name), entry)
        except (TypeError, ValueError) as err:
            raise ValueError(f"env.transforms.mcp.servers: {err}") from err
        if spec.command is not None and shutil.which(spec.command) is None:
            raise ValueError(
                f"env.transforms.mcp.servers.{name}.command: {spec.command!r} is not an executable here (no such "
                "file, or not on PATH)"
            )


# --- building ----------------------------------------------------------------------------------------------
def _builtin_env(cfg: EnvConfig, task: Any, tokenizer: Any, input_mode: str, max_turns: int) -> Any:
    # the built-in envs render with the model's own chat template (a ChatEnv's default is TorchRL's choice)
    options = {"chat_template_name": MODEL_TEMPLATE, **cfg.options}
    if cfg.name == "ifeval":
        from llmrl_core.envs.ifeval import IFEvalEnv

        return IFEvalEnv(
            None, shuffle=False, tokenizer=tokenizer, input_mode=input_mode, max_turns=max_turns, **options
        )
    if cfg.name == "reasoning_gym":
        from llmrl_core.envs.reasoning_gym_env import ReasoningGymEnv

        return ReasoningGymEnv(
            options.pop("dataset"),
            **options,
            shuffle=False,
            tokenizer=tokenizer,
            input_mode=input_mode,
            max_turns=max_turns,
            system_prompt=task.system_prompt,
            question_template=task.question_template,
            few_shot=task.few_shot,
            format_reward=task.format_reward,
            correct_reward=task.correct_reward,
        )
    if cfg.name == "countdown":
        from llmrl_core.builtin_data.countdown_data import countdown_options
        from llmrl_core.envs.countdown import CountdownEnv

        return CountdownEnv(  # its own problem stream is unused: callers pass the countdown:train rows to reset()
            **countdown_options(cfg.options),
            tokenizer=tokenizer,
            input_mode=input_mode,  # type: ignore[arg-type]
            max_steps=max_turns,
            system_prompt=task.system_prompt,
            format_reward=task.format_reward,
            correct_reward=task.correct_reward,
            chat_template_name=options["chat_template_name"],
        )
    if cfg.name == "guess_number":
        from llmrl_core.envs.text_games import make_guess_number_env

        return make_guess_number_env(tokenizer=tokenizer, input_mode=input_mode, max_turns=max_turns, **options)
    from llmrl_core.envs.gsm8k import GSM8KEnv

    system_prompt = task.system_prompt
    if cfg.name in PYTHON_TOOL:
        system_prompt = f"{system_prompt}\n{PYTHON_TOOL_PROMPT}" if system_prompt else PYTHON_TOOL_PROMPT
    elif cfg.name == "arithmetic_mcp":
        system_prompt = f"{system_prompt}\n{MCP_TOOL_PROMPT}" if system_prompt else MCP_TOOL_PROMPT
    env = GSM8KEnv(
        None,  # the env's own primer (shipped GSM8K) is unused: callers pass their rows to reset()
        batch_size=1,
        shuffle=False,
        tokenizer=tokenizer,
        input_mode=input_mode,  # type: ignore[arg-type]
        system_prompt=system_prompt,
        question_template=task.question_template,
        few_shot=task.few_shot,
        format_reward=task.format_reward,
        correct_reward=task.correct_reward,
        max_turns=max_turns,
        **options,
    )
    if cfg.name in PYTHON_TOOL:
        env.append_transform(make_transform("python_interpreter", timeout=5.0))
    elif cfg.name == "arithmetic_mcp":
        env.append_transform(make_transform("mcp"))
    return env


def default_max_turns(cfg: EnvConfig) -> int:
    """``env.max_turns``, or the env's natural default (1, or 3 for tool-using and game envs)."""
    if cfg.max_turns is not None:
        return cfg.max_turns
    if cfg.factory is None and (cfg.name in (*PYTHON_TOOL, "arithmetic_mcp", "guess_number")):
        return TOOL_MAX_TURNS if cfg.name != "guess_number" else 6
    return 1


class EnvFactoryError(UserCodeError):
    """The run's ``env.factory`` raised, or returned something the flows cannot drive; the message names the
    setting and what went wrong (the command line prints it in one line)."""


def build_env(cfg: EnvConfig, task: Any, tokenizer: Any, *, input_mode: str = "tokens") -> Any:
    """Build the run's env on this worker: built-in or factory, then transforms, then reward functions."""
    from llmrl_core.envs.chat_env import ChatEnv

    max_turns = default_max_turns(cfg)
    if cfg.factory is not None:
        factory = import_object(cfg.factory, "env.factory")
        kwargs = dict(cfg.options)
        accepted = inspect.signature(factory).parameters
        for key, value in (("tokenizer", tokenizer), ("input_mode", input_mode), ("max_turns", cfg.max_turns)):
            if value is not None and (key in accepted or any(p.kind is p.VAR_KEYWORD for p in accepted.values())):
                kwargs.setdefault(key, value)
        try:
            env = factory(**kwargs)
        except Exception as err:  # the user's code: one line naming the setting (the run's log keeps the traceback)
            raise EnvFactoryError(f"env.factory {cfg.factory!r} raised {type(err).__name__}: {err}") from err
        if not isinstance(env, ChatEnv):
            raise EnvFactoryError(f"env.factory {cfg.factory!r} returned {type(env).__name__}, expected a ChatEnv")
        if env.input_mode != input_mode:
            raise EnvFactoryError(
                f"env.factory {cfg.factory!r}: the env is in {env.input_mode!r} mode, need {input_mode!r}"
            )
        if cfg.max_turns is not None:
            env.max_turns = cfg.max_turns
    else:
        env = _builtin_env(cfg, task, tokenizer, input_mode, max_turns)
    for name, options in _transform_items(cfg):
        env.append_transform(make_transform(name, **options))
    if cfg.rewards:
        env.append_transform(RewardFunctions(cfg.rewards, keep_env_reward=cfg.env_reward, on_error=cfg.reward_errors))
    return env
