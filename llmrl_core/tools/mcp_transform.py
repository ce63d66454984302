"""``MCPToolTransform``: the env calls MCP tools that the assistant asks for, and appends the results.

It is TorchRL's tool transform (a :class:`~llmrl_core.envs.transforms.tool_calls.ToolTransformBase`). After each
step the answer of every row whose episode goes on is parsed for tool calls (JSON and XML-tag forms, see
:mod:`llmrl_core.tools.tool_calls`); all calls of all rows go out together and run concurrently
(:class:`~llmrl_core.tools.mcp_client.MCPClientPool`), each under ``timeout``. Every call
adds one message with role ``"tool"`` (outside the assistant mask), worded as TorchRL words it::

    Tool calc.add executed successfully:
    5.0

    Tool calc.divide failed:
    division by zero

An unknown tool, arguments that are not JSON, a server error, a timeout or a crashed server all become a
"failed" message with the reason; nothing raises out of the env. Servers are started (stdio) or connected
(HTTP) when the transform is built, as in TorchRL, so a bad configuration fails early and loudly.
:meth:`MCPToolTransform.describe_tools` gives the text to put in the system prompt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from llmrl_core.envs.transforms.tool_calls import ToolTransformBase
from llmrl_core.tools.mcp_client import MCPCallResult, MCPClientPool, MCPServerSpec, MCPToolInfo
from llmrl_core.tools.tool_calls import ToolCall, ToolCallFormat, parse_tool_calls


def format_tool_result(result: MCPCallResult, max_chars: int) -> str:
    """One tool message in TorchRL's wording, cut to ``max_chars`` characters of payload."""
    body = result.text if result.ok else result.error
    if len(body) > max_chars:
        body = body[:max_chars] + f"\n[output truncated: {len(body)} characters in all]"
    verdict = "executed successfully" if result.ok else "failed"
    return f"Tool {result.tool} {verdict}:\n{body}"


def compile_tool_call_pattern(pattern: str) -> re.Pattern[str]:
    """TorchRL's ``tool_call_pattern``: a regex with two groups, the tool name and its JSON arguments."""
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except re.error as err:
        raise ValueError(f"tool_call_pattern {pattern!r} is not a valid regex ({err})") from None
    if compiled.groups != 2:
        raise ValueError(
            f"tool_call_pattern must have exactly 2 groups (tool name, JSON arguments), {pattern!r} has "
            f"{compiled.groups}"
        )
    return compiled


def parse_pattern_calls(text: str, pattern: re.Pattern[str]) -> list[ToolCall]:
    """The calls ``pattern`` finds in ``text``; arguments that are not a JSON object set the call's ``error``."""
    calls = []
    for match in pattern.finditer(text):
        name, body = (match.group(1) or "").strip(), (match.group(2) or "").strip()
        args: Any = {}
        error = None
        if body:
            try:
                args = json.loads(body)
            except json.JSONDecodeError as exc:
                args, error = {}, f"arguments are not valid JSON ({exc.msg})"
        if not isinstance(args, dict):
            args, error = {}, f"arguments must be a JSON object, got {type(args).__name__}"
        calls.append(ToolCall(name, args, None, "pattern", error, match.start()))
    return calls


