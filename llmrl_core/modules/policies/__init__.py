"""Policy wrappers and their data containers (TorchRL's ``torchrl.modules.llm.policies``)."""

from llmrl_core.modules.policies.common import ChatHistory, LogProbs, Masks, Text, Tokens

__all__ = ["ChatHistory", "LogProbs", "Masks", "Text", "Tokens"]
