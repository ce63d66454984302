"""IFEval for llmrl: the 25 instruction checkers, the four IFEval metrics, the reward, scorer and environment.

* :mod:`~llmrl_core.envs.ifeval.registry`: instruction id -> checker, kwargs validation, :func:`check_instruction`.
* :mod:`~llmrl_core.envs.ifeval.evaluation`: strict/loose scoring of a response, :class:`IFEvalScoreData`,
  dataset-level :func:`summarize_scores`.
* :mod:`~llmrl_core.envs.ifeval.reward`: TorchRL's reward weighting and format bonus.
* :class:`IfEvalScorer` (a ChatEnv transform) and :class:`IFEvalEnv` (a DatasetChatEnv over the shipped prompts).

The checkers are our own: the maintained packages (e.g. ``if-verifiable``, TorchRL's copy of Google's code)
need nltk's Punkt data, a download that cannot happen offline. Language checks use ``langdetect``.
"""

from llmrl_core.envs.ifeval.env import IFEVAL_QUESTION_TEMPLATE, IFEVAL_SYSTEM_PROMPT, IFEvalEnv, IFEvalPrepareQuestion
from llmrl_core.envs.ifeval.evaluation import IFEvalScoreData, loose_variants, score_response, summarize_scores
from llmrl_core.envs.ifeval.registry import (
    INSTRUCTION_CHECKERS,
    INSTRUCTION_IDS,
    InstructionArgumentError,
    UnknownInstructionError,
    check_instruction,
    validate_instructions,
)
from llmrl_core.envs.ifeval.reward import IFEVAL_WEIGHTS, extract_blocks, ifeval_reward
from llmrl_core.envs.ifeval.scorer import IfEvalScorer

__all__ = [
    "IFEVAL_QUESTION_TEMPLATE",
    "IFEVAL_SYSTEM_PROMPT",
    "IFEVAL_WEIGHTS",
    "INSTRUCTION_CHECKERS",
    "INSTRUCTION_IDS",
    "IFEvalEnv",
    "IFEvalPrepareQuestion",
    "IFEvalScoreData",
    "IfEvalScorer",
    "InstructionArgumentError",
    "UnknownInstructionError",
    "check_instruction",
    "extract_blocks",
    "ifeval_reward",
    "loose_variants",
    "score_response",
    "summarize_scores",
    "validate_instructions",
]
