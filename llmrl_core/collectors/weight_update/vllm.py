"""TorchRL's ``torchrl.collectors.llm.weight_update.vllm`` path: ``from torchrl.collectors.llm.weight_update.vllm
import vLLMUpdater`` becomes ``from llmrl_core.collectors.weight_update.vllm import vLLMUpdater`` (the import rule of
the README); the updater lives in :mod:`llmrl_core.weight_sync.updater`."""

from llmrl_core.weight_sync.updater import vLLMUpdater

__all__ = ["vLLMUpdater"]