class MCPToolTransform(ToolTransformBase):
    """Call MCP tools named in the assistant's message and append the results as ``tool`` messages.

    TorchRL's override points work: ``_extract_tool_calls(text)`` (``(server, tool, args_json)`` triples),
    ``_execute_tool_sync(server, tool, args_json)`` (``{"success", "result"}`` or ``{"success", "error"}``) and
    ``_process_batch_item``; a subclass that overrides one of them is run row by row, through them.

    The first four arguments are TorchRL's, in its order; the others are llmrl's (keyword-only).

    Args:
        servers: ``{name: {"command": ..., "args": [...], "env": {...}}}`` for stdio servers, or
            ``{name: {"url": "http://127.0.0.1:PORT/mcp"}}`` for Streamable HTTP (TorchRL's ``servers``).
        tool_call_pattern: as in TorchRL, a regex with two groups (``server.tool`` name, JSON arguments),
            searched with ``re.DOTALL``; when given it replaces ``tool_call_format``. None (default): the
            forms of ``tool_call_format``, which include TorchRL's default ``<tool>name\nargs</tool>``.
        tool_name: role of the result messages (TorchRL's name for it); ``tool_role`` overrides it.
        timeout: seconds per tool call.
        tool_call_format: ``"auto"`` (JSON and XML forms), ``"json"`` or ``"xml"``.
        connect_timeout: seconds to start/connect each server. max_calls: calls honoured per message (others
            fail). max_result_chars: result text kept per call.
    """

    use_step = True

    def __init__(
        self,
        servers: Mapping[str, Mapping[str, Any] | MCPServerSpec],
        tool_call_pattern: str | None = None,
        tool_name: str = "tool",
        timeout: float = 10.0,
        *,
        tool_call_format: ToolCallFormat = "auto",
        connect_timeout: float = 30.0,
        tool_role: str | None = None,
        max_calls: int = 8,
        max_result_chars: int = 4000,
    ) -> None:
        super().__init__()
        if tool_call_format not in ("auto", "json", "xml"):
            raise ValueError(f"tool_call_format must be 'auto', 'json' or 'xml', got {tool_call_format!r}")
        if timeout <= 0 or max_calls < 1 or max_result_chars < 1:
            raise ValueError("timeout, max_calls and max_result_chars must be positive")
        self.tool_call_pattern = tool_call_pattern
        self._pattern = compile_tool_call_pattern(tool_call_pattern) if tool_call_pattern is not None else None
        self.tool_call_format: ToolCallFormat = tool_call_format
        self.timeout = timeout
        self.tool_role = tool_role if tool_role is not None else tool_name
        self.max_calls = max_calls
        self.max_result_chars = max_result_chars
        self.pool = MCPClientPool(servers, connect_timeout=connect_timeout, call_timeout=timeout)

    @property
    def tool_name(self) -> str:
        """TorchRL's name for the role of the result messages (the same as ``tool_role``)."""
        return self.tool_role

    def parse_calls(self, text: str) -> list[ToolCall]:
        """The tool calls in one assistant message (``tool_call_pattern`` if set, else ``tool_call_format``)."""
        if self._pattern is not None:
            return parse_pattern_calls(text, self._pattern)
        return parse_tool_calls(text, self.tool_call_format)

    @property
    def tools(self) -> dict[str, MCPToolInfo]:
        """The available tools by qualified name ``<server>.<tool>``."""
        return self.pool.tools

    def describe_tools(self) -> str:
        """A plain-text tool list with JSON argument schemas and the call syntax, for a system prompt."""
        lines = ["You can call these tools:"]
        for name, tool in sorted(self.tools.items()):
            schema = json.dumps(tool.input_schema.get("properties", {}), separators=(",", ":"))
            lines.append(f"- {name}: {tool.description.strip()} Arguments: {schema}")
        lines.append(
            'To call a tool, write <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call> '
            "(or <tool>TOOL_NAME\\n{json arguments}</tool>). Results come back in a tool message."
        )
        return "\n".join(lines)

    # --- TorchRL's override points ----------------------------------------------------------------
    def _extract_tool_calls(self, text: str) -> list[tuple[str, str, str]]:
        """TorchRL's triples ``(server, tool, args_json)`` of the calls in ``text`` (calls that do not parse are
        left out here; the env reports them as failed calls)."""
        triples = []
        for call in self.parse_calls(text):
            if call.error or not call.tool:
                continue
            server, _, tool = call.tool.rpartition(".")
            triples.append((server or next(iter(self.pool.specs), ""), tool, json.dumps(call.args)))
        return triples

    def _execute_tool_sync(self, server_name: str, tool_name: str, args_json: str) -> dict[str, Any]:
        """One call, blocking: TorchRL's ``{"success": True, "result": ...}`` or
        ``{"success": False, "error": ...}``."""
        try:
            args = json.loads(args_json) if args_json.strip() else {}
        except json.JSONDecodeError as exc:
            return {"success": False, "error": f"Failed to parse tool arguments: {exc}"}
        (result,) = self.pool.call_many([(f"{server_name}.{tool_name}", args)], self.timeout)
        return {"success": True, "result": result.text} if result.ok else {"success": False, "error": result.error}

    def _process_batch_item(self, content: str, index: int) -> list[str] | None:
        """The result messages of one row's calls (None without calls)."""
        return self._run_rows([content], [index])[0]

    # --- llmrl: every row's calls at once -------------------------------------------------------
    def _overridden(self) -> bool:
        own = MCPToolTransform
        kind = type(self)
        return any(
            getattr(kind, name) is not getattr(own, name)
            for name in ("_extract_tool_calls", "_execute_tool_sync", "_process_batch_item")
        )

    def _process_rows(self, contents: list[str], rows: list[int]) -> list[list[str] | None]:
        """All rows' calls go out together (run concurrently by the client pool); a subclass overriding TorchRL's
        hooks is run row by row through them."""
        if self._overridden():
            return [self._torchrl_row(contents[i], i) for i in rows]
        return self._run_rows([contents[i] for i in rows], rows)

    def _torchrl_row(self, content: str, index: int) -> list[str] | None:
        if type(self)._process_batch_item is not MCPToolTransform._process_batch_item:
            return self._process_batch_item(content, index)
        messages = []
        for server, tool, args_json in self._extract_tool_calls(content):
            outcome = self._execute_tool_sync(server, tool, args_json)
            ok = bool(outcome.get("success"))
            verdict = "executed successfully" if ok else "failed"
            text = f"Tool {server}.{tool} {verdict}:\n{outcome.get('result') if ok else outcome.get('error')}"
            messages.append(text)
            self._record_call(index, f"{server}.{tool}", args_json, text, not ok)
        return messages or None

    def _run_rows(self, contents: list[str], rows: list[int]) -> list[list[str] | None]:
        per_row = [self.parse_calls(text) for text in contents]
        requests = [
            (call.tool, call.args)
            for calls in per_row
            for call in calls[: self.max_calls]
            if not call.error and call.tool
        ]
        results = iter(self.pool.call_many(requests, self.timeout)) if requests else iter(())
        out: list[list[str] | None] = []
        for index, calls in zip(rows, per_row, strict=True):
            messages = []
            for k, call in enumerate(calls):
                if k >= self.max_calls:
                    result = MCPCallResult(call.tool, False, error=f"skipped: at most {self.max_calls} calls per turn")
                elif call.error or not call.tool:
                    result = MCPCallResult(call.tool or "<unnamed>", False, error=call.error or "no tool name")
                else:
                    result = next(results)
                text = format_tool_result(result, self.max_result_chars)
                messages.append(text)
                self._record_call(index, result.tool, call.args, text, not result.ok)
            out.append(messages or None)
        return out

    def close(self) -> None:
        """Stop the MCP servers and the client loop."""
        self.pool.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    def __repr__(self) -> str:
        return f"MCPToolTransform(servers={sorted(self.pool.specs)}, tools={len(self.tools)})"
