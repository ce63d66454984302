"""TorchRL's ``env.rollout(max_steps, policy)`` for :class:`~llmrl_core.envs.chat_env.ChatEnv`.

The loop of TorchRL's ``EnvBase.rollout``, on the env's TensorDict calls: reset (unless ``auto_reset=False``), then
per step ``td.update(policy(td))``, ``env.step(td)``, a copy of the stepped data kept, and the ``"next"`` data
moved to the root for the following step (every other root entry is carried, the reward is not: TorchRL's
``step_mdp`` as its envs call it). It stops after ``max_steps``, or, by default, once any conversation is done
(``break_when_all_done=True``: once all are). The steps are stacked along a new dimension after the batch:
``(B, T)``, densely where the entries agree, lazily where they do not (the histories grow every turn).

A chat env has no random action, so a policy (or ``actions``: one answer per conversation and step) is required.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

if TYPE_CHECKING:
    from llmrl_core.envs.chat_env import ChatEnv

_DONE_KEYS = ("done", "terminated", "truncated")


def next_observation(stepped: TensorDictBase) -> TensorDictBase:
    """The input of the following step: the ``"next"`` data, plus every root entry it does not hold (the prompt
    row's fields, the policy's last outputs), without the reward."""
    following = stepped.get("next").exclude("reward")
    for key in stepped.keys():
        if key != "next" and key not in following.keys():
            following.set(key, stepped.get(key))
    return following


def _any_done(td: TensorDictBase) -> torch.Tensor:
    flags = [td.get(key).reshape(td.batch_size[0], -1).any(-1) for key in _DONE_KEYS if key in td.keys()]
    return torch.stack(flags).any(0) if flags else torch.zeros(td.batch_size[0], dtype=torch.bool)


def rollout(
    env: ChatEnv,
    max_steps: int,
    policy: Callable[[TensorDictBase], TensorDictBase] | None = None,
    callback: Callable[..., Any] | None = None,
    *,
    actions: Iterable[Any] | None = None,
    auto_reset: bool = True,
    auto_cast_to_device: bool = False,
    break_when_any_done: bool | None = None,
    break_when_all_done: bool | None = None,
    return_contiguous: bool | None = False,
    tensordict: TensorDictBase | None = None,
    set_truncated: bool = False,
    out: TensorDictBase | None = None,
    trust_policy: bool = False,
    storing_device: torch.device | str | None = None,
    set_state: bool | None = None,
) -> TensorDictBase:
    """Run ``policy`` in ``env`` for up to ``max_steps`` turns; the ``(B, T)`` stack of the stepped data (see the
    module docstring). ``auto_cast_to_device``, ``trust_policy`` and ``set_state`` are accepted for TorchRL's
    signature and change nothing here (the env and the wrappers keep their data on their own devices)."""
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if break_when_any_done is None:
        break_when_any_done = not break_when_all_done
    if break_when_all_done and break_when_any_done:
        raise TypeError("Cannot have both break_when_all_done and break_when_any_done True at the same time.")
    if actions is not None:
        if policy is not None:
            raise ValueError("Cannot pass both `policy` and `actions` to rollout().")
        policy, max_steps = _answers_policy(actions, max_steps)
    if policy is None:
        raise ValueError(
            f"{type(env).__name__}.rollout needs a policy (or actions): a chat env has no random action to sample"
        )
    if auto_reset:
        td = env.reset(tensordict if tensordict is not None else TensorDict(batch_size=()))
    elif tensordict is None:
        raise RuntimeError("tensordict must be provided when auto_reset is False")
    else:
        td = tensordict
    steps: list[TensorDictBase] = []
    running = torch.ones(td.batch_size[0], dtype=torch.bool)
    for i in range(max_steps):
        td.update(policy(td))
        td = env.step(td)
        following = next_observation(td)
        steps.append(td.copy() if storing_device is None else td.to(storing_device))
        if i == max_steps - 1:
            break
        td = following
        done = _any_done(td)
        if break_when_any_done and bool(done.any()):
            break
        running &= ~done
        if break_when_all_done and not bool(running.any()):
            break
        if callback is not None:
            callback(env, td)
    if return_contiguous:
        result = torch.stack(steps, 1, out=out)
    else:
        result = LazyStackedTensorDict.maybe_dense_stack(steps, 1, out=out)
    if set_truncated:
        done = result.get(("next", "done"))
        truncated = result.get(("next", "truncated"), None)  # an env that cannot cut short has none: add it
        truncated = torch.zeros_like(done) if truncated is None else truncated
        truncated[:, -1] = True
        result.set(("next", "truncated"), truncated)
        result.set(("next", "done"), result.get(("next", "done")) | truncated)
    return result


def _answers_policy(actions: Iterable[Any], max_steps: int) -> tuple[Callable[[TensorDictBase], Any], int]:
    """``actions``: per step, the answers (one string per conversation) written as the sampled text."""
    answers = iter(actions)

    def policy(td: TensorDictBase) -> TensorDictBase:
        step_answers = next(answers)
        step_answers = [step_answers] if isinstance(step_answers, str) else list(step_answers)
        return td.set("text_response", step_answers)

    if hasattr(actions, "__len__"):
        max_steps = min(max_steps, len(actions))  # type: ignore[arg-type]
    return policy, max_steps
