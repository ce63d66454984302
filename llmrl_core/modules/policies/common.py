"""TorchRL's ``torchrl.modules.llm.policies.common``: the policy data containers
(:mod:`llmrl_core.modules.policies.outputs`) and :class:`~llmrl_core.modules.policies.llm_wrapper_base.LLMWrapperBase`,
importable from here as in TorchRL. llmrl's own modules import them from where they live."""

from llmrl_core.modules.policies.llm_wrapper_base import LLMWrapperBase
from llmrl_core.modules.policies.outputs import ChatHistory, LogProbs, Masks, Text, Tokens

__all__ = ["ChatHistory", "LLMWrapperBase", "LogProbs", "Masks", "Text", "Tokens"]
