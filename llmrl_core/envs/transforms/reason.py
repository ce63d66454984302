"""TorchRL's ``torchrl.envs.llm.transforms.reason`` under llmrl's name (the README's import rule);
the classes live in the modules imported here."""

from llmrl_core.envs.transforms.thinking import AddThinkingPrompt

__all__ = ["AddThinkingPrompt"]
