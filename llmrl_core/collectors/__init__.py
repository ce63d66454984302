"""Collectors: run environments and a policy together and hand out trajectories (TorchRL's ``LLMCollector``, and
``RayLLMCollector``, which runs one in a Dask actor)."""

from llmrl_core.collectors.llm_collector import LLMCollector
from llmrl_core.collectors.ray_collector import RayLLMCollector
from llmrl_core.collectors.trajectory import DialogTurn, Trajectory

__all__ = ["DialogTurn", "LLMCollector", "RayLLMCollector", "Trajectory"]
