"""The ``transform_*_spec`` hooks of the TensorDict transforms (TorchRL's ``Transform`` interface): an env passes
its specs (:mod:`llmrl_core.data.tensor_specs`) through them, as a TorchRL ``TransformedEnv`` does.
:class:`SpecHooks` (a part of :class:`~llmrl_core.envs.transforms.td_base.Transform`) returns each spec unchanged
unless a transform overrides the hook; :class:`ComposeSpecHooks` (a part of
:class:`~llmrl_core.envs.transforms.td_base.Compose`) passes each spec through the chained transforms in order."""

from __future__ import annotations

from typing import Any


class SpecHooks:
    """The spec hooks of one transform: specs are not modelled, so each returns its argument."""

    # --- specs (not modelled: identity) ----------------------------------------------------------
    def transform_observation_spec(self, observation_spec: Any) -> Any:
        return observation_spec

    def transform_reward_spec(self, reward_spec: Any) -> Any:
        return reward_spec

    def transform_done_spec(self, done_spec: Any) -> Any:
        return done_spec

    def transform_action_spec(self, action_spec: Any) -> Any:
        return action_spec

    def transform_state_spec(self, state_spec: Any) -> Any:
        return state_spec

    def transform_input_spec(self, input_spec: Any) -> Any:
        return input_spec

    def transform_output_spec(self, output_spec: Any) -> Any:
        return output_spec


class ComposeSpecHooks:
    """The spec hooks of a chain of transforms (``self.transforms``): each spec goes through every transform's hook,
    in order."""

    def transform_observation_spec(self, observation_spec: Any) -> Any:
        for transform in self.transforms:
            observation_spec = transform.transform_observation_spec(observation_spec)
        return observation_spec

    def transform_reward_spec(self, reward_spec: Any) -> Any:
        for transform in self.transforms:
            reward_spec = transform.transform_reward_spec(reward_spec)
        return reward_spec

    def transform_done_spec(self, done_spec: Any) -> Any:
        for transform in self.transforms:
            done_spec = transform.transform_done_spec(done_spec)
        return done_spec

    def transform_action_spec(self, action_spec: Any) -> Any:
        for transform in self.transforms:
            action_spec = transform.transform_action_spec(action_spec)
        return action_spec

    def transform_state_spec(self, state_spec: Any) -> Any:
        for transform in self.transforms:
            state_spec = transform.transform_state_spec(state_spec)
        return state_spec

    def transform_output_spec(self, output_spec: Any) -> Any:
        for transform in self.transforms:
            output_spec = transform.transform_output_spec(output_spec)
        return output_spec

    def transform_input_spec(self, input_spec: Any) -> Any:
        for transform in self.transforms:
            input_spec = transform.transform_input_spec(input_spec)
        return input_spec
