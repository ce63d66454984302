"""Policy backends: a resident vLLM engine for sampling and transformers for teacher-forced scoring."""

from llmrl_core.policies.distributions import CategoricalSequential

__all__ = ["CategoricalSequential"]
