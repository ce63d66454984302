"""TorchRL's ``torchrl.envs.llm.datasets`` under llmrl's name (the README's import rule: one search-and-replace);
the classes live in the modules imported here."""

from llmrl_core.envs.competition_math import MATHEnv
from llmrl_core.envs.countdown import CountdownEnv
from llmrl_core.envs.gsm8k import GSM8KEnv, GSM8KPrepareQuestion, make_gsm8k_env
from llmrl_core.envs.ifeval import IFEvalEnv, IfEvalScorer

__all__ = ["CountdownEnv", "GSM8KEnv", "GSM8KPrepareQuestion", "IFEvalEnv", "IfEvalScorer", "MATHEnv", "make_gsm8k_env"]
