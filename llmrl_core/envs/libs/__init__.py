"""TorchRL's ``torchrl.envs.llm.libs`` under llmrl's name (the README's import rule: one search-and-replace);
the classes live in the modules imported here."""

from llmrl_core.envs.mlgym import MLGymWrapper, make_mlgym

__all__ = ["MLGymWrapper", "make_mlgym"]
