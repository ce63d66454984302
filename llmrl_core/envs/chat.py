"""TorchRL's ``torchrl.envs.llm.chat`` under llmrl's name (the README's import rule: one search-and-replace);
the classes live in the modules imported here."""

from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.envs.dataset_chat_env import DatasetChatEnv

__all__ = ["ChatEnv", "DatasetChatEnv"]
