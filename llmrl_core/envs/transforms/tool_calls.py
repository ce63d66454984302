"""TorchRL's generic tool framework (``torchrl.envs.llm.transforms.tools``): tools written as TorchRL writes them.

A tool transform reads the policy's last message at the end of ``("history", "prompt")`` in a step's ``"next"``
data, runs the tools it names and extends that history with one ``tool`` message per result (rows with fewer
results are padded with TorchRL's ``"<none>"`` placeholder messages, which rendering and llmrl's conversations
skip). :class:`~llmrl_core.envs.chat_env.ChatEnv` takes what the transform appended into the slot's conversation
(:func:`llmrl_core.envs.td_list_calls.adopt_conversations`), so the next prompt carries the tool's output.

- :class:`ToolTransformBase`: subclass it and implement ``_process_batch_item(content, index)`` (the result strings
  of one row, or None);
- :class:`SimpleToolTransform`: tools as a dict of callables, calls found by a regex (TorchRL's default
  ``<tool>name\\n{json args}</tool>``) or by a parser;
- :class:`ExecuteToolsInOrder`: tool services in a :class:`ToolRegistry`, calls parsed by a pluggable parser
  (:class:`XMLBlockParser`, :class:`JSONCallParser`, or any :class:`LLMToolParser`) and run in the order written.

Unlike TorchRL's, these run in every input mode on the list calls the collector and the flows make (they carry the
conversation as ``("history", "prompt")``); on TorchRL's own TensorDict calls the history is there in history mode,
as in TorchRL. ``SimpleToolTransform``'s ``timeout`` is enforced: a call still running after it is reported as a
failed call (its thread is left to finish on its own). These tools run in the env's process: they are the user's
code, not the model's (model-written code goes to ``PythonInterpreter``'s sandbox).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

from tensordict import TensorDictBase, lazy_stack

from llmrl_core.data.history import History
from llmrl_core.envs.transforms.td_base import Transform


class ToolService(Protocol):
    """A named tool: called with keyword arguments (its ``schema_in``), returns a dict (its ``schema_out``)."""

    name: str
    schema_in: dict[str, Any]
    schema_out: dict[str, Any]

    def __call__(self, **kwargs: Any) -> dict[str, Any]: ...


class ToolRegistry:
    """The tool services an :class:`ExecuteToolsInOrder` may call, by name."""

    def __init__(self, services: Sequence[ToolService] = ()) -> None:
        self._services: dict[str, ToolService] = {}
        for service in services:
            self.register(service)

    def register(self, service: ToolService) -> None:
        """Add ``service`` under its ``name`` (a service of the same name is replaced)."""
        self._services[service.name] = service

    def get(self, name: str) -> ToolService:
        """The service called ``name``; ``KeyError`` naming it when there is none."""
        try:
            return self._services[name]
        except KeyError:
            raise KeyError(f"Unknown tool: {name}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._services


@dataclass
class ToolCall:
    """One tool call found in an answer: the tool's name, its arguments and an optional tag (a caller's label).

    TorchRL's three fields, then what llmrl's own parser (:func:`llmrl_core.tools.tool_calls.parse_tool_calls`)
    adds: the ``form`` it was written in, the ``error`` when its arguments do not parse, and its ``start`` offset.
    """

    tool: str
    args: dict[str, Any] = field(default_factory=dict)
    tag: str | None = None
    form: str = ""
    error: str | None = None
    start: int = 0


class ParseResult(TypedDict):
    """What a parser found in an answer: the text left once the calls are taken out, the calls in the order written,
    and the parser's notes (``{"count": number of calls}``)."""

    text: str
    calls: list[ToolCall]
    meta: dict[str, Any]


class LLMToolParser(Protocol):
    """A parser: an answer (text, or a dict with ``"text"``) to a :class:`ParseResult`."""

    def __call__(self, response: str | dict[str, Any]) -> ParseResult: ...


def _parse_result(text: str, calls: list[ToolCall]) -> ParseResult:
    return ParseResult(text=text, calls=calls, meta={"count": len(calls)})


