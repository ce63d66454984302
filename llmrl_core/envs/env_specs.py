"""TorchRL's env specs for ``ChatEnv``: ``observation_spec``, ``action_spec``, ``state_spec``, ``reward_spec``,
``done_spec`` (and their ``full_*`` composites) and the ``*_keys`` lists derived from them.

As TorchRL's ``ChatEnv`` builds them for its input mode: the observation is the prompt (``("history", "prompt")``,
``("text", "prompt")`` or ``("tokens", "prompt")``), the action the full conversation (``"full"`` under the same
key), the state the prompt row's field (``data_key``, a string), the done flags ``done`` and ``terminated``
(``truncated`` too when the env can cut an episode short: ``max_turns``, ``max_prompt_tokens``). The reward spec
is empty for a bare env and holds ``reward`` once the env's own dynamics reward (``own_reward_shape``: a gym
wrapper's games) or a TensorDict transform declares one in its ``transform_reward_spec`` hook; the transforms edit
each spec through their ``transform_*_spec`` hooks, as in a TorchRL ``TransformedEnv``. As in
TorchRL, ``action_spec`` / ``reward_spec`` / ``done_spec`` answer the leaf when the only leaf is ``"action"`` /
``"reward"`` / ``"done"``, the composite otherwise.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict.utils import NestedKey

from llmrl_core.data.tensor_specs import Categorical, Composite, NonTensor, TensorSpec, Unbounded


class EnvSpecs:
    """The spec properties of an env with ``input_mode``, ``batch_size``, ``device``, ``data_key``, the TensorDict
    ``td_transforms``, and the ``max_turns`` / ``max_prompt_tokens`` limits."""

    input_mode: str
    batch_size: torch.Size
    device: Any
    data_key: str
    td_transforms: list[Any]
    # one row's reward shape when the env's own dynamics reward a step (a subclass's: the gym wrapper's games)
    own_reward_shape: tuple[int, ...] | None = None
    max_turns: int | None
    max_prompt_tokens: int | None

    # --- what a step writes (the specs and ChatEnv.step_layout both read these) -------------------
    def reward_row_shape(self) -> tuple[int, ...] | None:
        """One row's ``reward`` shape once the env or a transform may reward (the longest of ``own_reward_shape`` and
        of the ``reward`` a TensorDict transform declares in its ``transform_reward_spec``, as the GSM8K parser
        does), else None."""
        shapes = [self.own_reward_shape] if self.own_reward_shape is not None else []
        if self.td_transforms:
            declared = self._through_transforms("transform_reward_spec", Composite(shape=self.batch_size))
            if "reward" in declared.keys():
                shapes.append(tuple(declared["reward"].shape[len(self.batch_size) :]))
        return max(shapes, key=len) if shapes else None

    def can_cut_short(self) -> bool:
        """Whether the env itself may truncate an episode (``max_turns``, ``max_prompt_tokens``)."""
        return self.max_turns is not None or self.max_prompt_tokens is not None

    # --- the composites --------------------------------------------------------------------------
    def _io_spec(self, field: str) -> Composite:
        from llmrl_core.modules.policies.outputs import ChatHistory, Text, Tokens

        kind = {"history": ChatHistory, "text": Text, "tokens": Tokens}[self.input_mode]
        inner = kind.default_spec(shape=tuple(self.batch_size), keys=[field]).to(self.device)
        return Composite({self.input_mode: inner}, shape=self.batch_size, device=self.device)

    def _through_transforms(self, hook: str, spec: Composite) -> Composite:
        for transform in self.td_transforms:
            spec = getattr(transform, hook)(spec)
        return spec

    @property
    def full_observation_spec(self) -> Composite:
        """The prompt in the env's input mode."""
        return self._through_transforms("transform_observation_spec", self._io_spec("prompt"))

    @property
    def full_action_spec(self) -> Composite:
        """The full conversation (prompt and answer) in the env's input mode."""
        return self._through_transforms("transform_action_spec", self._io_spec("full"))

    @property
    def full_state_spec(self) -> Composite:
        """The prompt row's field (``data_key``)."""
        field = NonTensor(shape=self.batch_size, device=self.device, example_data="a string")
        return self._through_transforms(
            "transform_state_spec", Composite({self.data_key: field}, shape=self.batch_size, device=self.device)
        )

    @property
    def full_reward_spec(self) -> Composite:
        """``reward`` once the env or a transform may reward (:meth:`reward_row_shape`), else empty."""
        spec = Composite(shape=self.batch_size, device=self.device)
        row = self.reward_row_shape()
        if row is not None:
            shape = (*self.batch_size, *row)
            spec["reward"] = Unbounded(shape=shape, device=self.device)
        return self._through_transforms("transform_reward_spec", spec)

    @property
    def full_done_spec(self) -> Composite:
        """``done`` and ``terminated`` (and ``truncated`` when the env can cut an episode short), ``(B, 1)`` bools."""
        names = ["done", "terminated"]
        if self.can_cut_short():
            names.append("truncated")
        flag = Categorical(2, shape=(*self.batch_size, 1), device=self.device, dtype=torch.bool)
        spec = Composite({name: flag.clone() for name in names}, shape=self.batch_size, device=self.device)
        return self._through_transforms("transform_done_spec", spec)

    # --- TorchRL's shortcuts ---------------------------------------------------------------------
    @staticmethod
    def _leaf_or_full(full: Composite, name: str) -> Composite | TensorSpec:
        """TorchRL's rule: the leaf when the spec's only leaf is named ``name`` (``"action"``, ...), else the whole."""
        leaves = list(full.keys(True, True))
        return full[name] if leaves == [name] else full

    @property
    def observation_spec(self) -> Composite:
        return self.full_observation_spec

    @property
    def state_spec(self) -> Composite:
        return self.full_state_spec

    @property
    def action_spec(self) -> Composite | TensorSpec:
        return self._leaf_or_full(self.full_action_spec, "action")

    @property
    def reward_spec(self) -> Composite | TensorSpec:
        return self._leaf_or_full(self.full_reward_spec, "reward")

    @property
    def done_spec(self) -> Composite | TensorSpec:
        return self._leaf_or_full(self.full_done_spec, "done")

    @property
    def observation_keys(self) -> list[NestedKey]:
        return _sorted_leaves(self.full_observation_spec)

    @property
    def action_keys(self) -> list[NestedKey]:
        return _sorted_leaves(self.full_action_spec)

    @property
    def state_keys(self) -> list[NestedKey]:
        return _sorted_leaves(self.full_state_spec)

    @property
    def reward_keys(self) -> list[NestedKey]:
        return _sorted_leaves(self.full_reward_spec)

    @property
    def done_keys(self) -> list[NestedKey]:
        return _sorted_leaves(self.full_done_spec)


def _sorted_leaves(spec: Composite) -> list[NestedKey]:
    """The leaf keys sorted as TorchRL lists them (``env.action_keys``, ...): by their string form."""
    return sorted(spec.keys(True, True), key=lambda key: key if isinstance(key, str) else ".".join(key))
