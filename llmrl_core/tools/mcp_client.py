"""A synchronous front for MCP clients (the ``mcp`` package): several servers, concurrent calls, timeouts.

The ``mcp`` SDK is async (anyio). Environments are synchronous, so :class:`MCPClientPool` runs one asyncio
event loop in a background thread and owns one long-lived ``mcp.Client`` per server there. Each server
lives in its own task, which enters the client's context and waits: the SDK's transports use task groups
that must be entered and left by the same task. Calls come from the caller's thread as coroutines
submitted to the loop (``asyncio.run_coroutine_threadsafe``); a batch of calls runs concurrently with
``asyncio.gather``, each under its own timeout, so a hung or crashed server costs at most the timeout and
yields an error result, never an exception or a hang. A server that died is restarted on its next use.

Server specs (TorchRL's ``servers`` dict, plus ``url`` for HTTP)::

    {"calc": {"command": sys.executable, "args": ["-m", "llmrl_core.tools.servers.calculator"]},
     "remote": {"url": "http://127.0.0.1:8765/mcp"}}

Tools are addressed as ``"<server>.<tool>"``; a bare tool name works when only one server has it.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class MCPConnectionError(RuntimeError):
    """An MCP server could not be started or connected (the message names the server and the cause)."""


@dataclass(frozen=True)
class MCPServerSpec:
    """How to reach one MCP server: a command for stdio, or a Streamable HTTP ``url``."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None

    @classmethod
    def from_config(cls, name: str, config: Mapping[str, Any] | MCPServerSpec) -> MCPServerSpec:
        """Validate one entry of a ``servers`` dict (errors name the server and the field)."""
        if isinstance(config, MCPServerSpec):
            return config
        if not isinstance(config, Mapping):
            raise TypeError(f"MCP server {name!r}: config must be a dict, got {type(config).__name__}")
        unknown = set(config) - {"command", "args", "env", "cwd", "url"}
        if unknown:
            raise ValueError(f"MCP server {name!r}: unknown field(s) {sorted(unknown)}")
        if bool(config.get("command")) == bool(config.get("url")):
            raise ValueError(f"MCP server {name!r}: give exactly one of 'command' (stdio) or 'url' (HTTP)")
        if "." in name:
            raise ValueError(f"MCP server name {name!r} must not contain '.' (tools are named '<server>.<tool>')")
        args = config.get("args", ())
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"MCP server {name!r}: 'args' must be a list of strings")
        return cls(name, config.get("command"), tuple(args), config.get("env"), config.get("cwd"), config.get("url"))


@dataclass(frozen=True)
class MCPToolInfo:
    """One tool a server offers."""

    server: str
    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)

    @property
    def qualified_name(self) -> str:
        """``<server>.<tool>``."""
        return f"{self.server}.{self.name}"


@dataclass
class MCPCallResult:
    """The outcome of one tool call: ``ok`` with ``text``, or not ok with ``error`` saying why."""

    tool: str
    ok: bool
    text: str = ""
    error: str = ""
    duration_s: float = 0.0


class _Connection:
    def __init__(self, spec: MCPServerSpec) -> None:
        self.spec = spec
        self.client: Any = None
        self.tools: dict[str, MCPToolInfo] = {}
        self.task: asyncio.Task | None = None
        self.ready: asyncio.Event | None = None
        self.stop: asyncio.Event | None = None
        self.error: str | None = None
        self.lock = asyncio.Lock()
        self.errlog = tempfile.TemporaryFile(mode="w+", prefix=f"mcp-{spec.name}-")

    def stderr_tail(self, limit: int = 800) -> str:
        try:
            self.errlog.flush()
            self.errlog.seek(0, os.SEEK_END)
            size = self.errlog.tell()
            self.errlog.seek(max(0, size - limit))
            return self.errlog.read().strip()
        except (OSError, ValueError):
            return ""


