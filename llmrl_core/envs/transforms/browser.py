"""TorchRL's ``torchrl.envs.llm.transforms.browser`` under llmrl's name (the README's import rule);
the classes live in the modules imported here."""

from llmrl_core.tools.browser import BrowserTransform

__all__ = ["BrowserTransform"]
