"""Collectors: run environments and a policy together and hand out TensorDict batches (TorchRL's ``LLMCollector``,
and ``RayLLMCollector``, which runs one in a Dask actor). Each finished episode or sampled turn becomes a TensorDict
row as it happens (:mod:`llmrl_core.collectors.tensordict_batches`); ``rows(batch)`` reads a batch back episode by
episode.
``vLLMUpdater`` is importable from here as from TorchRL's ``torchrl.collectors.llm``."""

from llmrl_core.collectors.llm_collector import LLMCollector
from llmrl_core.collectors.ray_collector import RayLLMCollector
from llmrl_core.collectors.tensordict_batches import rows
from llmrl_core.weight_sync.updater import vLLMUpdater

__all__ = ["LLMCollector", "RayLLMCollector", "rows", "vLLMUpdater"]
