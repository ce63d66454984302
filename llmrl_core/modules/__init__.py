"""TorchRL's ``torchrl.modules.llm`` in llmrl: policy wrappers and the LLM data containers.

``from torchrl.modules.llm import X`` becomes ``from llmrl_core.modules import X``.
"""

from llmrl_core.lazy_exports import lazy_getattr
from llmrl_core.modules.policies import *  # noqa: F403 - the same names as TorchRL's torchrl.modules.llm
from llmrl_core.modules.policies import __all__ as _POLICY_NAMES

# TorchRL's backends and utilities of ``torchrl.modules.llm``; they load on first use (vLLM is heavy)
_LAZY = {
    "make_vllm_worker": "llmrl_core.modules.backends.vllm.worker",
    "vLLMWorker": "llmrl_core.modules.backends.vllm.worker",
    "LLMOnDevice": "llmrl_core.modules.backends.vllm.worker",
    "stateless_init_process_group": "llmrl_core.weight_sync.process_group",
    "CategoricalSequential": "llmrl_core.modules.policies.distributions",
}

__all__ = [*_POLICY_NAMES, *_LAZY]


__getattr__ = lazy_getattr(__name__, _LAZY)
