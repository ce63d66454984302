"""TorchRL's ``torchrl.envs.llm.datasets.gsm8k`` under llmrl's name (the README's import rule: one search-and-replace);
the classes live in the modules imported here."""

from llmrl_core.envs.gsm8k import GSM8KEnv, GSM8KPrepareQuestion, make_gsm8k_env

__all__ = ["GSM8KEnv", "GSM8KPrepareQuestion", "make_gsm8k_env"]
