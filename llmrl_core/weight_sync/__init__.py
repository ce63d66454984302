"""Push new policy weights into resident vLLM engines without restarting them (``vLLMUpdater``)."""

from llmrl_core.weight_sync.process_group import stateless_init_process_group
from llmrl_core.weight_sync.updater import WEIGHT_SYNC_MODES, vLLMUpdater
from llmrl_core.weight_sync.worker_extension import WEIGHT_SYNC_EXTENSION, WeightSyncExtension

__all__ = [
    "WEIGHT_SYNC_EXTENSION",
    "WEIGHT_SYNC_MODES",
    "WeightSyncExtension",
    "stateless_init_process_group",
    "vLLMUpdater",
]
