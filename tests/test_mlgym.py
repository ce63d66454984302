"""MLGymWrapper / make_mlgym and the shipped GuessNumberEnv: games as multi-turn chat environments."""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from llmrl_core.envs import ChatEnv, MLGymWrapper, PromptRow, make_mlgym
from llmrl_core.envs.mlgym import mlgym_score_reward
from llmrl_core.envs.tensordict_io import active_rows
from llmrl_core.envs.text_games import GuessNumberEnv, make_guess_number_env, parse_guess

EOT = "<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


class Bisector:
    """A scripted player: halves each slot's interval from the "Higher." / "Lower." replies."""

    def __init__(self, low: int = 1, high: int = 20, suffix: str = "") -> None:
        self.start = (low, high)
        self.bounds: dict[int, list[int]] = {}
        self.guesses: dict[int, list[int]] = {}
        self.suffix = suffix

    def __call__(self, out) -> list[str | None]:
        actions: list[str | None] = []
        done = out["done"].reshape(-1).tolist()
        for i, history in enumerate(out["history", "prompt"]):
            if done[i]:
                actions.append(None)
                continue
            low, high = self.bounds.setdefault(i, list(self.start))
            last = history[-1].content
            previous = self.guesses.get(i, [])
            if previous and last.startswith("Higher."):
                low = previous[-1] + 1
            elif previous and last.startswith("Lower."):
                high = previous[-1] - 1
            self.bounds[i] = [low, high]
            guess = (low + high) // 2
            self.guesses.setdefault(i, []).append(guess)
            actions.append(f"Let me halve the range.<answer>{guess}</answer>{self.suffix}")
        return actions


def play(env: ChatEnv, policy, **reset_kwargs):
    """Run one batch of episodes; returns every answer TensorDict (the reset's first), each with its histories as
    they were then (``("history", "prompt")`` is a copy: the env keeps changing its own conversations)."""
    outputs = [env.reset_batch(**reset_kwargs)]
    while active_rows(outputs[-1]):
        outputs.append(env.step(policy(outputs[-1])))
    return outputs


# --- the game ------------------------------------------------------------------------------------------------
def test_guess_number_env_rules():
    game = GuessNumberEnv(low=1, high=20, max_guesses=3)
    text, info = game.reset(seed=4)
    assert "from 1 to 20" in text and "<answer>" in text and info == {"guesses_left": 3}
    secret = game.secret
    assert GuessNumberEnv(max_guesses=3).reset(seed=4)[0] == text
    again = GuessNumberEnv(low=1, high=20)
    again.reset(seed=4)
    assert again.secret == secret  # deterministic given the seed
    wrong = secret + 1 if secret < 20 else secret - 1
    obs, reward, terminated, truncated, info = game.step(f"I think <answer>{wrong}</answer>")
    assert obs.startswith("Lower." if wrong > secret else "Higher.") and "2 guesses left" in obs
    assert (reward, terminated, truncated) == (0.0, False, False) and info["guess"] == wrong
    obs, reward, terminated, truncated, info = game.step("no idea")
    assert obs.startswith("I could not find a number") and reward == 0.0 and info["guess"] is None
    assert not terminated and not truncated and info["guesses_left"] == 1
    obs, reward, terminated, truncated, info = game.step(f"{secret}")
    assert obs == f"Correct! My number was {secret}." and (reward, terminated, truncated) == (1.0, True, False)
    assert info["solved"] and info["secret"] == secret
    with pytest.raises(RuntimeError, match="call reset"):
        game.step("1")
    game.reset(options={"secret": 7})
    for _ in range(2):
        assert game.step("<answer>1</answer>")[3] is False
    obs, reward, terminated, truncated, info = game.step("<answer>1</answer>")
    assert truncated and not terminated and reward == 0.0 and "my number was 7" in obs
    assert parse_guess("3 then 5") == 5 and parse_guess("<answer>x 12</answer> 9") == 12
    assert parse_guess("<answer>-4</answer>") == -4 and parse_guess("<answer>none</answer> 3") is None
    with pytest.raises(ValueError, match="low"):
        GuessNumberEnv(low=5, high=1)


