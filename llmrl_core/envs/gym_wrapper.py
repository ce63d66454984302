"""Gymnasium-style text environments as chat environments: :class:`MLGymWrapper` (re-exported by
:mod:`llmrl_core.envs.mlgym`, TorchRL's module name, with :func:`~llmrl_core.envs.mlgym.make_mlgym`).

TorchRL's rows of the same names wrap MLGym (Meta's gym of machine-learning research tasks) for its LLM API.
Here :class:`MLGymWrapper` accepts any object with the text flavour of Gymnasium's interface —
``reset(seed=None, options=None) -> (observation, info)`` and
``step(action: str) -> (observation, reward, terminated, truncated, info)`` — and plays it as a batched
:class:`~llmrl_core.envs.chat_env.ChatEnv`:

* every slot owns one game instance, built by ``env_or_factory`` (a class or a zero-argument callable; a
  single instance is accepted for one slot). ``action_space`` / ``observation_space`` are not used: actions
  and observations are text.
* ``reset()`` resets each slot's game; its observation becomes the slot's user message (after the system
  prompt). A game may set the system message itself by returning ``info["system_prompt"]``.
* ``step(responses)`` passes each assistant message (its text, end-of-turn marker removed) to that slot's
  game as the action; the game's reward is added under the name ``reward_name`` (``"env"``), ``terminated`` /
  ``truncated`` end the slot, ``info`` is merged into ``slot.info`` (the latest observation is kept under
  ``info["observation"]``) and, while the episode goes on, the observation becomes the next message with role
  ``observation_role`` (``"user"``). The observation that ends an episode is not added to the conversation
  (nothing answers it); it stays in ``info["observation"]``.
* seeds: slot copies of one game (``repeats`` > 1, a GRPO group) share a seed. Game ``k`` of the run — counted
  over resets, so every reset plays new games — gets ``seed + k``; ``reset(seed=s)`` restarts the count from
  ``s``. Rows passed to ``reset`` may carry their own ``seed`` (and ``options`` for the game's reset); rows
  with a ``group_id`` get ``seed + group_id``. ``seed=None`` leaves the games unseeded.
* ``close()`` closes every game.

Observations that are not strings are turned into text: ``None`` -> ``""``, a mapping with an
``"observation"`` entry -> that entry (MLGym's reset returns ``{"observation": None}``), anything else ->
``str(obs)``. A four-tuple ``step`` result ``(obs, reward, done, info)`` (MLGym's, pre-0.26 Gym's) reads as
terminated=done, truncated=False; a bare ``reset`` result reads as ``(obs, {})``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from tensordict import TensorDict, TensorDictBase

from llmrl_core.data.conversation import Message
from llmrl_core.envs.chat_env import ChatEnv, InputMode
from llmrl_core.envs.types import PromptRow, SlotState


class TextGymEnv(Protocol):
    """What :class:`MLGymWrapper` needs from a game: Gymnasium's reset/step with text actions (close optional)."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any: ...

    def step(self, action: str) -> Any: ...


# --- normalising what a game returns -------------------------------------------------------------------------
def observation_text(observation: Any) -> str:
    """A game observation as text (see the module docstring)."""
    if observation is None:
        return ""
    if isinstance(observation, str):
        return observation
    if isinstance(observation, Mapping) and "observation" in observation:
        return observation_text(observation["observation"])
    return str(observation)


def split_reset_result(result: Any) -> tuple[Any, dict[str, Any]]:
    """``(observation, info)`` from a reset result (a bare observation gets an empty info)."""
    if isinstance(result, tuple) and len(result) == 2 and (result[1] is None or isinstance(result[1], Mapping)):
        return result[0], dict(result[1] or {})
    return result, {}


