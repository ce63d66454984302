"""TorchRL's ``torchrl.envs.llm.envs`` under llmrl's name (the README's import rule: one search-and-replace);
the classes live in the modules imported here."""

from llmrl_core.envs.hashing_env import LLMHashingEnv
from llmrl_core.envs.llm_env import LLMEnv

__all__ = ["LLMEnv", "LLMHashingEnv"]