# --- the wrapper with a scripted policy ----------------------------------------------------------------------
def test_observations_become_user_messages_and_rewards_end_slots():
    env = make_guess_number_env(batch_size=3, max_guesses=5, chat_template_name="chatml", system_prompt="Play.")
    player = Bisector()
    outputs = play(env, player)
    first = outputs[0]
    assert [h.role for h in first["history", "prompt"]] == [["system", "user"]] * 3
    instructions = GuessNumberEnv(max_guesses=5).instructions()
    assert all(h[1].content == instructions for h in first["history", "prompt"])
    assert first["reward"].reshape(-1).tolist() == [0.0] * 3 and active_rows(first) == [0, 1, 2]
    final = outputs[-1]
    # bisection over 1..20 always wins within 5 guesses: every slot terminated with reward 1
    assert final["terminated"].reshape(-1).tolist() == [True] * 3 and not final["truncated"].any()
    for i, game in enumerate(env.gym_envs):
        history = final["history", "prompt"][i]
        turns = len(player.guesses[i])
        assert final["turn"][i] == turns and player.guesses[i][-1] == game.secret
        # user, (assistant, user)*, assistant: every game reply except the last one is a user message
        assert history.role == ["system", "user"] + ["assistant", "user"] * (turns - 1) + ["assistant"]
        for k, guess in enumerate(player.guesses[i][:-1]):
            reply = history[3 + 2 * k].content
            assert reply.startswith("Higher." if guess < game.secret else "Lower.")
            assert reply.endswith(f"{5 - k - 1} guess{'es' if 5 - k - 1 != 1 else ''} left.")
        step_rewards = [out["reward"][i].item() for out in outputs[1:] if out["turn"][i] <= turns]
        assert env.slots[i].episode_reward == 1.0 and sum(step_rewards) == 1.0
        assert final["info"][i]["solved"] and final["info"][i]["secret"] == game.secret
        assert final["info"][i]["observation"] == f"Correct! My number was {game.secret}."
    solved_at = {i: len(player.guesses[i]) for i in range(3)}
    for out in outputs[1:]:
        for i in range(3):
            if out["turn"][i] == solved_at[i] and out["reward_components"][i]:
                assert out["reward_components"][i] == {"env": 1.0} and out["done"][i].item()


def test_truncation_by_the_game_and_by_max_turns():
    env = make_guess_number_env(batch_size=2, max_guesses=3, chat_template_name="chatml")
    outputs = play(
        env, lambda out: [None if d else "I will not say a number." for d in out["done"].reshape(-1).tolist()]
    )
    final = outputs[-1]
    assert final["truncated"].reshape(-1).tolist() == [True, True] and not final["terminated"].any()
    assert final["turn"].tolist() == [3, 3] and [s.episode_reward for s in env.slots] == [0.0, 0.0]
    assert all(h.role[-1] == "assistant" for h in final["history", "prompt"])  # the closing reply is not a prompt
    assert all("No guesses left" in info["observation"] for info in final["info"])
    assert outputs[1]["history", "prompt"][0][-1].content.startswith("I could not find a number")
    # the env's own turn limit comes first: no dangling user message either
    env = make_guess_number_env(batch_size=1, max_guesses=5, max_turns=2, chat_template_name="chatml")
    final = play(env, lambda out: ["<answer>50</answer>"])[-1]
    assert final["truncated"].reshape(-1).tolist() == [True] and final["turn"].tolist() == [2]
    assert final["history", "prompt"][0].role == ["user", "assistant", "user", "assistant"]