def _result_text(result: Any) -> str:
    parts = []
    for item in getattr(result, "content", None) or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        else:
            parts.append(f"[{kind or type(item).__name__} content]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(str(result.structured_content))
    return "\n".join(parts)


class MCPClientPool:
    """Connections to several MCP servers, used synchronously from any thread."""

    def __init__(
        self,
        servers: Mapping[str, Mapping[str, Any] | MCPServerSpec],
        connect_timeout: float = 30.0,
        call_timeout: float = 10.0,
    ) -> None:
        if not servers:
            raise ValueError("MCPClientPool needs at least one server")
        self.specs = {name: MCPServerSpec.from_config(name, cfg) for name, cfg in servers.items()}
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self._conns = {name: _Connection(spec) for name, spec in self.specs.items()}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-client-loop", daemon=True)
        self._thread.start()
        self._closed = False
        self._retired: list[asyncio.Task] = []
        try:
            self._submit(self._connect_all(), timeout=connect_timeout + 5)
        except BaseException:
            self.close()
            raise

    # --- loop plumbing ---------------------------------------------------------------------------
    def _submit(self, coro: Any, timeout: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def _transport(self, spec: MCPServerSpec, errlog: Any) -> Any:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        if spec.url:
            return spec.url
        params = StdioServerParameters(command=spec.command, args=list(spec.args), env=spec.env, cwd=spec.cwd)
        return stdio_client(params, errlog=errlog)

    async def _run_connection(self, conn: _Connection, ready: asyncio.Event, stop: asyncio.Event) -> None:
        from mcp import Client

        client = None
        try:
            async with Client(self._transport(conn.spec, conn.errlog)) as client:
                tools, cursor = [], None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                conn.tools = {
                    t.name: MCPToolInfo(conn.spec.name, t.name, t.description or "", dict(t.input_schema or {}))
                    for t in tools
                }
                conn.client, conn.error = client, None
                ready.set()
                await stop.wait()
        except BaseException as exc:  # noqa: BLE001 (recorded and reported, the loop must survive)
            conn.error = f"{type(exc).__name__}: {exc}"
        finally:
            if client is not None and conn.client is client:
                conn.client = None
            ready.set()

    async def _ensure(self, conn: _Connection) -> None:
        async with conn.lock:
            await self._ensure_locked(conn)

    async def _ensure_locked(self, conn: _Connection) -> None:
        if conn.task is not None and not conn.task.done() and conn.client is not None:
            return
        if conn.task is not None and not conn.task.done():
            conn.stop.set()  # type: ignore[union-attr]  # the old connection winds down in the background
            self._retired.append(conn.task)
        conn.client = None
        conn.ready, conn.stop = asyncio.Event(), asyncio.Event()
        conn.task = asyncio.ensure_future(self._run_connection(conn, conn.ready, conn.stop))
        try:
            await asyncio.wait_for(conn.ready.wait(), self.connect_timeout)
        except TimeoutError:
            conn.error = f"no answer within {self.connect_timeout:g} s"
        if conn.client is None:
            where = conn.spec.url or " ".join([conn.spec.command or "", *conn.spec.args])
            tail = conn.stderr_tail()
            raise MCPConnectionError(
                f"MCP server {conn.spec.name!r} ({where}) could not be connected: {conn.error}"
                + (f"\nserver stderr:\n{tail}" if tail else "")
            )

    async def _connect_all(self) -> None:
        await asyncio.gather(*(self._ensure(c) for c in self._conns.values()))

    # --- public API ------------------------------------------------------------------------------
    @property
    def tools(self) -> dict[str, MCPToolInfo]:
        """Every tool of every server, by qualified name ``<server>.<tool>``."""
        return {t.qualified_name: t for c in self._conns.values() for t in c.tools.values()}

    def resolve(self, name: str) -> MCPToolInfo | str:
        """The tool for ``name`` (qualified, or bare if unambiguous), or an error message."""
        tools = self.tools
        if name in tools:
            return tools[name]
        matches = [t for t in tools.values() if t.name == name]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            return f"tool name {name!r} is ambiguous: use one of {sorted(t.qualified_name for t in matches)}"
        return f"unknown tool {name!r}; available: {', '.join(sorted(tools))}"

    async def _call_one(self, name: str, arguments: dict[str, Any], timeout: float) -> MCPCallResult:
        start = time.monotonic()
        tool = self.resolve(name)
        if isinstance(tool, str):
            return MCPCallResult(name, False, error=tool)
        conn = self._conns[tool.server]
        try:
            await self._ensure(conn)
            result = await asyncio.wait_for(conn.client.call_tool(tool.name, arguments), timeout)
        except TimeoutError:
            self._mark_broken(conn)
            return MCPCallResult(
                tool.qualified_name, False, error=f"no answer within {timeout:g} s", duration_s=time.monotonic() - start
            )
        except Exception as exc:  # noqa: BLE001 (a dead server, a protocol error: reported to the model)
            self._mark_broken(conn)
            tail = conn.stderr_tail(300)
            detail = f"{type(exc).__name__}: {exc}" + (f" (server stderr: {tail})" if tail else "")
            return MCPCallResult(tool.qualified_name, False, error=f"the server failed: {detail}")
        text = _result_text(result)
        elapsed = time.monotonic() - start
        if getattr(result, "is_error", False):
            return MCPCallResult(tool.qualified_name, False, error=text or "tool error", duration_s=elapsed)
        return MCPCallResult(tool.qualified_name, True, text=text, duration_s=elapsed)

    def _mark_broken(self, conn: _Connection) -> None:
        """After a failed or timed-out call, drop the connection: the next call starts the server afresh."""
        conn.client = None

    async def _call_many(self, calls: Sequence[tuple[str, dict[str, Any]]], timeout: float) -> list[MCPCallResult]:
        results = await asyncio.gather(*(self._call_one(n, a, timeout) for n, a in calls), return_exceptions=True)
        return [
            r if isinstance(r, MCPCallResult) else MCPCallResult(n, False, error=f"{type(r).__name__}: {r}")
            for (n, _), r in zip(calls, results, strict=True)
        ]

    def call(self, name: str, arguments: dict[str, Any] | None = None, timeout: float | None = None) -> MCPCallResult:
        """Call one tool and wait for it (never raises for server-side problems)."""
        return self.call_many([(name, arguments or {})], timeout)[0]

    def call_many(
        self, calls: Sequence[tuple[str, dict[str, Any]]], timeout: float | None = None
    ) -> list[MCPCallResult]:
        """Call several tools concurrently; each gets ``timeout`` seconds. Results come in call order."""
        if self._closed:
            raise RuntimeError("MCPClientPool is closed")
        if not calls:
            return []
        per_call = self.call_timeout if timeout is None else timeout
        return self._submit(self._call_many(list(calls), per_call), timeout=per_call + self.connect_timeout + 10)

    async def _shutdown(self) -> None:
        for conn in self._conns.values():
            if conn.stop is not None:
                conn.stop.set()
        tasks = [c.task for c in self._conns.values() if c.task is not None] + self._retired
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    def close(self) -> None:
        """Stop every server (stdio processes exit) and the background loop."""
        if self._closed:
            return
        self._closed = True
        if self._loop.is_running():
            try:
                self._submit(self._shutdown(), timeout=10)
            except Exception:  # noqa: BLE001 (best effort at shutdown)
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        for conn in self._conns.values():
            conn.errlog.close()

    def __enter__(self) -> MCPClientPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
