"""Env transforms (TorchRL's ``torchrl.envs.llm.transforms``): ``Transform`` and ``Compose`` (TorchRL's TensorDict
transform interface, :mod:`llmrl_core.envs.transforms.td_base`) and the built-in transforms (all of them TorchRL
TensorDict transforms), with TorchRL's generic tool framework
(``SimpleToolTransform``, ``ExecuteToolsInOrder``, ...). The tools (``PythonInterpreter``, ``MCPToolTransform``,
``BrowserTransform``), ``DataLoadingPrimer`` and the Dask-hosted primer and KL transforms (``RayDataLoadingPrimer``,
``RayKLRewardTransform``, ``RayRetrieveKL``) are importable from here too, as in TorchRL; they load on first use
(the tools' modules pull in heavier dependencies).
"""

from llmrl_core.envs.transforms.few_shot import FewShotExamples
from llmrl_core.envs.transforms.kl import KLComputation, KLRewardTransform, RetrieveKL, RetrieveLogProb
from llmrl_core.envs.transforms.policy_version import PolicyVersion
from llmrl_core.envs.transforms.stacking import as_nested_tensor, as_padded_tensor
from llmrl_core.envs.transforms.td_base import Compose, Transform
from llmrl_core.envs.transforms.template import TemplateTransform
from llmrl_core.envs.transforms.thinking import AddThinkingPrompt
from llmrl_core.envs.transforms.tokenizer import Tokenizer
from llmrl_core.envs.transforms.tool_calls import (
    ExecuteToolsInOrder,
    JSONCallParser,
    SimpleToolTransform,
    ToolCall,
    ToolRegistry,
    ToolService,
    XMLBlockParser,
)
from llmrl_core.lazy_exports import lazy_getattr

_LAZY = {
    "PythonInterpreter": "llmrl_core.tools.python_interpreter",
    "MCPToolTransform": "llmrl_core.tools.mcp_transform",
    "BrowserTransform": "llmrl_core.tools.browser",
    "DataLoadingPrimer": "llmrl_core.envs.primer",
    "RayDataLoadingPrimer": "llmrl_core.envs.primer_hosted",
    "RayKLRewardTransform": "llmrl_core.envs.transforms.kl_hosted",
    "RayRetrieveKL": "llmrl_core.envs.transforms.kl_hosted",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "AddThinkingPrompt",
    "Compose",
    "ExecuteToolsInOrder",
    "JSONCallParser",
    "SimpleToolTransform",
    "ToolCall",
    "ToolRegistry",
    "ToolService",
    "XMLBlockParser",
    "BrowserTransform",
    "DataLoadingPrimer",
    "MCPToolTransform",
    "PythonInterpreter",
    "RayDataLoadingPrimer",
    "RayKLRewardTransform",
    "RayRetrieveKL",
    "FewShotExamples",
    "KLComputation",
    "KLRewardTransform",
    "PolicyVersion",
    "RetrieveKL",
    "RetrieveLogProb",
    "TemplateTransform",
    "Tokenizer",
    "Transform",
    "as_nested_tensor",
    "as_padded_tensor",
]
