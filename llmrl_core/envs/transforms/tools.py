"""TorchRL's ``torchrl.envs.llm.transforms.tools`` under llmrl's name (the README's import rule);
the classes live in the modules imported here."""

from llmrl_core.tools.mcp_transform import MCPToolTransform
from llmrl_core.tools.python_interpreter import PythonInterpreter

__all__ = ["MCPToolTransform", "PythonInterpreter"]