class XMLBlockParser:
    """Finds ``<tool name="NAME" tag="TAG">{json arguments}</tool>`` blocks (``tag`` optional); a body that is not
    JSON is passed whole as ``{"raw": body}``, an empty one as no arguments. The text left is the answer without the
    blocks, stripped."""

    _block = re.compile(
        r'<tool\s+name="(?P<name>[^"]+)"(?:\s+tag="(?P<tag>[^"]+)")?\s*>\s*(?P<body>.*?)\s*</tool>', re.DOTALL
    )

    def __call__(self, response: str | dict[str, Any]) -> ParseResult:
        text = response if isinstance(response, str) else str(response.get("text", ""))
        calls: list[ToolCall] = []

        def take(match: re.Match[str]) -> str:
            body = match.group("body")
            try:
                args = json.loads(body) if body.strip() else {}
            except json.JSONDecodeError:
                args = {"raw": body}
            calls.append(ToolCall(tool=match.group("name"), args=args, tag=match.group("tag")))
            return ""

        left = self._block.sub(take, text).strip()
        return _parse_result(left, calls)


class JSONCallParser:
    """Reads function-calling JSON: ``{"message": text, "tools": [{"tool": name, "args": {...}, "tag": ...}]}`` (a
    string is decoded first; a string that is not JSON is plain text with no calls)."""

    def __call__(self, response: str | dict[str, Any]) -> ParseResult:
        if isinstance(response, str):
            try:
                response = json.loads(response)
            except json.JSONDecodeError:
                return _parse_result(response, [])
        calls = [ToolCall(**call) for call in response.get("tools", [])]
        return _parse_result(response.get("message", ""), calls)


