"""TorchRL's ``torchrl.collectors.llm.base`` under llmrl's name (the README's import rule: one search-and-replace);
the classes live in the modules imported here."""

from llmrl_core.collectors.llm_collector import LLMCollector

__all__ = ["LLMCollector"]