def test_seeds_differ_per_slot_and_repeat_across_runs():
    def secrets(env):
        return [g.secret for g in env.gym_envs]

    env = make_guess_number_env(batch_size=3, chat_template_name="chatml")
    out = env.reset_batch()
    assert out["seed"].tolist() == [0, 1, 2] and out["prompt_id"] == [0, 1, 2]
    first = secrets(env)
    assert first == [_secret(s) for s in (0, 1, 2)]
    out = env.reset_batch()  # the next reset plays new games
    assert out["seed"].tolist() == [3, 4, 5] and out["group_id"] == [3, 4, 5]
    assert secrets(env) == [_secret(s) for s in (3, 4, 5)]
    out = env.reset_batch(seed=0)  # reset(seed=...) restarts the count: the same games again
    assert out["seed"].tolist() == [0, 1, 2] and secrets(env) == first
    other = make_guess_number_env(batch_size=3, chat_template_name="chatml")
    other.reset()
    assert secrets(other) == first  # a new env with the same seed plays the same games
    shifted = make_guess_number_env(batch_size=3, seed=100, chat_template_name="chatml")
    assert shifted.reset_batch()["seed"].tolist() == [100, 101, 102]
    # GRPO groups: the copies of one game share seed, secret and group id
    grouped = make_guess_number_env(batch_size=2, repeats=3, chat_template_name="chatml")
    out = grouped.reset_batch()
    assert out["group_id"] == [0, 0, 0, 1, 1, 1] and out["sample_index"].tolist() == [0, 1, 2] * 2
    assert secrets(grouped) == [_secret(0)] * 3 + [_secret(1)] * 3
    # a resumed env continues with unseen games
    restored = make_guess_number_env(batch_size=3, chat_template_name="chatml")
    restored.load_state_dict(env.state_dict())
    assert restored.reset_batch()["seed"].tolist() == [3, 4, 5]


@pytest.mark.skipif(not hasattr(ChatEnv, "reset_slots"), reason="this ChatEnv has no partial resets")
def test_partial_resets_start_new_games_in_finished_slots():
    env = make_guess_number_env(batch_size=3, chat_template_name="chatml")
    env.reset_batch()
    secret = env.gym_envs[0].secret
    step_out, next_out = env.step_and_maybe_reset([f"<answer>{secret}</answer>", "<answer>0</answer>", "0"])
    assert step_out["done"].reshape(-1).tolist() == [True, False, False]
    assert step_out["reward"].reshape(-1).tolist() == [1.0, 0.0, 0.0]
    assert not next_out["done"].any() and next_out["turn"].tolist() == [0, 1, 1]
    assert next_out["seed"].tolist() == [3, 1, 2] and env.gym_envs[0].secret == _secret(3)
    history = next_out["history", "prompt"]
    assert history[0].role == ["user"] and history[1].role == ["user", "assistant", "user"]
    # the games drawn with game 3 but not played yet come next, then new ones: no game is played twice
    assert env.reset_slots([1, 2])["seed"].tolist() == [3, 4, 5]
    assert [g.secret for g in env.gym_envs] == [_secret(s) for s in (3, 4, 5)]
    env.reset_slots([0])
    assert env.reset_batch()["seed"].tolist() == [7, 8, 9]
    assert env.reset_batch(seed=0)["seed"].tolist() == [0, 1, 2]


def _secret(seed: int) -> int:
    game = GuessNumberEnv()
    game.reset(seed=seed)
    assert game.secret is not None
    return game.secret


def test_rows_passed_to_reset_carry_seeds_options_and_groups():
    env = make_guess_number_env(chat_template_name="chatml")  # batch_size 1, but rows may give more slots
    out = env.reset(
        [
            {"seed": 11},
            {"options": {"secret": 4}, "id": "fixed"},
            PromptRow(data={"note": "x"}, prompt_id="row", group_id=7, sample_index=1),
        ]
    )
    assert out.batch_size[0] == 3 and [g.secret for g in env.gym_envs] == [_secret(11), 4, _secret(7)]
    assert out["seed"].tolist() == [11, 1, 7] and out["prompt_id"] == [11, "fixed", "row"]
    assert out["group_id"] == [None, None, 7] and out["sample_index"].tolist() == [0, 0, 1]
    assert env.slots[2].data["note"] == "x"
    assert all(h.role == ["user"] and h[0].content.startswith("I am thinking") for h in out["history", "prompt"])
    out = env.step(["<answer>4</answer>"] * 3)
    assert out["done"].reshape(-1).tolist()[1] and out["reward"][1].item() == 1.0
    with pytest.raises(TypeError, match="must be a dict or PromptRow"):
        env.reset(["a string"])


