"""``RewardFunctions``: the run's ``env.rewards`` functions as a TensorDict transform, appended last to the env by
:func:`~llmrl_core.pipeline.env_config.build_env`. Each function, ``(prompt, completion, row) -> float`` (TRL's
convention), is called once per episode, when it ends; a failure is said in one line naming the function and the
row (:mod:`llmrl_core.envs.reward_calls`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase

from llmrl_core.data.tensor_specs import Composite, Unbounded
from llmrl_core.envs.reward_calls import REWARD_ERRORS, RewardFunctionError, describe_row, reward_value
from llmrl_core.envs.tensordict_io import responses_from_tensordict, step_flattened, step_row_fields
from llmrl_core.envs.transforms.td_base import Transform
from llmrl_core.user_code import import_object


@dataclass
class RewardFunctionConfig:
    """One reward function: ``function`` is ``module:function`` (called with prompt, completion, row)."""

    function: str
    weight: float = 1.0  # its reward is multiplied by this before being added
    name: str | None = None  # the reward component's name (default: the function's name)

    def __post_init__(self) -> None:
        if ":" not in self.function:
            raise ValueError(f"env.rewards: function must look like 'module:function', got {self.function!r}")


def load_reward_functions(specs: list[RewardFunctionConfig]) -> list[tuple[Any, float, str, str]]:
    """``(function, weight, component name, label)`` per spec; the label names its setting in errors."""
    loaded = []
    for i, spec in enumerate(specs):
        fn = import_object(spec.function, f"env.rewards[{i}].function")
        name = spec.name or getattr(fn, "__name__", "reward_fn")
        loaded.append((fn, spec.weight, name, f"env.rewards[{i}].function {spec.function!r}"))
    return loaded


class RewardFunctions(Transform):
    """Pays the configured reward functions once per episode, when it ends.

    A TensorDict transform: ``_reset`` keeps the question each new episode answers (the last user message of the
    reset prompt, after the prompt transforms appended before it: not a few-shot example's), ``_step`` calls the
    functions on the rows whose episode ended in the step (``done`` in the step data: a reward parser's answer,
    the turn limit) with that question, the episode's last policy message and the row's fields, and adds their
    weighted sum to ``reward`` (written, ``(B, 1)``, when no transform before it wrote one; on a per-token reward,
    on each row's last token). Each function's share is the slot's reward component under its name."""

    def __init__(
        self, specs: list[RewardFunctionConfig], keep_env_reward: bool = True, on_error: str = "raise"
    ) -> None:
        super().__init__()
        if on_error not in REWARD_ERRORS:
            raise ValueError(f"on_error must be one of {list(REWARD_ERRORS)}, got {on_error!r}")
        self.functions = load_reward_functions(specs)
        self.keep_env_reward = keep_env_reward
        self.on_error = on_error
        self._questions: dict[int, str] = {}  # per env slot: the user message its episode answers

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        """Keep the question of each episode that starts (TorchRL's ``"_reset"`` rows on a partial reset)."""
        history = tensordict_reset.get(("history", "prompt"), None)
        if history is None:
            return tensordict_reset
        user_role = getattr(self.parent, "user_role", "user")
        conversations = history.to_conversations()
        for i in self._reset_rows(tensordict, tensordict_reset):
            messages = conversations[i].messages
            self._questions[self._slot_of(i)] = next((m.text for m in reversed(messages) if m.role == user_role), "")
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        """Add the functions' weighted rewards on the rows whose episode ended in this step."""
        if step_flattened(self, tensordict, next_tensordict):
            return next_tensordict
        size = next_tensordict.batch_size[0]
        done = next_tensordict.get("done", None)
        ended = [False] * size if done is None else done.reshape(size, -1).any(-1).tolist()
        active = self._active_rows(size)
        paid = [0.0] * size
        if any(ended[i] for i in active):
            completions = self._completions(tensordict, next_tensordict)
            rows = step_row_fields(tensordict, next_tensordict)
            for i in active:
                if ended[i]:
                    paid[i] = self._pay(i, completions[i], rows[i])
        if not self.keep_env_reward:
            for i in active:
                self._note_row(i, replace_reward_components=True)
        next_tensordict.set("reward", self._with_paid(next_tensordict.get("reward", None), paid, active, size))
        return next_tensordict

    def _pay(self, index: int, completion: str, row: dict[str, Any]) -> float:
        """The weighted sum of the functions' values for row ``index`` (each noted as a reward component); on a
        failure with ``on_error="skip"``, what was paid before it and the error in the slot's ``info``."""
        slot = self._slot_of(index)
        question = self._questions.get(slot, "")
        total = 0.0
        for fn, weight, name, label in self.functions:
            try:
                value = reward_value(fn, label, question, completion, row, self._row_name(slot, row))
            except RewardFunctionError as err:
                if self.on_error == "raise":
                    raise
                self._note_row(index, info={"reward_error": str(err)})  # counted by the rollout, not trained on
                break
            total += weight * value
            self._note_row(index, reward_components={name: weight * value})
        return total

    def _completions(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> list[str]:
        """Each row's last policy message: from the conversation under ``("history", "prompt")`` of the step data
        (a ChatEnv lends it on its list calls; TorchRL's history mode has it), else the step's answers."""
        role = getattr(self.parent, "policy_role", "assistant")
        history = next_tensordict.get(("history", "prompt"), None)
        if history is not None:
            return [
                next((m.text for m in reversed(c.messages) if m.role == role), "") for c in history.to_conversations()
            ]
        texts = [r.text for r in responses_from_tensordict(tensordict, getattr(self.parent, "tokenizer", None))]
        strip = getattr(self.parent, "strip_end_of_turn", None)  # as the env keeps the answer in the conversation
        return [strip(t)[0] for t in texts] if strip is not None else texts

    def _row_name(self, slot: int, row: Mapping[str, Any]) -> str:
        """How an error names the row: its prompt id and place in its group (the env's slot knows them)."""
        slots = getattr(self.parent, "slots", None)
        if slots and 0 <= slot < len(slots):
            state = slots[slot]
            return describe_row(state.prompt_id, state.group_id, state.sample_index)
        return describe_row(row.get("prompt_id", slot))

    def _with_paid(self, reward: torch.Tensor | None, paid: list[float], active: list[int], size: int) -> torch.Tensor:
        """The step's reward with ``paid`` added per row (or instead of the env's, without ``keep_env_reward``)."""
        value = torch.tensor(paid, dtype=torch.float32)
        if reward is None:
            return value.reshape(size, 1)
        if getattr(reward, "is_nested", False) or not isinstance(reward, torch.Tensor):
            raise ValueError(
                "RewardFunctions: the step data's 'reward' is ragged (a per-token reward of rows of different "
                "lengths); append env.rewards' functions before the transform that writes it"
            )
        reward = reward.clone()
        flat = reward.reshape(size, -1)
        if not self.keep_env_reward:
            flat[active] = 0.0
        flat[:, -1] += value.to(flat.dtype)  # one value per row, or the last token of a per-token reward
        return flat.reshape(reward.shape)

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        """``reward`` of shape ``batch + (1,)`` unless a transform before declared one."""
        if "reward" not in reward_spec.keys():
            reward_spec["reward"] = Unbounded(shape=(*reward_spec.shape, 1), device=reward_spec.device)
        return reward_spec

    def __repr__(self) -> str:
        names = [name for _, _, name, _ in self.functions]
        return f"RewardFunctions(functions={names}, keep_env_reward={self.keep_env_reward}, on_error={self.on_error!r})"
