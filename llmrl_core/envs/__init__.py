"""LLM environments with TorchRL's names and semantics, on plain dataclasses and tensors.

``ChatEnv`` (batched multi-turn chat), ``DatasetChatEnv`` (ChatEnv + ``DataLoadingPrimer``), GSM8K
(``GSM8KEnv``, ``make_gsm8k_env``, ``GSM8KPrepareQuestion``, ``GSM8KRewardParser``), Countdown (``CountdownEnv``,
``CountdownRewardParser``), MATH (``MATHEnv``, ``MATHRewardParser``), ``LLMEnv`` and
``LLMHashingEnv``, TorchRL's ``Transform`` and ``Compose`` (TensorDict transforms) and the built-in transforms.
"""

from typing import Any

from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.envs.competition_math import MATHEnv, MATHRewardParser
from llmrl_core.envs.countdown import CountdownEnv, CountdownRewardParser
from llmrl_core.envs.dataset_chat_env import DatasetChatEnv
from llmrl_core.envs.gsm8k import GSM8K_SYSTEM_PROMPT, GSM8KEnv, GSM8KPrepareQuestion, make_gsm8k_env
from llmrl_core.envs.gsm8k_reward import GSM8KRewardParser
from llmrl_core.envs.hashing_env import LLMHashingEnv
from llmrl_core.envs.ifeval import IFEvalEnv, IFEvalScoreData, IfEvalScorer
from llmrl_core.envs.llm_env import LLMEnv
from llmrl_core.envs.mlgym import MLGymWrapper, make_mlgym
from llmrl_core.envs.primer import DataLoadingPrimer
from llmrl_core.envs.primer_hosted import RayDataLoadingPrimer
from llmrl_core.envs.transforms import (
    AddThinkingPrompt,
    Compose,
    KLComputation,
    KLRewardTransform,
    PolicyVersion,
    RetrieveKL,
    RetrieveLogProb,
    TemplateTransform,
    Tokenizer,
    Transform,
    as_nested_tensor,
    as_padded_tensor,
)
from llmrl_core.envs.types import PromptRow, SlotState

_FROM_TRANSFORMS = ("BrowserTransform", "MCPToolTransform", "PythonInterpreter")


def __getattr__(name: str) -> Any:
    """The tools TorchRL exports from ``torchrl.envs.llm`` load on first use, from :mod:`llmrl_core.envs.transforms`
    (their modules pull in heavier dependencies)."""
    from llmrl_core.envs import transforms

    if name in _FROM_TRANSFORMS:
        return getattr(transforms, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "GSM8K_SYSTEM_PROMPT",
    "AddThinkingPrompt",
    "BrowserTransform",
    "ChatEnv",
    "Compose",
    "CountdownEnv",
    "CountdownRewardParser",
    "DataLoadingPrimer",
    "DatasetChatEnv",
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
    "MATHEnv",
    "MATHRewardParser",
    "MCPToolTransform",
    "MLGymWrapper",
    "PolicyVersion",
    "PromptRow",
    "PythonInterpreter",
    "RayDataLoadingPrimer",
    "RetrieveKL",
    "RetrieveLogProb",
    "SlotState",
    "TemplateTransform",
    "Tokenizer",
    "Transform",
    "as_nested_tensor",
    "as_padded_tensor",
    "make_gsm8k_env",
    "make_mlgym",
]
