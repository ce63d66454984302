"""TorchRL's ``torchrl.envs.llm.reward.countdown`` under llmrl's name (the README's import rule:
one search-and-replace); the class lives in :mod:`llmrl_core.envs.countdown`."""

from llmrl_core.envs.countdown import CountdownRewardParser

__all__ = ["CountdownRewardParser"]