def split_step_result(result: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    """``(observation, reward, terminated, truncated, info)`` from a five- or four-tuple step result."""
    if not isinstance(result, tuple) or len(result) not in (4, 5):
        raise TypeError(
            "a game's step() must return (observation, reward, terminated, truncated, info) or "
            f"(observation, reward, done, info), got {type(result).__name__}"
        )
    if len(result) == 5:
        observation, reward, terminated, truncated, info = result
    else:
        observation, reward, terminated, info = result
        truncated = False
    return observation, float(reward or 0.0), bool(terminated), bool(truncated), dict(info or {})


def _is_factory(obj: Any) -> bool:
    if isinstance(obj, type):
        return True
    return callable(obj) and not (hasattr(obj, "reset") and hasattr(obj, "step"))


# --- the games ----------------------------------------------------------------------------------------------
class TextGames:
    """Owns one Gymnasium-style text game per slot and plays it: the dynamics of :class:`MLGymWrapper` (its
    ``_start_episodes`` / ``_answer_turns``, which run before the env's transforms).

    :meth:`provide_prompts` makes the placeholder rows of a reset without prompts (``games`` games x ``repeats``
    copies, copies adjacent and sharing a ``group_id``); :meth:`start` resets the games and writes their
    observations as the user messages; :meth:`play` plays the assistant messages (see the module docstring).
    Its state (seed, games started) is part of ``env.state_dict()``, so a resumed run plays new games.
    """

    def __init__(
        self,
        env_or_factory: Any,
        *,
        games: int = 1,
        repeats: int = 1,
        seed: int | None = 0,
        observation_role: str = "user",
        reward_name: str = "env",
    ) -> None:
        if games < 1 or repeats < 1:
            raise ValueError(f"games and repeats must be >= 1, got games={games}, repeats={repeats}")
        if _is_factory(env_or_factory):
            self.factory: Callable[[], Any] | None = env_or_factory
            self.envs: list[Any] = []
        elif hasattr(env_or_factory, "reset") and hasattr(env_or_factory, "step"):
            if games * repeats != 1:
                raise ValueError(
                    "one game instance can play one slot: pass a factory (the game's class or a zero-argument "
                    f"callable) for {games * repeats} slots"
                )
            self.factory = None
            self.envs = [env_or_factory]
        else:
            raise TypeError(
                "env_or_factory must be a Gymnasium-style text env (reset/step) or a callable building one, "
                f"got {type(env_or_factory).__name__}"
            )
        self.games = games
        self.repeats = repeats
        self.seed = seed
        self.observation_role = observation_role
        self.reward_name = reward_name
        self.games_started = 0
        self._lock = threading.Lock()

    # --- games -----------------------------------------------------------------------------------
    def env_for(self, index: int) -> Any:
        """The game of slot ``index`` (built on first use)."""
        with self._lock:
            while len(self.envs) <= index:
                if self.factory is None:
                    raise ValueError(
                        f"slot {index}: one game instance can play one slot; pass a factory for more slots"
                    )
                self.envs.append(self.factory())
            return self.envs[index]

    def restart(self, seed: int | None) -> None:
        """Seed the following games from ``seed`` (game k gets ``seed + k``), counting from game 0 again."""
        self.seed = seed
        self.games_started = 0

    # --- reset -----------------------------------------------------------------------------------
    def provide_prompts(self, data_key: str) -> list[PromptRow]:
        """Placeholder rows (the games write the user messages): one group of ``repeats`` slots per game.

        The games are counted as started when their rows are handed out, so rows a partial reset keeps for
        later never share a game with rows drawn after them.
        """
        first = self.games_started
        self.games_started += self.games
        return [
            PromptRow(data={data_key: ""}, prompt_id=None, group_id=first + game, sample_index=copy)
            for game in range(self.games)
            for copy in range(self.repeats)
        ]

    def _slot_seed(self, slot: SlotState, first_game: int) -> tuple[int | None, int]:
        game = slot.group_id if isinstance(slot.group_id, int) else first_game + slot.index
        if "seed" in slot.data:
            return slot.data["seed"], game
        return (None if self.seed is None else self.seed + game), game

    def start(self, env: ChatEnv, slots: list[SlotState]) -> None:
        """Reset every slot's game and make its observation the slot's user message."""
        user_role, system_role = env.user_role, env.system_role
        first_game = self.games_started
        last_game = first_game - 1
        for slot in slots:
            seed, game = self._slot_seed(slot, first_game)
            last_game = max(last_game, game)
            game_env = self.env_for(slot.index)
            options = slot.data.get("options")
            result = game_env.reset(seed=seed, options=options) if options is not None else game_env.reset(seed=seed)
            observation, info = split_reset_result(result)
            text = observation_text(observation)
            message = slot.last_message(user_role)
            if message is None:
                slot.add_message(user_role, text)
            else:
                message.content = text
            system_prompt = info.pop("system_prompt", None)
            if isinstance(system_prompt, str):
                if slot.history.messages and slot.history[0].role == system_role:
                    slot.history[0].content = system_prompt
                else:
                    slot.history.messages.insert(0, Message(system_role, system_prompt))
            slot.data["seed"] = seed
            if slot.prompt_id is None:
                slot.prompt_id = seed if seed is not None else game
            slot.info.update(info)
            slot.info["observation"] = text
        self.games_started = max(self.games_started, last_game + 1)

    # --- step ------------------------------------------------------------------------------------
    def play(self, env: ChatEnv, slots: list[SlotState]) -> None:
        """Play each active slot's assistant message in its game."""
        policy_role, max_turns = env.policy_role, env.max_turns
        for slot in slots:
            message = slot.last_message(policy_role)
            action = message.text if message is not None else ""
            observation, reward, terminated, truncated, info = split_step_result(self.env_for(slot.index).step(action))
            text = observation_text(observation)
            slot.add_reward(reward, name=self.reward_name)
            info.pop("system_prompt", None)
            slot.info.update(info)
            slot.info["observation"] = text
            if terminated:
                slot.terminate()
            if truncated:
                slot.truncate()
            turn_limit = max_turns is not None and slot.turn >= max_turns
            if not slot.done and not turn_limit:
                slot.add_message(self.observation_role, text)

    # --- state / close ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The seed and the number of games started (so a restored env plays new games)."""
        return {"seed": self.seed, "games_started": self.games_started}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.seed = state.get("seed", self.seed)
        self.games_started = int(state.get("games_started", 0))

    def close(self) -> None:
        """Close every game (those built by the factory are built again on the next reset)."""
        with self._lock:
            envs = list(self.envs)
            if self.factory is not None:
                self.envs = []
        for env in envs:
            close = getattr(env, "close", None)
            if callable(close):
                close()

    def __repr__(self) -> str:
        factory = getattr(self.factory, "func", self.factory)  # a functools.partial shows its function
        source = getattr(factory, "__name__", type(factory).__name__) if factory is not None else self.envs[0]
        return f"{type(self).__name__}({source}, games={self.games}, repeats={self.repeats}, seed={self.seed})"


# --- the env -------------------------------------------------------------------------------------------------
class MLGymWrapper(ChatEnv):
    """A Gymnasium-style text environment (MLGym's, or any with text reset/step) as a batched ChatEnv.

    ``batch_size`` games per reset, ``repeats`` slots per game (B = batch_size x repeats); see the module
    docstring for how observations, actions, rewards, episode ends and seeds map onto the chat. Transforms
    (reward parsers, tools) can be appended: the games are the env's own dynamics, so they always run first.
    """

    own_reward_shape = (1,)  # the games reward every step: a TensorDict step's "next" data carries ``reward``

    def __init__(
        self,
        env_or_factory: Any,
        *,
        tokenizer: Any = None,
        input_mode: InputMode = "history",
        system_prompt: str | None = None,
        max_turns: int | None = None,
        batch_size: int = 1,
        repeats: int = 1,
        seed: int | None = 0,
        observation_role: str = "user",
        reward_name: str = "env",
        template_kwargs: dict[str, Any] | None = None,
        chat_template_name: str | None = None,
        system_role: str = "system",
        user_role: str = "user",
        policy_role: str = "assistant",
        data_key: str = "query",
    ) -> None:
        if batch_size < 1 or repeats < 1:
            raise ValueError(f"batch_size and repeats must be >= 1, got batch_size={batch_size}, repeats={repeats}")
        super().__init__(
            batch_size=batch_size * repeats,
            system_prompt=system_prompt,
            tokenizer=tokenizer,
            input_mode=input_mode,
            template_kwargs=template_kwargs,
            chat_template_name=chat_template_name,
            system_role=system_role,
            user_role=user_role,
            policy_role=policy_role,
            data_key=data_key,
            max_turns=max_turns,
        )
        self.game = TextGames(
            env_or_factory,
            games=batch_size,
            repeats=repeats,
            seed=seed,
            observation_role=observation_role,
            reward_name=reward_name,
        )

    @property
    def gym_envs(self) -> list[Any]:
        """The game instances, by slot (built on the first reset)."""
        return self.game.envs

    def reset(
        self, prompts: Sequence[Any] | TensorDictBase | None = None, *, seed: int | None = None
    ) -> TensorDictBase:
        """Start new games, answered as :meth:`ChatEnv.reset` answers (TorchRL's layout for ``reset()`` or a
        TensorDict; with llmrl's per-row entries for a list). ``seed`` restarts the seed count (game k gets
        ``seed + k``); ``prompts`` optionally gives one row per slot (a dict or :class:`PromptRow`: ``seed`` /
        ``options`` for the game's reset, and ``group_id`` / ``sample_index``); by default ``batch_size`` games x
        ``repeats`` copies are played."""
        self._restart_seed(seed)
        return super().reset(prompts)

    def reset_batch(self, prompts: Sequence[Any] | None = None, *, seed: int | None = None) -> TensorDict:
        """:meth:`reset` as llmrl's list call: the new games as :meth:`ChatEnv.reset_batch` answers them."""
        self._restart_seed(seed)
        return super().reset_batch(prompts)

    def _restart_seed(self, seed: int | None) -> None:
        if seed is not None:
            self.set_seed(seed)  # also drops prompt rows a partial reset kept from the old count

    # --- the games as the env's dynamics ---------------------------------------------------------
    def _start_episodes(self, slots: list[SlotState]) -> None:
        self.game.start(self, slots)

    def _answer_turns(self, slots: list[SlotState]) -> None:
        self.game.play(self, slots)

    def _provided_rows(self, caller: str) -> list[Any]:
        return list(self.game.provide_prompts(self.data_key))

    def set_seed(self, seed: int | None = None) -> int:
        """Seed the games: game k of the following resets gets ``seed + k`` (see the module docstring)."""
        seed = super().set_seed(seed)
        self.game.restart(seed)
        return seed

    def state_dict(self) -> dict[str, Any]:
        """The env's state with the games' (seed, games started): a restored env plays new games."""
        return {**super().state_dict(), "games": self.game.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (a state saved when the games were the env's first transform too)."""
        state = dict(state)
        games = state.pop("games", None)
        older = state.get("transforms") or []
        if games is None and older:  # saved when the games were a slot transform: its entry came first
            games, state["transforms"] = older[0], older[1:]
        super().load_state_dict(state)
        if games is not None:
            self.game.load_state_dict(games)

    def close(self) -> None:
        """Close every game, then what the transforms hold."""
        self.game.close()
        super().close()

    def _collect_prompts(self, prompts: Sequence[Any] | None) -> list[PromptRow]:
        if prompts is None:
            return super()._collect_prompts(None)
        items = [prompts] if isinstance(prompts, Mapping | PromptRow) else list(prompts)
        rows = [self._as_row(item, index) for index, item in enumerate(items)]
        if not rows:
            raise ValueError("reset() got an empty batch of prompts")
        return rows  # any number of rows: the games are built per slot

    def _as_row(self, item: Any, index: int) -> PromptRow:
        """A prompt row for a game: a dict (``seed``, ``options``, ``id``, ``group_id``, ``sample_index``) or a
        PromptRow; the user message is a placeholder the game's observation replaces."""
        if isinstance(item, PromptRow):
            row = PromptRow(dict(item.data), item.prompt_id, item.group_id, item.sample_index)
        elif isinstance(item, Mapping):
            row = PromptRow(dict(item), item.get("id"), item.get("group_id"), int(item.get("sample_index", 0)))
        else:
            raise TypeError(
                f"reset(): prompt {index} must be a dict or PromptRow (the game writes the user message), "
                f"got {type(item).__name__}"
            )
        row.data.setdefault(self.data_key, "")
        return row

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.game!r}, input_mode={self.input_mode!r}, max_turns={self.max_turns}, "
            f"transforms={self.td_transforms})"
        )
