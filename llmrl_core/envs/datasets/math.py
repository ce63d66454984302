"""TorchRL's ``torchrl.envs.llm.datasets.math`` under llmrl's name (the README's import rule:
one search-and-replace); the class lives in :mod:`llmrl_core.envs.competition_math`."""

from llmrl_core.envs.competition_math import MATHEnv

__all__ = ["MATHEnv"]
