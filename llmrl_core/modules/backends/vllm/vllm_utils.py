"""TorchRL's ``torchrl.modules.llm.backends.vllm.vllm_utils`` under llmrl's name (the README's import rule);
the functions live in the modules imported here."""

from llmrl_core.weight_sync.process_group import stateless_init_process_group

__all__ = ["stateless_init_process_group"]
