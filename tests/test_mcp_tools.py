"""Tool-call parsing, the shipped calculator MCP server, the MCP client pool and MCPToolTransform."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.ports import free_port
from llmrl_core.tools.mcp_client import MCPClientPool, MCPConnectionError
from llmrl_core.tools.mcp_transform import MCPToolTransform, compile_tool_call_pattern, parse_pattern_calls
from llmrl_core.tools.servers.calculator import convert, evaluate_expression
from llmrl_core.tools.tool_calls import parse_tool_calls

CALC = {"command": sys.executable, "args": ["-m", "llmrl_core.tools.servers.calculator"]}


# --- parsing -----------------------------------------------------------------------------------
def test_parse_xml_forms():
    text = 'x <tool>calc.add\n{"a": 2, "b": 3}</tool> y <tool name="calc.divide" tag="t1">{"a": 1, "b": 4}</tool>'
    calls = parse_tool_calls(text, "xml")
    assert [(c.tool, c.args, c.tag, c.form) for c in calls] == [
        ("calc.add", {"a": 2, "b": 3}, None, "xml"),
        ("calc.divide", {"a": 1, "b": 4}, "t1", "xml"),
    ]
    assert parse_tool_calls("<tool>calc.list</tool>")[0].args == {}
    assert parse_tool_calls(text, "json") == []


def test_parse_json_forms():
    tagged = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    fenced = '```json\n[{"tool": "sub", "args": {"a": 5, "b": 1}}, {"name": "mul", "arguments": "{\\"a\\": 2}"}]\n```'
    whole = '{"message": "adding", "tools": [{"tool": "add", "args": {"a": 9, "b": 1}}]}'
    openai = '<tool_call>{"type": "function", "function": {"name": "neg", "arguments": {"x": 1}}}</tool_call>'
    assert [(c.tool, c.args) for c in parse_tool_calls(tagged + "\n" + fenced, "json")] == [
        ("add", {"a": 1, "b": 2}),
        ("sub", {"a": 5, "b": 1}),
        ("mul", {"a": 2}),
    ]
    assert [(c.tool, c.args) for c in parse_tool_calls(whole)] == [("add", {"a": 9, "b": 1})]
    assert [(c.tool, c.args) for c in parse_tool_calls(openai)] == [("neg", {"x": 1})]
    assert parse_tool_calls('```json\n{"just": "data"}\n```') == []
    assert parse_tool_calls(tagged, "xml") == []


def test_parse_keeps_order_and_reports_bad_arguments():
    text = '<tool_call>{"name": "b", "arguments": {}}</tool_call> then <tool>a\n{not json}</tool>'
    calls = parse_tool_calls(text)
    assert [c.tool for c in calls] == ["b", "a"]
    assert calls[1].error and "not valid JSON" in calls[1].error
    broken = parse_tool_calls("<tool_call>{oops</tool_call>")
    assert len(broken) == 1 and broken[0].error
    with pytest.raises(ValueError, match="format"):
        parse_tool_calls("x", "yaml")  # type: ignore[arg-type]


# --- the shipped server's logic, checked by hand ------------------------------------------------
def test_calculator_functions_against_hand_values():
    assert evaluate_expression("(2 + 3) * 4 / 5") == 4.0
    assert evaluate_expression("-2 ** 2 + 7 // 2 % 3") == -4 + 0
    assert convert(100, "C", "F") == pytest.approx(212.0)
    assert convert(0, "K", "C") == pytest.approx(-273.15)
    assert convert(1, "mi", "km") == pytest.approx(1.609344)
    assert convert(1, "lb", "g") == pytest.approx(453.59237)
    assert convert(2, "h", "min") == pytest.approx(120.0)
    for bad in ("__import__('os')", "a + 1", "2 ** 100000", "open('x')"):
        with pytest.raises(ValueError):
            evaluate_expression(bad)
    with pytest.raises(ValueError, match="cannot convert"):
        convert(1, "kg", "m")


# --- client pool over stdio and HTTP ------------------------------------------------------------
@pytest.fixture(scope="module")
def pool():
    with MCPClientPool({"calc": CALC}, call_timeout=10) as p:
        yield p


def test_stdio_round_trip_lists_and_calls_tools(pool):
    assert {"calc.add", "calc.divide", "calc.evaluate", "calc.convert_units"} <= set(pool.tools)
    assert pool.tools["calc.add"].input_schema["required"] == ["a", "b"]
    assert pool.call("calc.add", {"a": 2, "b": 3}).text == "5.0"
    assert pool.call("convert_units", {"value": 5, "from_unit": "km", "to_unit": "m"}).text == "5000.0"
    failed = pool.call("calc.divide", {"a": 1, "b": 0})
    assert not failed.ok and "division by zero" in failed.error
    unknown = pool.call("calc.sqrt", {"x": 4})
    assert not unknown.ok and "unknown tool" in unknown.error and "calc.add" in unknown.error


def test_calls_run_concurrently(tmp_path):
    server = tmp_path / "slow_server.py"
    server.write_text(
        textwrap.dedent(
            """
            import time
            from mcp.server.mcpserver import MCPServer
            server = MCPServer("slow", log_level="WARNING")

            @server.tool()
            async def wait(seconds: float) -> str:
                import anyio
                await anyio.sleep(seconds)
                return f"waited {seconds}"

            server.run("stdio")
            """
        )
    )
    with MCPClientPool({"slow": {"command": sys.executable, "args": [str(server)]}}, call_timeout=10) as slow:
        start = time.monotonic()
        results = slow.call_many([("slow.wait", {"seconds": 1.0})] * 4)
        elapsed = time.monotonic() - start
        assert [r.text for r in results] == ["waited 1.0"] * 4
        assert elapsed < 2.5, elapsed  # 4 x 1 s sequentially would be >= 4 s
        start = time.monotonic()
        late = slow.call("slow.wait", {"seconds": 30}, timeout=1.0)
        assert not late.ok and "no answer within 1 s" in late.error
        assert time.monotonic() - start < 3
        assert slow.call("slow.wait", {"seconds": 0.1}).text == "waited 0.1"  # reconnected


def test_server_crashing_mid_call_gives_an_error_not_a_hang():
    crashy = {"command": sys.executable, "args": ["-m", "llmrl_core.tools.servers.calculator", "--crash-after", "2"]}
    with MCPClientPool({"calc": crashy}, call_timeout=20) as p:
        assert p.call("calc.add", {"a": 1, "b": 1}).ok
        start = time.monotonic()
        crashed = p.call("calc.add", {"a": 1, "b": 2})
        assert time.monotonic() - start < 5
        assert not crashed.ok and "server failed" in crashed.error
        again = p.call("calc.multiply", {"a": 3, "b": 4})  # a fresh server process
        assert again.ok and again.text == "12.0"


def test_bad_server_command_fails_at_start_naming_it():
    with pytest.raises(MCPConnectionError, match="'broken'"):
        MCPClientPool({"broken": {"command": sys.executable, "args": ["-c", "import sys; sys.exit(4)"]}}, 10)
    with pytest.raises(ValueError, match="exactly one of"):
        MCPClientPool({"x": {"args": []}})


def test_http_round_trip():
    port = free_port()
    proc = subprocess.Popen([CALC["command"], *CALC["args"], "--http", "--port", str(port)])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        with MCPClientPool({"web": {"url": f"http://127.0.0.1:{port}/mcp"}}) as p:
            assert p.call("web.evaluate", {"expression": "2 ** 10"}).text == "1024"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# --- the transform in ChatEnv ------------------------------------------------------------------
def test_transform_appends_tool_messages_for_each_slot():
    transform = MCPToolTransform({"calc": CALC}, timeout=10)
    try:
        env = ChatEnv(batch_size=2, system_prompt=transform.describe_tools())
        env.append_transform(transform)
        assert "calc.convert_units" in env.system_prompt
        env.reset(["q1", "q2"])
        out = env.step(
            [
                '<tool_call>{"name": "calc.add", "arguments": {"a": 2, "b": 3}}</tool_call>'
                '<tool>calc.convert_units\n{"value": 100, "from_unit": "C", "to_unit": "F"}</tool>',
                '<tool name="divide">{"a": 1, "b": 0}</tool> <tool>calc.add\n{bad json}</tool>',
            ]
        )
        history = out["history", "prompt"]
        first = [c for r, c in zip(history[0].role, history[0].content, strict=True) if r == "tool"]
        second = [c for r, c in zip(history[1].role, history[1].content, strict=True) if r == "tool"]
        assert first == [
            "Tool calc.add executed successfully:\n5.0",
            "Tool calc.convert_units executed successfully:\n212.0",
        ]
        assert second[0].startswith("Tool calc.divide failed:\n") and "division by zero" in second[0]
        assert second[1].startswith("Tool calc.add failed:\n") and "not valid JSON" in second[1]
        assert out["info"][0]["num_tool_calls"] == 2 and out["info"][1]["tool_errors"] == 2
        out = env.step(["The answers are in.", "No tools this time."])
        assert out["history", "prompt"][0][-1].role == "assistant"
    finally:
        transform.close()


# --- TorchRL 0.14.1 arguments ------------------------------------------------------------------
def test_tool_call_pattern_parsing_and_errors():
    pattern = compile_tool_call_pattern(r"<call:([\w.]+)>(.*?)</call>")
    calls = parse_pattern_calls(
        'a <call:calc.add>{"a": 2, "b": 3}</call> <call:calc.list></call> <call:x>[1]</call>', pattern
    )
    assert [(c.tool, c.args, c.error) for c in calls] == [
        ("calc.add", {"a": 2, "b": 3}, None),
        ("calc.list", {}, None),
        ("x", {}, "arguments must be a JSON object, got list"),
    ]
    with pytest.raises(ValueError, match="exactly 2 groups"):
        compile_tool_call_pattern(r"<call>(.*?)</call>")
    with pytest.raises(ValueError, match="not a valid regex"):
        compile_tool_call_pattern(r"<call>(")
    with pytest.raises(ValueError, match="exactly 2 groups"):  # checked before any server starts
        MCPToolTransform({"calc": CALC}, r"(only one group)")


def test_transform_takes_torchrl_positional_arguments():
    # TorchRL: (servers, tool_call_pattern, tool_name, timeout); tool_name is the role of the result messages
    transform = MCPToolTransform({"calc": CALC}, r"<call:([\w.]+)>\n?(.*?)</call>", "observation", 10.0)
    try:
        assert transform.tool_role == transform.tool_name == "observation" and transform.timeout == 10.0
        env = ChatEnv(batch_size=1).append_transform(transform)
        env.reset(["q"])
        out = env.step(['<call:calc.add>{"a": 2, "b": 3}</call> <tool_call>{"name": "calc.add"}</tool_call>'])
        history = out["history", "prompt"][0]
        results = [c for r, c in zip(history.role, history.content, strict=True) if r == "observation"]
        assert results == ["Tool calc.add executed successfully:\n5.0"]  # only the pattern's form is parsed
    finally:
        transform.close()


def test_it_is_torchrls_tool_transform_and_its_override_points_work():
    """TorchRL's hooks: ``_extract_tool_calls`` gives (server, tool, args_json); a subclass overriding
    ``_execute_tool_sync`` is run through it, and its calls are counted in the slot's info."""
    from llmrl_core.envs.transforms.tools import ToolTransformBase

    class Audited(MCPToolTransform):
        seen: list = []

        def _execute_tool_sync(self, server_name, tool_name, args_json):
            self.seen.append((server_name, tool_name, json.loads(args_json)))
            if tool_name == "divide":
                return {"success": False, "error": "audited: no division"}
            return super()._execute_tool_sync(server_name, tool_name, args_json)

    transform = Audited({"calc": CALC}, timeout=10)
    try:
        assert isinstance(transform, ToolTransformBase)
        text = (
            '<tool>calc.add\n{"a": 2, "b": 3}</tool> '
            '<tool_call>{"name": "calc.divide", "arguments": {"a": 1, "b": 2}}</tool_call>'
        )
        assert transform._extract_tool_calls(text) == [
            ("calc", "add", '{"a": 2, "b": 3}'),
            ("calc", "divide", '{"a": 1, "b": 2}'),
        ]
        env = ChatEnv(batch_size=2).append_transform(transform)
        env.reset(["q1", "q2"])
        out = env.step([text, "no tools"])
        history = out["history", "prompt"]
        results = [c for r, c in zip(history[0].role, history[0].content, strict=True) if r == "tool"]
        assert results == [
            "Tool calc.add executed successfully:\n5.0",
            "Tool calc.divide failed:\naudited: no division",
        ]
        assert history[1].role[-1] == "assistant"
        assert transform.seen == [("calc", "add", {"a": 2, "b": 3}), ("calc", "divide", {"a": 1, "b": 2})]
        assert out["info"][0]["num_tool_calls"] == 2 and out["info"][0]["tool_errors"] == 1
        assert [c["name"] for c in out["info"][0]["tool_calls"]] == ["calc.add", "calc.divide"]
    finally:
        transform.close()
