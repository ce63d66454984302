"""Data structures shared by envs, policies and trainers: conversations, content parts, env/policy batches.

Public names follow TorchRL's LLM API: ``Conversation``, ``ContentBase``, ``LLMData``, ``as_padded_tensor``,
``as_nested_tensor``, ``TopKRewardSelector``, the specs (``Composite``, ``NonTensor``, ``Unbounded``,
``Categorical``); plus ``Message``, ``ConversationBatch`` (a ragged batch of
conversations), ``Response`` (one slot's sampled turn) and ``TokenizedChat`` (rendered + tokenized chat with
assistant masks).
"""

from llmrl_core.data.chat_templates import NAMED_TEMPLATES, resolve_template
from llmrl_core.data.content import ContentBase
from llmrl_core.data.conversation import Conversation, ConversationBatch, Message, TokenizedChat
from llmrl_core.data.history import History
from llmrl_core.data.llm_data import LLMData, Response
from llmrl_core.data.tensor_specs import (
    Categorical,
    Composite,
    NonTensor,
    TensorSpec,
    Unbounded,
    UnboundedContinuous,
    UnboundedDiscrete,
)
from llmrl_core.data.tensors import as_nested_tensor, as_padded_tensor
from llmrl_core.data.topk import TopKRewardSelector

__all__ = [
    "NAMED_TEMPLATES",
    "Categorical",
    "Composite",
    "NonTensor",
    "TensorSpec",
    "Unbounded",
    "UnboundedContinuous",
    "UnboundedDiscrete",
    "ContentBase",
    "Conversation",
    "ConversationBatch",
    "History",
    "LLMData",
    "Message",
    "Response",
    "TokenizedChat",
    "TopKRewardSelector",
    "as_nested_tensor",
    "as_padded_tensor",
    "resolve_template",
]
