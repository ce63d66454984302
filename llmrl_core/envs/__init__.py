"""LLM environments with TorchRL's names and semantics, on plain dataclasses and tensors.

``ChatEnv`` (batched multi-turn chat), ``DatasetChatEnv`` (ChatEnv + ``DataLoadingPrimer``), GSM8K
(``GSM8KEnv``, ``make_gsm8k_env``, ``GSM8KPrepareQuestion``, ``GSM8KRewardParser``), ``LLMEnv`` and
``LLMHashingEnv``, and the ``Transform`` base with the built-in transforms.
"""

from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.envs.dataset_chat_env import DatasetChatEnv
from llmrl_core.envs.gsm8k import GSM8K_SYSTEM_PROMPT, GSM8KEnv, GSM8KPrepareQuestion, make_gsm8k_env
from llmrl_core.envs.gsm8k_reward import GSM8KRewardParser
from llmrl_core.envs.hashing_env import LLMHashingEnv
from llmrl_core.envs.ifeval import IFEvalEnv, IFEvalScoreData, IfEvalScorer
from llmrl_core.envs.llm_env import LLMEnv
from llmrl_core.envs.mlgym import MLGymWrapper, make_mlgym
from llmrl_core.envs.primer import DataLoadingPrimer
from llmrl_core.envs.transforms import (
    AddThinkingPrompt,
    KLComputation,
    KLRewardTransform,
    PolicyVersion,
    RetrieveKL,
    RetrieveLogProb,
    TemplateTransform,
    Tokenizer,
    Transform,
)
from llmrl_core.envs.types import EnvOutput, PromptRow, SlotState

__all__ = [
    "GSM8K_SYSTEM_PROMPT",
    "AddThinkingPrompt",
    "ChatEnv",
    "DataLoadingPrimer",
    "DatasetChatEnv",
    "EnvOutput",
    "GSM8KEnv",
    "GSM8KPrepareQuestion",
    "GSM8KRewardParser",
    "IFEvalEnv",
    "IFEvalScoreData",
    "IfEvalScorer",
    "KLComputation",
    "KLRewardTransform",
    "LLMEnv",
    "LLMHashingEnv",
    "MLGymWrapper",
    "PolicyVersion",
    "PromptRow",
    "RetrieveKL",
    "RetrieveLogProb",
    "SlotState",
    "TemplateTransform",
    "Tokenizer",
    "Transform",
    "make_gsm8k_env",
    "make_mlgym",
]
