"""TorchRL's ``torchrl.envs.llm.transforms.format`` under llmrl's name (the README's import rule);
the classes live in the modules imported here."""

from llmrl_core.envs.transforms.template import TemplateTransform

__all__ = ["TemplateTransform"]