class ToolTransformBase(Transform):
    """Base of TorchRL-style tool transforms: on each step, :meth:`_process_batch_item` gets each row's last message
    (the policy's answer) and returns the results to add (one ``tool_role`` message each) or None.

    ``use_step`` (True) runs the tool in ``_step`` (env steps); False runs it in ``_call`` instead (TorchRL's switch:
    calling the other one raises ``RuntimeError``). Override :meth:`_format_result` to change how each result reads.

    Unlike TorchRL's, a row whose episode has ended (``done`` set by the env's turn limit or a transform before this
    one, e.g. a reward parser that saw the answer) runs no tool: its output would have no reader. A subclass may
    note the calls it ran (:meth:`_record_call`): ChatEnv keeps them in the slot's ``info`` (the tool metrics).
    """

    use_step: bool = True
    tool_role: str = "tool"

    def _reset_slots(self, tensordict: TensorDictBase | None, tensordict_reset: TensorDictBase) -> list[int]:
        """The env slots a ``_reset`` starts new episodes in (:meth:`_reset_rows`, as slots)."""
        return [self._slot_of(i) for i in self._reset_rows(tensordict, tensordict_reset)]

    def _record_call(self, index: int, tool: str, arguments: Any, result: str, failed: bool) -> None:
        """Note one call run for row ``index`` (:meth:`~llmrl_core.envs.transforms.td_base.Transform._note_row`):
        the env keeps it in the slot's ``info["tool_calls"]`` and counts it in ``info["num_tool_calls"]`` /
        ``info["tool_errors"]`` (the flows' and evaluators' tool metrics)."""
        self._note_row(index, tool_call=(tool, arguments, result, failed))

    def _validate_and_extract_history(self, next_tensordict: TensorDictBase) -> tuple[History, History]:
        """The prompt history of the step and its last message per row; ``RuntimeError`` outside a ChatEnv or
        without a history (TorchRL's TensorDict calls carry it in history mode only)."""
        if self.parent is None:
            raise RuntimeError(f"{type(self).__name__} must be used with a ChatEnv")
        history = next_tensordict.get(("history", "prompt"), None)
        if history is None:
            raise RuntimeError(
                f"{type(self).__name__} must be used with a ChatEnv in history mode (on step(td) the prompt history "
                "is there in history mode only; llmrl's list calls carry it in every mode)"
            )
        return history, history[..., -1]

    def _process_batch_item(self, content: str, index: int) -> list[str] | None:
        """The result strings for row ``index`` whose answer is ``content``, or None when it calls no tool."""
        raise NotImplementedError(f"{type(self).__name__} must implement _process_batch_item()")

    def _format_result(self, result: str) -> str:
        """How one result reads in its ``tool`` message (as it is, by default)."""
        return result

    def _inject_results_to_history(
        self, history: History, results: list[list[str] | None], next_tensordict: TensorDictBase
    ) -> TensorDictBase:
        """Extend ``history`` (in place) with one ``tool_role`` message per result, rows padded to the longest with
        ``"<none>"`` placeholders, and set it back as the step's prompt; nothing changes when no row has a result."""
        if all(not rows for rows in results):
            return next_tensordict
        width = max(len(rows) for rows in results if rows)
        messages = []
        for rows in results:
            row = [History(role=self.tool_role, content=self._format_result(r)) for r in rows or []]
            row += [History(role="<none>", content="") for _ in range(width - len(row))]
            messages.append(lazy_stack(row))
        history.extend(lazy_stack(messages), dim=-1)
        next_tensordict["history"].prompt = history
        return next_tensordict

    def _process_tensordict(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        if next_tensordict.batch_dims > 1:
            with next_tensordict.view(-1) as flat:
                self._process_tensordict(flat)
            return next_tensordict
        history, last = self._validate_and_extract_history(next_tensordict)
        content = last.content
        contents = [content] if isinstance(content, str) else list(content)
        done = next_tensordict.get("done", None)
        rows = [i for i in range(len(contents)) if done is None or not bool(done[i].any())]
        results: list[list[str] | None] = [None] * len(contents)
        for i, found in zip(rows, self._process_rows(contents, rows), strict=True):
            results[i] = found
        return self._inject_results_to_history(history, results, next_tensordict)

    def _process_rows(self, contents: list[str], rows: list[int]) -> list[list[str] | None]:
        """:meth:`_process_batch_item` of each row in ``rows`` (one after the other; a subclass may run them
        concurrently). Rows whose episode has ended (``done``) are not given: nobody reads a tool's output there."""
        return [self._process_batch_item(contents[i], i) for i in rows]

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        if not self.use_step:
            raise RuntimeError(f"{type(self).__name__} uses _call(), not _step(). Set use_step=False.")
        return self._process_tensordict(next_tensordict)

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        if self.use_step:
            raise RuntimeError(f"{type(self).__name__} uses _step(), not _call(). Set use_step=True.")
        return self._process_tensordict(next_tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return tensordict_reset


class ExecuteToolsInOrder(ToolTransformBase):
    """Runs the calls ``parser`` finds in an answer through ``registry``'s services, in the order written, and adds
    one ``tool`` message reporting them all (a ``<tool_results>`` block: each call's JSON result, or its error).

    Args:
        registry: the services that may be called.
        parser: finds the calls (e.g. :class:`XMLBlockParser`).
        stop_on_error: stop at the first failing call (default False: report it and go on).
        pass_state_to_tools: call each service with ``_state={}`` too (default True, as TorchRL).
    """

    def __init__(
        self,
        registry: ToolRegistry,
        parser: LLMToolParser,
        stop_on_error: bool = False,
        pass_state_to_tools: bool = True,
    ) -> None:
        super().__init__()
        self.registry = registry
        self.parser = parser
        self.stop_on_error = stop_on_error
        self.pass_state_to_tools = pass_state_to_tools
        self.tool_role = "tool"

    def _process_batch_item(self, content: str, index: int) -> list[str] | None:
        calls = self.parser(content)["calls"]
        if not calls:
            return None
        outputs: list[dict[str, Any]] = []
        for position, call in enumerate(calls):
            try:
                kwargs = dict(call.args)
                if self.pass_state_to_tools:
                    kwargs["_state"] = {}
                output = dict(self.registry.get(call.tool)(**kwargs))
            except Exception as err:
                outputs.append({"_tool": call.tool, "_index": position, "error": str(err)})
                if self.stop_on_error:
                    break
                continue
            output.update({"_tool": call.tool, "_index": position})
            if call.tag:
                output["_tag"] = call.tag
            outputs.append(output)
        text = self._format_tool_results(outputs)
        return [text] if text else None

    def _format_tool_results(self, tool_outputs: list[dict[str, Any]]) -> str:
        """The ``<tool_results>`` block: per call its name, position (from 1), tag, then its result as JSON or its
        error."""
        if not tool_outputs:
            return ""
        lines = ["<tool_results>"]
        for output in tool_outputs:
            output = dict(output)
            name, position, tag = output.pop("_tool", "unknown"), output.pop("_index", 0) + 1, output.pop("_tag", None)
            if "error" in output:
                lines += [f"Tool {name} (call {position}) failed:", f"  Error: {output['error']}"]
                continue
            label = f" [tag: {tag}]" if tag else ""
            lines += [f"Tool {name} (call {position}){label} succeeded:", f"  Result: {json.dumps(output, indent=2)}"]
        lines.append("</tool_results>")
        return "\n".join(lines)


class SimpleToolTransform(ToolTransformBase):
    """Tools as plain callables: each call found in an answer (``tool_call_pattern``, a regex capturing the tool's
    name and its JSON arguments, default ``<tool>NAME\\n{json}</tool>``; or ``parser``'s calls when given) runs
    ``tools[name](**args)`` and adds one ``tool`` message: ``"Tool NAME executed successfully:\\nRESULT"`` or
    ``"Tool NAME failed:\\nREASON"`` (unknown tool, arguments that are not JSON, an exception, or no answer within
    ``timeout`` seconds).

    Args:
        tools: name -> callable.
        tool_schemas: name -> schema (for documentation; not checked).
        parser: finds the calls instead of the regex.
        tool_call_pattern: the regex (two groups: name, JSON arguments).
        tool_name: the role of the result messages (default ``"tool"``).
        timeout: seconds a call may take (default 10).
    """

    def __init__(
        self,
        tools: dict[str, Callable[..., Any]],
        tool_schemas: dict[str, dict] | None = None,
        parser: LLMToolParser | None = None,
        tool_call_pattern: str | None = None,
        tool_name: str = "tool",
        timeout: float = 10.0,
    ) -> None:
        super().__init__()
        self.tools = tools
        self.tool_schemas = tool_schemas or {}
        self.parser = parser
        self.tool_call_pattern = tool_call_pattern or r"<tool>(.*?)\n(.*?)</tool>"
        self.tool_role = tool_name
        self.timeout = timeout

    def _extract_tool_calls(self, text: str) -> list[tuple[str, str]]:
        """(name, JSON arguments) per call, in the order written."""
        if self.parser is not None:
            return [(call.tool, json.dumps(call.args)) for call in self.parser(text).get("calls", [])]
        return re.findall(self.tool_call_pattern, text, re.DOTALL)

    def _execute_tool(self, tool_name: str, args_json: str) -> dict[str, Any]:
        """``{"success": True, "result": ...}`` or ``{"success": False, "error": reason}``."""
        if tool_name not in self.tools:
            return {"success": False, "error": f"Tool {tool_name} not found"}
        try:
            args = json.loads(args_json) if args_json.strip() else {}
        except json.JSONDecodeError as err:
            return {"success": False, "error": f"Failed to parse tool arguments: {err}"}
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["result"] = self.tools[tool_name](**args)
            except Exception as err:
                outcome["error"] = err

        worker = threading.Thread(target=run, name=f"tool-{tool_name}", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if worker.is_alive():
            return {"success": False, "error": f"Tool execution failed: no answer within {self.timeout} s"}
        if "error" in outcome:
            return {"success": False, "error": f"Tool execution failed: {outcome['error']}"}
        return {"success": True, "result": outcome.get("result")}

    def _process_batch_item(self, content: str, index: int) -> list[str] | None:
        results = []
        for tool_name, args_json in self._extract_tool_calls(content):
            outcome = self._execute_tool(tool_name, args_json)
            if outcome["success"]:
                results.append(f"Tool {tool_name} executed successfully:\n{outcome['result']}")
            else:
                results.append(f"Tool {tool_name} failed:\n{outcome['error']}")
        return results or None
