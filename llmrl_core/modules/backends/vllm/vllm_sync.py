"""TorchRL's ``torchrl.modules.llm.backends.vllm.vllm_sync`` under llmrl's name (the README's import rule);
the functions live in the modules imported here."""

from llmrl_core.modules.backends.vllm.worker import make_vllm_worker

__all__ = ["make_vllm_worker"]
