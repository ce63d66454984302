"""TorchRL's ``torchrl.modules.llm.backends.vllm`` under llmrl's name (the README's import rule);
the functions live in the modules imported here."""

from llmrl_core.policies.vllm_worker import make_vllm_worker
from llmrl_core.weight_sync.process_group import stateless_init_process_group

__all__ = ["make_vllm_worker", "stateless_init_process_group"]
