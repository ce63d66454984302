"""User components by config: a setting names a TorchRL-shaped class as ``module:Class``, and the flow builds that
class where it would build its own (the rollouts' policy wrapper, the loss, the advantage, an env transform), with
the setting's keyword arguments added. The class is checked to be a subclass of llmrl's own before anything starts,
so a typo or a wrong base is one line naming the setting."""

from __future__ import annotations

from typing import Any

from llmrl_core.user_code import import_object


def component_class(path: str, base: type, setting: str) -> type:
    """The class ``path`` (``module:Class``) names, which must be ``base`` or a subclass of it."""
    cls = import_object(path, setting)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{setting}: {path!r} must name a subclass of {base.__module__}.{base.__qualname__}")
    return cls


def policy_base(backend: str) -> type:
    """The wrapper class a rollout policy of ``backend`` (``vllm`` / ``transformers``) must extend."""
    from llmrl_core.modules.policies import TransformersWrapper, vLLMWrapper

    return TransformersWrapper if backend == "transformers" else vLLMWrapper


def check_components(cfg: Any) -> None:
    """Import and check each ``module:Class`` a GRPO config names (``rollout.policy_class``, ``train.loss_class``,
    ``train.advantage_class``, ``train.kl_transform_class``, ``train.kl_reward_class``), raising ValueError naming the
    setting."""
    from llmrl_core.envs.transforms import KLComputation, RetrieveLogProb
    from llmrl_core.objectives import GRPOLoss, MCAdvantage

    if cfg.rollout.policy_class:
        component_class(cfg.rollout.policy_class, policy_base(cfg.rollout.backend), "rollout.policy_class")
    if cfg.train.loss_class:
        component_class(cfg.train.loss_class, GRPOLoss, "train.loss_class")
    if cfg.train.advantage_class:
        component_class(cfg.train.advantage_class, MCAdvantage, "train.advantage_class")
    if cfg.train.kl_transform_class:
        component_class(cfg.train.kl_transform_class, RetrieveLogProb, "train.kl_transform_class")
    if cfg.train.kl_reward_class:
        component_class(cfg.train.kl_reward_class, KLComputation, "train.kl_reward_class")