def test_close_closes_the_games_and_a_single_instance_plays_one_slot():
    with make_guess_number_env(batch_size=3, chat_template_name="chatml") as env:
        env.reset_batch()
        games = list(env.gym_envs)
        assert len(games) == 3 and not any(g.closed for g in games)
    assert all(g.closed for g in games) and env.gym_envs == []
    game = GuessNumberEnv()
    env = MLGymWrapper(game, chat_template_name="chatml")
    env.reset_batch()
    assert env.gym_envs == [game]
    env.close()
    assert game.closed
    with pytest.raises(ValueError, match="pass a factory"):
        MLGymWrapper(GuessNumberEnv(), batch_size=2)
    with pytest.raises(TypeError, match="Gymnasium-style"):
        MLGymWrapper(42)
    with pytest.raises(TypeError, match="must be a dict or PromptRow"):
        make_guess_number_env(batch_size=1).reset([3])


class LegacyTextEnv:
    """A game in MLGym's own shapes: dict observation at reset, four-tuple step; it also names a system prompt."""

    action_space = object()  # not text: must be ignored
    observation_space = object()

    def __init__(self) -> None:
        self.actions: list[str] = []

    def reset(self, seed=None, options=None):
        return {"observation": None}, {"system_prompt": f"You are agent {seed}.", "task": "legacy"}

    def step(self, action):
        self.actions.append(action)
        done = action == "submit"
        return (None if done else f"ran {action}"), (0.5 if done else 0), done, {"steps": len(self.actions)}


def test_legacy_shapes_system_prompt_and_observation_role():
    env = MLGymWrapper(LegacyTextEnv, batch_size=2, chat_template_name="chatml", observation_role="tool")
    out = env.reset_batch()
    history = out["history", "prompt"]
    assert [h.role for h in history] == [["system", "user"]] * 2
    assert [h[0].content for h in history] == ["You are agent 0.", "You are agent 1."]
    assert all(h[1].content == "" for h in history) and "system_prompt" not in out["info"][0]
    assert out["info"][0]["task"] == "legacy"
    out = env.step([f"ls{EOT}", "submit"])
    assert env.gym_envs[0].actions == ["ls"]  # the end-of-turn marker is not part of the action
    history = out["history", "prompt"]
    assert history[0].role[-1] == "tool" and history[0][-1].content == "ran ls"
    assert out["done"].reshape(-1).tolist() == [False, True] and out["terminated"].reshape(-1).tolist() == [False, True]
    assert out["reward"].reshape(-1).tolist() == [0.0, 0.5]
    assert out["info"][1] == {"task": "legacy", "steps": 1, "observation": ""}
    # a system prompt given to the wrapper is replaced by the game's
    env = MLGymWrapper(LegacyTextEnv, system_prompt="generic", chat_template_name="chatml")
    assert env.reset_batch()["history", "prompt"][0][0].content == "You are agent 0."


# --- tokens mode ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("input_mode", ["history", "text", "tokens"])
def test_multi_turn_prompts_in_each_input_mode(tokenizer, input_mode):
    env = make_guess_number_env(tokenizer, input_mode=input_mode, batch_size=2, system_prompt="Guess well.")
    player = Bisector(suffix=EOT)
    outputs = [env.reset_batch()]
    while active_rows(outputs[-1]):
        out = outputs[-1]
        for i in active_rows(out):
            expected = out["history", "prompt"][i].apply_chat_template(tokenizer=tokenizer)
            if input_mode == "history":
                assert ("text", "prompt") not in out.keys(True) and ("tokens", "prompt") not in out.keys(True)
            else:
                assert out["text", "prompt"][i] == expected
            if input_mode == "tokens":
                assert tokenizer.decode(out.get(("tokens", "prompt"), as_list=True)[i].tolist()) == expected
        outputs.append(env.step(player(out)))
    assert outputs[-1]["terminated"].all() and max(len(g) for g in player.guesses.values()) > 1
    if input_mode != "tokens":
        return
    for i, slot in enumerate(env.slots):
        tokens, mask = slot.all_tokens(), slot.policy_mask()
        policy_text = tokenizer.decode(tokens[mask].tolist())
        replies = [f"Let me halve the range.<answer>{g}</answer>{EOT}" for g in player.guesses[i]]
        assert policy_text == "".join(replies)  # exactly the responses, nothing of the env's turns
        env_text = tokenizer.decode(tokens[~mask].tolist())
        for message in slot.history.messages:
            if message.role in ("system", "user"):
                assert message.content in env_text and message.content not in policy_text
        rendered = slot.history.apply_chat_template(tokenizer, add_generation_prompt=False)
        assert rendered.startswith(tokenizer.decode(tokens.tolist()))


