"""TorchRL's ``torchrl.envs.llm.reward`` under llmrl's name (the README's import rule: one search-and-replace);
the classes live in the modules imported here."""

from llmrl_core.envs.competition_math import MATHRewardParser
from llmrl_core.envs.countdown import CountdownRewardParser
from llmrl_core.envs.gsm8k_reward import GSM8KRewardParser
from llmrl_core.envs.ifeval import IFEvalScoreData, IfEvalScorer

__all__ = ["CountdownRewardParser", "GSM8KRewardParser", "IFEvalScoreData", "IfEvalScorer", "MATHRewardParser"]
