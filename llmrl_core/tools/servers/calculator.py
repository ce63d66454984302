"""A real MCP server: arithmetic and unit conversion (``python -m llmrl_core.tools.servers.calculator``).

Tools: ``add``, ``subtract``, ``multiply``, ``divide``, ``power``, ``evaluate`` (a safe arithmetic-expression
evaluator over an AST whitelist: numbers, + - * / // % **, parentheses, unary minus; no names, no calls),
and ``convert_units`` (length, mass, time, temperature). Errors (division by zero, unknown unit, bad
expression) come back to the client as tool errors with a message, not as a crash.

Transports: stdio (default) or Streamable HTTP bound to 127.0.0.1 (``--http --port N``; the host is
fixed to loopback on purpose). ``--crash-after N`` makes the process exit abruptly during the N-th
tool call: tests use it to check that a client survives a server dying mid-call.
"""

from __future__ import annotations

import argparse
import ast
import math
import operator
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

_LENGTH_M = {"mm": 1e-3, "cm": 1e-2, "m": 1.0, "km": 1e3, "in": 0.0254, "ft": 0.3048, "yd": 0.9144, "mi": 1609.344}
_MASS_KG = {"mg": 1e-6, "g": 1e-3, "kg": 1.0, "t": 1e3, "oz": 0.028349523125, "lb": 0.45359237}
_TIME_S = {"ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "day": 86400.0, "week": 604800.0}
_TEMPERATURE = ("C", "F", "K")
_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_MAX_EXPONENT = 1000


def _eval_node(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval_node(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (limit {_MAX_EXPONENT})")
        return _BINOPS[type(node.op)](left, right)
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


def evaluate_expression(expression: str) -> float:
    """Evaluate an arithmetic expression safely (numbers and + - * / // % ** only)."""
    if len(expression) > 500:
        raise ValueError("expression is longer than 500 characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from exc
    return _eval_node(tree)


def _to_celsius(value: float, unit: str) -> float:
    return {"C": value, "F": (value - 32.0) * 5.0 / 9.0, "K": value - 273.15}[unit]


def _from_celsius(value: float, unit: str) -> float:
    return {"C": value, "F": value * 9.0 / 5.0 + 32.0, "K": value + 273.15}[unit]


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """Convert ``value`` between two units of the same kind (length, mass, time or temperature)."""
    if from_unit in _TEMPERATURE and to_unit in _TEMPERATURE:
        return _from_celsius(_to_celsius(value, from_unit), to_unit)
    for table in (_LENGTH_M, _MASS_KG, _TIME_S):
        if from_unit in table and to_unit in table:
            return value * table[from_unit] / table[to_unit]
    known = sorted({*_LENGTH_M, *_MASS_KG, *_TIME_S, *_TEMPERATURE})
    raise ValueError(f"cannot convert {from_unit!r} to {to_unit!r} (known units, same kind only: {', '.join(known)})")


def build_server(crash_after: int | None = None) -> MCPServer:
    """The calculator MCP server; ``crash_after`` = exit abruptly during that call number (tests)."""
    server = MCPServer("llmrl-calculator", instructions="Arithmetic and unit conversion.", log_level="WARNING")
    calls = {"n": 0}

    def _tick() -> None:
        calls["n"] += 1
        if crash_after is not None and calls["n"] >= crash_after:
            os._exit(3)

    @server.tool()
    def add(a: float, b: float) -> float:
        """Return a + b."""
        _tick()
        return a + b

    @server.tool()
    def subtract(a: float, b: float) -> float:
        """Return a - b."""
        _tick()
        return a - b

    @server.tool()
    def multiply(a: float, b: float) -> float:
        """Return a * b."""
        _tick()
        return a * b

    @server.tool()
    def divide(a: float, b: float) -> float:
        """Return a / b (error if b is 0)."""
        _tick()
        if b == 0:
            raise ToolError("division by zero")
        return a / b

    @server.tool()
    def power(base: float, exponent: float) -> float:
        """Return base ** exponent."""
        _tick()
        if abs(exponent) > _MAX_EXPONENT:
            raise ToolError(f"exponent {exponent} is too large (limit {_MAX_EXPONENT})")
        try:
            return math.pow(base, exponent)
        except (OverflowError, ValueError) as exc:
            raise ToolError(f"power({base}, {exponent}): {exc}") from exc

    @server.tool()
    def evaluate(expression: str) -> float:
        """Evaluate an arithmetic expression such as '(2 + 3) * 4 / 5' (numbers and + - * / // % ** only)."""
        _tick()
        try:
            return evaluate_expression(expression)
        except (ValueError, ArithmeticError) as exc:
            raise ToolError(str(exc)) from exc

    @server.tool()
    def convert_units(value: float, from_unit: str, to_unit: str) -> float:
        """Convert a value between units of length (mm cm m km in ft yd mi), mass (mg g kg t oz lb),
        time (ms s min h day week) or temperature (C F K)."""
        _tick()
        try:
            return convert(value, from_unit, to_unit)
        except ValueError as exc:
            raise ToolError(str(exc)) from exc

    return server


def main(argv: list[str] | None = None) -> None:
    """Command line: stdio by default, ``--http`` for Streamable HTTP on 127.0.0.1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", action="store_true", help="serve Streamable HTTP on 127.0.0.1 instead of stdio")
    parser.add_argument("--port", type=int, default=8765, help="HTTP port (with --http)")
    parser.add_argument("--crash-after", type=int, default=None, help="exit abruptly during this call (tests)")
    args = parser.parse_args(argv)
    server = build_server(args.crash_after)
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.port)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