# --- make_mlgym ----------------------------------------------------------------------------------------------
def test_make_mlgym_without_mlgym_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlgym", None)  # importing it now fails, installed or not
    with pytest.raises(ImportError, match="'mlgym' package") as err:
        make_mlgym("prisonersDilemma")
    assert "pip install" in str(err.value) and "MLGymWrapper" in str(err.value)


@dataclass
class _TaskArgs:
    id: str
    description: str


class _FakeMLGymEnv:
    """Just enough of MLGym's container env: communicate, add_commands, dict reset, four-tuple step."""

    def __init__(self, task_id: str, devices) -> None:
        self.task_args = _TaskArgs(task_id, f"Solve {task_id}.")
        self.devices = devices
        self.task_workspace = "/home/agent/workspace"
        self.current_step, self.max_steps, self.returncode = 0, 10, 0
        self.sent: list[str] = []
        self.stepped: list[str] = []
        self.commands_added: list[dict] = []
        self.cwds: list[str] = []
        self.closed = False

    @property
    def unwrapped(self):
        return self

    def communicate(self, command: str) -> str:
        self.sent.append(command)
        return '{"open_file": "n/a", "working_dir": "/home/agent/workspace"}' if command == "_state" else ""

    def add_commands(self, commands):
        self.commands_added.extend(commands)

    def reset(self, seed=None, options=None):
        self.cwds.append(os.getcwd())
        self.current_step = 0
        return {"observation": None}, {}

    def reset_container(self):
        self.sent.append("<reset container>")

    def step(self, action):
        self.stepped.append(action)
        self.current_step += 1
        if action == "validate":
            return "Baseline Score: {'Score': 0.5}\nEvaluation Score: {'Score': 0.75}", 0, False, {"score": 1}
        if action == "submit":
            return "submitted", 0, True, {}
        return ("" if action == "true" else f"output of {action}"), 0, False, {}

    def close(self):
        self.closed = True


def _install_fake_mlgym(monkeypatch, root: Path) -> dict:
    record: dict = {"made": [], "registered": []}
    (root / "configs" / "agents").mkdir(parents=True)
    (root / "docker").mkdir()
    (root / "docker" / "aliases.sh").write_text("alias ll='ls -l'\n")
    tool_file = root / "_helpers.py"
    tool_file.write_text("def helper(): pass\n")

    class FormatError(Exception):
        pass

    def parser(text, commands):
        if "```" not in text:
            raise FormatError("no command block")
        thought, _, rest = text.partition("```")
        return thought.strip(), rest.split("```")[0].strip()

    tools = types.SimpleNamespace(
        command_docs="ls: list files",
        env_variables={"WINDOW": 100},
        state_command=types.SimpleNamespace(name="_state", code="_state() { echo state; }"),
        commands=[],
        submit_command="submit",
        guard_multiline_input=lambda command: command,
        config=types.SimpleNamespace(command_files=[str(tool_file)]),
    )
    config = types.SimpleNamespace(
        system_template="SYSTEM {command_docs} window={WINDOW}",
        task_template="TASK {description} (step {current_step}, {remaining_steps} left)",
        strategy_template="Think first.",
        next_step_template="{observation}\n(Open file: {open_file}) step {current_step}",
        next_step_no_output_template="No output. (step {current_step})",
        format_error_template="Format error: use a command block.",
        output_parser=parser,
        tools_handler=tools,
        env_variables={"WINDOW": 100},
    )

    def make(env_id, devices):
        record["made"].append((env_id, os.getcwd()))
        return _FakeMLGymEnv(env_id.split("/", 1)[1], devices)

    def register_task(arguments):
        record["registered"].append(arguments)

    class EnvironmentArguments:
        def __init__(self, task_config_path, **kwargs):
            self.task_config_path, self.kwargs = task_config_path, kwargs
            self.task = types.SimpleNamespace(id=Path(task_config_path).stem)

    class AgentArguments:
        def __init__(self, model, agent_config_path):
            self.model, self.agent_config_path, self.config = model, agent_config_path, config

    modules = {
        "gymnasium": {"make": make},
        "mlgym": {"REPO_ROOT": root, "CONFIG_DIR": root / "configs", "__file__": str(root / "mlgym" / "__init__.py")},
        "mlgym.environment": {},
        "mlgym.environment.env": {"EnvironmentArguments": EnvironmentArguments},
        "mlgym.environment.registration": {"register_task": register_task},
        "mlgym.agent": {},
        "mlgym.agent.base": {"AgentArguments": AgentArguments},
        "mlgym.backend": {},
        "mlgym.backend.base": {"ModelArguments": lambda name: types.SimpleNamespace(name=name)},
        "mlgym.exceptions": {"FormatError": FormatError},
    }
    for name, attributes in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)
    return record


