"""Policy wrappers and their data containers (TorchRL's ``torchrl.modules.llm.policies``)."""

from llmrl_core.modules.policies.outputs import ChatHistory, LogProbs, Masks, Text, Tokens

__all__ = ["ChatHistory", "LogProbs", "Masks", "Text", "Tokens"]

from llmrl_core.modules.policies.llm_wrapper_base import LLMWrapperBase  # noqa: E402
from llmrl_core.modules.policies.transformers_wrapper import TransformersWrapper  # noqa: E402
from llmrl_core.modules.policies.vllm_wrapper import vLLMWrapper  # noqa: E402

__all__ += ["LLMWrapperBase", "TransformersWrapper", "vLLMWrapper"]
