"""The :class:`SlotTransform` base class: how env add-ons (rewards, tools, primers, stamps) plug into ``ChatEnv``.

Lifecycle inside ``ChatEnv`` (transforms run in the order they were appended):

``reset(prompts=None)``
  1. If no prompts are passed, the env asks each transform's :meth:`SlotTransform.provide_prompts` in order; the
     first non-None answer (a list of :class:`~llmrl_core.envs.types.PromptRow`) is used (DataLoadingPrimer).
  2. The env builds one :class:`~llmrl_core.envs.types.SlotState` per prompt: history = [system prompt] +
     the query as a user message (or the given conversation); ``slot.data`` holds the row's fields.
  3. :meth:`SlotTransform.on_reset` is called with all slots (default: :meth:`reset_slot` for each). Transforms
     may rewrite the prompt here (a TensorDict transform's ``_reset`` does it on ``("history", "prompt")``, as
     FewShotExamples and GSM8KPrepareQuestion do).

``step(actions)``
  1. For every slot that is not done, the env appends the assistant message (``slot.history``), stores
     the :class:`~llmrl_core.data.llm_data.Response` in ``slot.responses``, increments ``slot.turn`` and zeroes
     ``slot.reward`` / ``slot.reward_components`` for this step.
  2. :meth:`SlotTransform.on_step` is called with those *active* slots only (default: :meth:`step_slot` for
     each). A transform may add messages (``slot.add_message("tool", ...)``: they become part of the next
     prompt), add rewards (``slot.add_reward(v, name=...)``), set ``slot.info[...]``, and end the episode with
     ``slot.terminate()`` (task over) or ``slot.truncate()`` (cut short). Later transforms see earlier ones'
     changes; a transform should skip slots that an earlier one already ended if that matters to it.
  3. The env truncates slots that reached ``max_turns`` and are not yet done.

Both: :meth:`SlotTransform.on_output` is called last with the :class:`~llmrl_core.envs.types.EnvOutput` (stamp
versions, add rendered text or tokens). Transforms with state to checkpoint implement
:meth:`state_dict` / :meth:`load_state_dict`; ``ChatEnv.state_dict`` collects them by position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmrl_core.user_code import UserCodeError

if TYPE_CHECKING:
    from llmrl_core.envs.chat_env import ChatEnv
    from llmrl_core.envs.types import EnvOutput, PromptRow, SlotState


class SlotTransform:
    """Base class for env transforms: override the per-slot hooks, or the batch hooks for batched work.

    ``writes_reward`` says whether the transform may reward a step (``slot.add_reward``): a TensorDict step's
    ``"next"`` data carries ``reward`` when one of the env's transforms may (as TorchRL's carries it when a reward
    transform is appended, and not for a bare ``ChatEnv``). Transforms that only shape prompts or run tools set it
    to False. ``reward_shape`` is the shape of one row's reward there: ``(1,)`` by default, ``(1, 1)`` for the
    reward parsers whose TorchRL counterparts write ``(B, 1, 1)`` (IFEval's; GSM8K's is a TensorDict ``Transform``).
    ``reward_fields`` names what such a transform writes beside ``reward``, for the env's reward spec."""

    writes_reward: bool = True
    reward_shape: tuple[int, ...] = (1,)
    # fields a step's "next" data carries beside ``reward`` (name, dtype; in ``reward_shape``): the env's reward spec
    reward_fields: tuple[tuple[str, Any], ...] = ()

    def __init__(self) -> None:
        self.parent: ChatEnv | None = None

    def set_parent(self, env: ChatEnv) -> None:
        """Called by ``ChatEnv.append_transform``; a transform belongs to one env."""
        if self.parent is not None and self.parent is not env:
            raise ValueError(f"{type(self).__name__} is already attached to another env")
        self.parent = env

    # --- reset -----------------------------------------------------------------------------------
    def provide_prompts(self, batch_size: int | None) -> list[PromptRow] | None:
        """Prompts for a reset called without prompts, or None if this transform does not provide any."""
        return None

    def on_reset(self, slots: list[SlotState]) -> None:
        """Batch hook after the env built the new slots; default calls :meth:`reset_slot` on each."""
        for slot in slots:
            self.reset_slot(slot)

    def reset_slot(self, slot: SlotState) -> None:
        """Per-slot reset hook (no-op by default)."""

    # --- step ------------------------------------------------------------------------------------
    def on_step(self, slots: list[SlotState]) -> None:
        """Batch hook after the assistant responses were appended (active slots only)."""
        for slot in slots:
            self.step_slot(slot)

    def step_slot(self, slot: SlotState) -> None:
        """Per-slot step hook (no-op by default)."""

    # --- output / state --------------------------------------------------------------------------
    def on_output(self, output: EnvOutput) -> None:
        """Last hook of reset and step: may change the output in place (no-op by default)."""

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state (empty by default)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (no-op by default)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class EnvTransformError(UserCodeError):
    """An env transform's hook raised; the message names the transform's class, the hook and the error."""


def run_hook(transform: SlotTransform, hook: str, *args: Any) -> None:
    """``transform.<hook>(*args)``; a failure becomes an :class:`EnvTransformError` naming the transform (an error
    already said as the user's code, e.g. a reward function's, passes as it is)."""
    try:
        getattr(transform, hook)(*args)
    except UserCodeError:
        raise
    except Exception as err:
        raise EnvTransformError(
            f"env transform {type(transform).__name__}.{hook} raised {type(err).__name__}: {err}"
        ) from err