def test_make_mlgym_plays_a_task_through_its_gymnasium_registration(monkeypatch, tmp_path):
    record = _install_fake_mlgym(monkeypatch, tmp_path)
    cwd = os.getcwd()
    env = make_mlgym("prisonersDilemma", batch_size=2, chat_template_name="chatml", reward_wrong_format=-0.1)
    assert len(record["registered"]) == 1
    arguments = record["registered"][0]
    assert arguments.task_config_path == "tasks/prisonersDilemma.yaml"
    assert arguments.kwargs["aliases_file"] == "docker/aliases.sh" and arguments.kwargs["max_steps"] == 10
    out = env.reset_batch()
    assert os.getcwd() == cwd  # MLGym runs from its checkout, the caller's directory is restored
    assert [m[0] for m in record["made"]] == ["mlgym/prisonersDilemma"] * 2
    assert all(made_in == str(tmp_path) for _, made_in in record["made"])
    container = env.gym_envs[0].env
    assert container.devices == ["cpu_0"] and container.cwds == [str(tmp_path)]
    assert container.sent[:2] == ["cd /home/agent", "_state() { echo state; }\nWINDOW=100"]
    assert container.commands_added == [{"contents": "def helper(): pass\n", "name": "_helpers.py", "type": "utility"}]
    history = out["history", "prompt"][0]
    assert history.role == ["system", "user"] and history[0].content == "SYSTEM ls: list files window=100"
    assert history[1].content == "TASK Solve prisonersDilemma. (step 0, 10 left)\nThink first."
    assert out["info"][0]["mlgym_task"] == "prisonersDilemma"
    # an unparsable reply: penalty, format error message, the container is not touched
    out = env.step(["I am thinking.", "Let me look.\n```ls -a```"])
    assert container.stepped == [] and env.gym_envs[1].env.stepped == ["ls -a"]
    assert out["reward"].reshape(-1).tolist() == pytest.approx([-0.1, 0.0]) and out["info"][0]["format_error"]
    assert out["history", "prompt"][0][-1].content == "Format error: use a command block."
    assert out["history", "prompt"][1][-1].content == "output of ls -a\n(Open file: n/a) step 1"
    out = env.step(["```true```", "```validate```"])
    assert out["history", "prompt"][0][-1].content == "No output. (step 1)"
    assert out["reward"].reshape(-1).tolist() == pytest.approx([0.0, 0.25])  # evaluation minus baseline score
    out = env.step(["```submit```", "```submit```"])
    assert out["terminated"].all() and out["info"][1]["command"] == "submit"
    env.reset_batch()  # a second episode: fresh containers for the same task
    assert "<reset container>" in container.sent and len(record["made"]) == 2
    env.close()
    assert container.closed and os.getcwd() == cwd
    with pytest.raises(ValueError, match="either task or tasks"):
        make_mlgym("a", tasks=["b"])


