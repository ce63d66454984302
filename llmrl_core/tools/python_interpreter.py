"""``PythonInterpreter``: run the ```python blocks of the assistant's message in a sandbox (TorchRL semantics).

After each step, every ```` ```python ```` block of the last assistant message runs, in order, and each block
adds one message with role ``"tool"`` (so the assistant mask leaves it out of the loss), worded as TorchRL
words it::

    Code block 1 executed successfully:
    <stdout>

    Code block 2 failed:
    <stderr>

It is TorchRL's tool transform (a :class:`~llmrl_core.envs.transforms.tool_calls.ToolTransformBase`): on each
step it reads the answer at the end of ``("history", "prompt")`` and extends that history with one message per
block; TorchRL's override points are kept (``_extract_python_code``, ``_execute_python_code(code, i)`` returning
``{"success", "stdout", "stderr", "returncode"}``, ``_process_batch_item``). ChatEnv keeps each block run in the
slot's ``info["tool_calls"]`` (and ``num_tool_calls`` / ``tool_errors``).

Modes:

* ``persistent=True``: one long-lived sandboxed interpreter per env slot, so variables, imports and files
  survive from one turn to the next; ``ChatEnv.reset`` throws them all away. If an interpreter is killed
  (timeout, memory) the message says so and the next block starts a fresh one (state lost, said too).
* ``persistent=False`` (TorchRL's default): each block runs in a fresh sandbox.

What the sandbox enforces and how: :mod:`llmrl_core.tools.sandbox`. Nothing a block does can raise out of
the env: a timeout, a crash or a refused action becomes text in the tool message. Slots run concurrently
(one thread per slot, at most ``max_workers``): the work is in the sandbox processes, not in this one.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tensordict import TensorDictBase

from llmrl_core.envs.transforms.tool_calls import ToolTransformBase
from llmrl_core.tools.sandbox import ExecResult, Sandbox, SandboxConfig, SandboxLimits

CODE_BLOCK = re.compile(r"```python[ \t]*\r?\n(.*?)\r?\n?```", re.DOTALL)


def extract_python_blocks(text: str) -> list[str]:
    """The contents of the ```` ```python ```` fenced blocks of ``text``, in order."""
    return [m.group(1) for m in CODE_BLOCK.finditer(text)]


def format_block_result(index: int, result: ExecResult) -> str:
    """One tool message in TorchRL's wording; timeouts, crashes and truncation are spelled out."""
    notes = []
    if result.truncated:
        notes.append("[output truncated]")
    if result.status == "crashed" or (result.status == "timeout" and result.state_lost):
        notes.append(f"[sandbox: {result.error}; interpreter state was lost]")
    elif result.status == "timeout":
        notes.append(f"[sandbox: {result.error}]")
    elif result.state_lost:
        notes.append("[sandbox: the previous interpreter had died; this block ran in a fresh one]")
    if result.ok:
        body = result.stdout
        head = f"Code block {index} executed successfully:\n"
    else:
        body = result.stderr if result.stderr.strip() else result.stdout
        head = f"Code block {index} failed:\n"
    tail = "\n".join(notes)
    if tail:
        body = body + ("" if not body or body.endswith("\n") else "\n") + tail
    return head + body


def _failed(text: str) -> bool:
    return text.split("\n", 1)[0].endswith("failed:")


class PythonInterpreter(ToolTransformBase):
    """Execute the assistant's Python code blocks in a sandbox and append the results as tool messages.

    Failure is judged by the exception raised, not by stderr, in both modes: a block "failed" when it raised (or
    timed out, or crashed). Code that writes to stderr (a library warning, a ``print(..., file=sys.stderr)``) and
    finishes is a success, and its message carries its stdout only, as TorchRL's success message does. TorchRL's
    persistent mode counts any stderr output as a failure; we differ on purpose, since warnings would otherwise
    fail correct code. Rows whose episode has ended run nothing (see ``ToolTransformBase``).

    Args:
        tokenizer: accepted for TorchRL's signature (the env renders the messages; none is needed here).
        tool_name: role of the result messages (TorchRL's name), ``"tool"`` by default.
        persistent: keep one interpreter per env slot across turns (reset with the slot's episode), else one per
            block.
        timeout: wall-clock seconds per block (also the per-block CPU budget unless ``sandbox_config`` sets it).
        services, service_name, namespace: TorchRL's Ray-hosted interpreter pool; refused (``services``/``namespace``
            set): llmrl runs each interpreter in its own sandboxed process.
        tool_role: llmrl's name for ``tool_name`` (either may be given).
        sandbox_config: limits and confinement options (:class:`~llmrl_core.tools.sandbox.SandboxConfig`).
        max_blocks: run at most this many blocks per message (the rest get a "skipped" message).
        max_workers: rows executed concurrently.
    """

    use_step = True

    def __init__(
        self,
        tokenizer: Any = None,
        tool_name: str = "tool",
        persistent: bool = False,
        timeout: float = 10.0,
        services: str | None = None,
        service_name: str = "python_executor",
        namespace: str | None = None,
        *,
        tool_role: str | None = None,
        sandbox_config: SandboxConfig | None = None,
        max_blocks: int = 8,
        max_workers: int = 4,
    ) -> None:
        super().__init__()
        if services is not None or namespace is not None:
            raise ValueError(
                "PythonInterpreter: services=/namespace= select TorchRL's Ray-hosted interpreter pool; llmrl runs "
                "each interpreter in its own sandboxed process (drop these arguments)"
            )
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if max_blocks < 1 or max_workers < 1:
            raise ValueError("max_blocks and max_workers must be >= 1")
        self.tokenizer, self.service_name = tokenizer, service_name
        self.services, self.namespace = services, namespace
        self.tool_role = tool_role if tool_role is not None else tool_name
        self.sandbox_config = sandbox_config or SandboxConfig(
            limits=SandboxLimits(wall_time_s=timeout, cpu_time_s=timeout)
        )
        self.persistent = persistent
        self.timeout = timeout
        self.max_blocks = max_blocks
        self.max_workers = max_workers
        self._sandboxes: dict[int, Sandbox] = {}

    # --- lifecycle -------------------------------------------------------------------------------
    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        """New episodes (every row, or those TorchRL's ``"_reset"`` entry marks): their persistent interpreters are
        discarded (fresh state per episode); other slots' interpreters live on (a rolling reset restarts some
        slots while others run)."""
        for slot in self._reset_slots(tensordict, tensordict_reset):
            box = self._sandboxes.pop(slot, None)
            if box is not None:
                box.close()
        return tensordict_reset

    def close(self) -> None:
        """Stop all interpreters and delete their working directories."""
        sandboxes, self._sandboxes = self._sandboxes, {}
        for box in sandboxes.values():
            box.close()

    def clone(self) -> PythonInterpreter:
        """The same settings, no interpreters, no env (TorchRL's ``clone``)."""
        return type(self)(
            tokenizer=self.tokenizer,
            tool_name=self.tool_role,
            persistent=self.persistent,
            timeout=self.timeout,
            service_name=self.service_name,
            sandbox_config=self.sandbox_config,
            max_blocks=self.max_blocks,
            max_workers=self.max_workers,
        )

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    # --- execution (TorchRL's override points) ---------------------------------------------------
    def _extract_python_code(self, text: str) -> list[str]:
        """The ```` ```python ```` blocks of ``text``, in order."""
        return extract_python_blocks(text)

    def _execute_python_code(self, code: str, i: int) -> dict[str, Any]:
        """Run ``code`` for row ``i`` (in its slot's interpreter when persistent, else a fresh one): TorchRL's
        ``{"success", "stdout", "stderr", "returncode"}``, plus llmrl's ``"result"`` (the sandbox's
        :class:`~llmrl_core.tools.sandbox.ExecResult`, which words timeouts and lost state)."""
        try:
            if not self.persistent:
                with Sandbox(self.sandbox_config) as box:
                    result = box.run(code, wall_time_s=self.timeout)
            else:
                slot = self._slot_of(i)
                box = self._sandboxes.get(slot)
                if box is None:
                    box = self._sandboxes[slot] = Sandbox(self.sandbox_config)
                result = box.run(code, wall_time_s=self.timeout)
        except Exception as exc:  # noqa: BLE001 (the sandbox could not even start: report, don't crash the env)
            result = ExecResult(False, "crashed", stderr=f"{type(exc).__name__}: {exc}\n", error=str(exc))
        return {
            "success": result.ok,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "returncode": 0 if result.ok else -1,
            "result": result,
        }

    def _process_batch_item(self, content: str, index: int) -> list[str] | None:
        """Run each block of ``content`` (at most ``max_blocks``); one message per block, or None without code."""
        blocks = self._extract_python_code(content)
        if not blocks:
            return None
        messages = []
        for k, code in enumerate(blocks[: self.max_blocks], start=1):
            outcome = self._execute_python_code(code, index)
            if isinstance(outcome.get("result"), ExecResult):
                text = format_block_result(k, outcome["result"])
            elif outcome["success"]:  # a subclass's own executor: TorchRL's wording
                text = f"Code block {k} executed successfully:\n{outcome['stdout']}"
            else:
                text = f"Code block {k} failed:\n{outcome['stderr']}"
            messages.append(text)
            self._record_call(index, "python", {"code": code}, text, _failed(text))
        for k in range(self.max_blocks + 1, len(blocks) + 1):
            text = f"Code block {k} failed:\n[skipped: at most {self.max_blocks} blocks run per message]"
            messages.append(text)
            self._record_call(index, "python", {"code": ""}, text, True)
        return messages

    def _process_rows(self, contents: list[str], rows: list[int]) -> list[list[str] | None]:
        """The rows run concurrently (at most ``max_workers``): the work is in the sandbox processes."""
        with_code = [i for i in rows if self._extract_python_code(contents[i])]
        if len(with_code) <= 1:
            return [self._process_batch_item(contents[i], i) for i in rows]
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(with_code))) as pool:
            ran = pool.map(lambda i: self._process_batch_item(contents[i], i), with_code)
            found = dict(zip(with_code, ran, strict=True))
        return [found.get(i) for i in rows]

    def __repr__(self) -> str:
        return f"PythonInterpreter(persistent={self.persistent}, timeout={self.timeout})"
