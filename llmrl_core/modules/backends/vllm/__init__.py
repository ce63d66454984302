"""TorchRL's ``torchrl.modules.llm.backends.vllm`` under llmrl's name (the README's import rule);
the functions live in the modules named here and load on first use (vLLM is heavy). The engines' own parts:
:mod:`.engine` (start, sample, score, shut down), :mod:`.worker` (the resident engine) and :mod:`.module_scan`."""

from llmrl_core.lazy_exports import lazy_getattr

_LAZY = {
    "make_vllm_worker": "llmrl_core.modules.backends.vllm.worker",
    "stateless_init_process_group": "llmrl_core.weight_sync.process_group",
}

__all__ = list(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
