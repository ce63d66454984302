"""TorchRL's ``torchrl.modules.llm.backends.vllm`` under llmrl's name (the README's import rule);
the functions live in the modules named here and load on first use (vLLM is heavy). The engines' own parts:
:mod:`.engine` (start, sample, score, shut down), :mod:`.worker` (the resident engine) and :mod:`.module_scan`."""

from typing import Any

_LAZY = {
    "make_vllm_worker": "llmrl_core.modules.backends.vllm.worker",
    "stateless_init_process_group": "llmrl_core.weight_sync.process_group",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
