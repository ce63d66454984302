"""TorchRL's ``torchrl.collectors.llm.weight_update``: the weight updaters a collector pushes through."""

from llmrl_core.weight_sync.updater import vLLMUpdater

__all__ = ["vLLMUpdater"]
