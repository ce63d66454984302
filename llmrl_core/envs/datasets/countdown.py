"""TorchRL's ``torchrl.envs.llm.datasets.countdown`` under llmrl's name (the README's import rule:
one search-and-replace); the class lives in :mod:`llmrl_core.envs.countdown`."""

from llmrl_core.envs.countdown import CountdownEnv

__all__ = ["CountdownEnv"]
