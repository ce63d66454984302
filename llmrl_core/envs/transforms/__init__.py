"""Env transforms (TorchRL names): the ``Transform`` base class and the built-in transforms."""

from llmrl_core.envs.transforms.base import Transform
from llmrl_core.envs.transforms.few_shot import FewShotExamples
from llmrl_core.envs.transforms.kl import KLComputation, KLRewardTransform, RetrieveKL, RetrieveLogProb
from llmrl_core.envs.transforms.policy_version import PolicyVersion
from llmrl_core.envs.transforms.template import TemplateTransform, Tokenizer
from llmrl_core.envs.transforms.thinking import AddThinkingPrompt

__all__ = [
    "AddThinkingPrompt",
    "FewShotExamples",
    "KLComputation",
    "KLRewardTransform",
    "PolicyVersion",
    "RetrieveKL",
    "RetrieveLogProb",
    "TemplateTransform",
    "Tokenizer",
    "Transform",
]
