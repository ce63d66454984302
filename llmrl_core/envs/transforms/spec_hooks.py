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

    def _through_chain(self, hook: str, spec: Any) -> Any:
        for transform in self.transforms:
            spec = getattr(transform, hook)(spec)
        return spec

    def transform_observation_spec(self, observation_spec: Any) -> Any:
        return self._through_chain("transform_observation_spec", observation_spec)

    def transform_reward_spec(self, reward_spec: Any) -> Any:
        return self._through_chain("transform_reward_spec", reward_spec)

    def transform_done_spec(self, done_spec: Any) -> Any:
        return self._through_chain("transform_done_spec", done_spec)

    def transform_action_spec(self, action_spec: Any) -> Any:
        return self._through_chain("transform_action_spec", action_spec)

    def transform_state_spec(self, state_spec: Any) -> Any:
        return self._through_chain("transform_state_spec", state_spec)

    def transform_output_spec(self, output_spec: Any) -> Any:
        return self._through_chain("transform_output_spec", output_spec)

    def transform_input_spec(self, input_spec: Any) -> Any:
        return self._through_chain("transform_input_spec", input_spec)
