"""TorchRL's ``torchrl.envs.llm.datasets.ifeval`` under llmrl's name (the README's import rule: one search-and-replace);
the classes live in the modules imported here."""

from llmrl_core.envs.ifeval import IFEvalEnv

__all__ = ["IFEvalEnv"]
