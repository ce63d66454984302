"""Tools the environment runs for the model: a Python sandbox, MCP servers, a headless browser.

Submodules are imported on demand (``llmrl_core.tools.sandbox``, ``.python_interpreter``, ``.tool_calls``,
``.mcp_transform``, ``.browser``) so that the sandbox's child process, which imports this package,
stays light and never pulls in ``mcp`` or ``torch``.
"""