def test_mlgym_score_reward():
    assert mlgym_score_reward("Evaluation Score: {'Score': 2.5}") == 2.5
    assert mlgym_score_reward("Baseline Score: {'Score': 1.0}\nEvaluation Score: {'Score': 0.5}") == -0.5
    assert mlgym_score_reward("Baseline Score: {'Score': 1.0}") is None


# --- end to end with the engine ------------------------------------------------------------------------------
def test_collector_plays_guess_number_with_vllm(vllm_engine_fp32):
    from llmrl_core.collectors import LLMCollector
    from llmrl_core.collectors.tensordict_batches import rows as episodes
    from llmrl_core.modules import vLLMWrapper

    policy = vLLMWrapper(
        vllm_engine_fp32, input_mode="tokens", generate_kwargs={"max_new_tokens": 24, "temperature": 0.8, "seed": 0}
    )
    env = make_guess_number_env(policy.tokenizer, input_mode="tokens", batch_size=2, max_guesses=3, seed=0)
    batch = LLMCollector(env, policy, total_trajectories=2).collect()
    sampled_rows = batch.get(("log_probs", "full"), as_list=True)
    trajectories = episodes(batch)
    assert len(trajectories) == 2 and sorted(t.data["seed"] for t in trajectories) == [0, 1]
    assert any(t.num_turns > 1 for t in trajectories)
    for t, full_log_probs in zip(trajectories, sampled_rows, strict=True):
        assert t.reward in (0.0, 1.0) and t.reward_components == {"env": t.reward}
        assert t.terminated == (t.reward == 1.0) and (t.terminated or t.truncated)
        if not (t.terminated and t.num_turns == 1):  # a wrong (or unreadable) first guess: the game went on
            assert t.num_turns > 1
        assert t.info["guesses_used"] == t.num_turns
        assert [m["role"] for m in t.messages] == ["user"] + ["assistant", "user"] * (t.num_turns - 1) + ["assistant"]
        # the policy mask covers exactly the sampled ids; the game's replies are outside it
        assert len(t.sampler_log_probs) == int(t.policy_mask.sum()) == t.num_sampled_tokens
        assert bool((full_log_probs[~t.policy_mask] == 0).all())  # TorchRL's full log-probs: 0 off the policy
        env_text = policy.tokenizer.decode(t.tokens[~t.policy_mask].tolist())
        for message in t.messages:
            if message["role"] == "user":
                assert f"user\n{message['content']}" in env_text


def test_make_mlgym_takes_torchrl_device(monkeypatch, tmp_path):
    _install_fake_mlgym(monkeypatch, tmp_path)
    env = make_mlgym(task="prisonersDilemma", tokenizer=None, device="cpu", chat_template_name="chatml")
    assert env.device == torch.device("cpu")
    env.close()
    env = make_mlgym(task="prisonersDilemma", device=None, chat_template_name="chatml")
    assert env.device is None
    env.close()
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="asks for CUDA, which is not available"):
            make_mlgym(task="prisonersDilemma", device="cuda:0")
    with pytest.raises(ValueError, match="not a torch device"):
        make_mlgym(task="prisonersDilemma", device="gpu-please")


def test_torchrls_step_carries_the_games_reward():
    """The games are the env's own reward source: TorchRL's ``step(td)`` writes their reward under ``"next"`` (its
    spec declares it), the winning slot's 1.0 and the other's 0.0."""
    from tensordict import TensorDict

    env = make_guess_number_env(batch_size=2, max_guesses=5, chat_template_name="chatml")
    assert env.full_reward_spec["reward"].shape == (2, 1)
    td = env.reset(TensorDict(batch_size=()))
    secret = env.gym_envs[0].secret
    wrong = secret % 20 + 1
    nxt = env.step(td.set("text_response", [f"<answer>{secret}</answer>", f"<answer>{wrong}</answer>"]))["next"]
    assert nxt["reward"].tolist() == [[1.0], [0.0]] and nxt["done"].tolist() == [[True], [False]]
