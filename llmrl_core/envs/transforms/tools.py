"""TorchRL's ``torchrl.envs.llm.transforms.tools`` under llmrl's name (the README's import rule): llmrl's tools
(``PythonInterpreter`` in its sandbox, ``MCPToolTransform``) and TorchRL's generic tool framework
(:mod:`llmrl_core.envs.transforms.tool_calls`); the classes live in the modules imported here."""

from llmrl_core.envs.transforms.tool_calls import (
    ExecuteToolsInOrder,
    JSONCallParser,
    LLMToolParser,
    ParseResult,
    SimpleToolTransform,
    ToolCall,
    ToolRegistry,
    ToolService,
    ToolTransformBase,
    XMLBlockParser,
)
from llmrl_core.tools.mcp_transform import MCPToolTransform
from llmrl_core.tools.python_interpreter import PythonInterpreter

__all__ = [
    "ExecuteToolsInOrder",
    "JSONCallParser",
    "LLMToolParser",
    "MCPToolTransform",
    "ParseResult",
    "PythonInterpreter",
    "SimpleToolTransform",
    "ToolCall",
    "ToolRegistry",
    "ToolService",
    "ToolTransformBase",
    "XMLBlockParser",
]
