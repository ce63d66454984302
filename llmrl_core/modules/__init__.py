"""TorchRL's ``torchrl.modules.llm`` in llmrl: policy wrappers and the LLM data containers.

``from torchrl.modules.llm import X`` becomes ``from llmrl_core.modules import X``.
"""

from llmrl_core.modules.policies import *  # noqa: F403 - the same names as TorchRL's torchrl.modules.llm
from llmrl_core.modules.policies import __all__  # noqa: F401
