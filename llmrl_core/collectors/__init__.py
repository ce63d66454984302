"""Collectors: run environments and a policy together and hand out trajectories (TorchRL's ``LLMCollector``)."""

from llmrl_core.collectors.llm_collector import LLMCollector
from llmrl_core.collectors.trajectory import DialogTurn, Trajectory

__all__ = ["DialogTurn", "LLMCollector", "Trajectory"]
