"""``PythonInterpreter``: run the ```python blocks of the assistant's message in a sandbox (TorchRL semantics).

After each step, every ```` ```python ```` block of the last assistant message runs, in order, and each block
adds one message with role ``"tool"`` (so the assistant mask leaves it out of the loss), worded as TorchRL
words it::

    Code block 1 executed successfully:
    <stdout>

    Code block 2 failed:
    <stderr>

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

from llmrl_core.envs.transforms.base import SlotTransform
from llmrl_core.envs.types import SlotState
from llmrl_core.tools.sandbox import ExecResult, Sandbox, SandboxConfig, SandboxLimits
from llmrl_core.tools.tool_calls import tool_call_record

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


class PythonInterpreter(SlotTransform):
    """Execute the assistant's Python code blocks in a sandbox and append the results as tool messages.

    Failure is judged by the exception raised, not by stderr, in both modes: a block "failed" when it raised (or
    timed out, or crashed). Code that writes to stderr (a library warning, a ``print(..., file=sys.stderr)``) and
    finishes is a success, and its message carries its stdout only, as TorchRL's success message does. TorchRL's
    persistent mode counts any stderr output as a failure; we differ on purpose, since warnings would otherwise
    fail correct code.

    Args:
        tokenizer: accepted for TorchRL's signature (the env renders the messages; none is needed here).
        tool_name: role of the result messages (TorchRL's name), ``"tool"`` by default.
        persistent: keep one interpreter per slot across turns (reset with the env), else one per block.
        timeout: wall-clock seconds per block (also the per-block CPU budget unless ``sandbox_config`` sets it).
        services, service_name, namespace: TorchRL's Ray-hosted interpreter pool; refused (``services``/``namespace``
            set): llmrl runs each interpreter in its own sandboxed process.
        tool_role: llmrl's name for ``tool_name`` (either may be given).
        sandbox_config: limits and confinement options (:class:`~llmrl_core.tools.sandbox.SandboxConfig`).
        max_blocks: run at most this many blocks per message (the rest get a "skipped" message).
        max_workers: slots executed concurrently.
    """

    writes_reward = False

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
        self.tokenizer, self.service_name = tokenizer, service_name
        tool_role = tool_role if tool_role is not None else tool_name
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if max_blocks < 1 or max_workers < 1:
            raise ValueError("max_blocks and max_workers must be >= 1")
        if sandbox_config is None:
            sandbox_config = SandboxConfig(limits=SandboxLimits(wall_time_s=timeout, cpu_time_s=timeout))
        self.persistent = persistent
        self.timeout = timeout
        self.tool_role = tool_role
        self.sandbox_config = sandbox_config
        self.max_blocks = max_blocks
        self.max_workers = max_workers
        self._sandboxes: dict[int, Sandbox] = {}

    # --- lifecycle -------------------------------------------------------------------------------
    def on_reset(self, slots: list[SlotState]) -> None:
        """New episodes in ``slots``: their persistent interpreters are discarded (fresh state per episode);
        other slots' interpreters live on (a rolling reset restarts some slots while others run)."""
        for slot in slots:
            box = self._sandboxes.pop(slot.index, None)
            if box is not None:
                box.close()

    def close(self) -> None:
        """Stop all interpreters and delete their working directories."""
        sandboxes, self._sandboxes = self._sandboxes, {}
        for box in sandboxes.values():
            box.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    # --- execution -------------------------------------------------------------------------------
    def _run_block(self, slot_index: int, code: str) -> ExecResult:
        if not self.persistent:
            with Sandbox(self.sandbox_config) as box:
                return box.run(code, wall_time_s=self.timeout)
        box = self._sandboxes.get(slot_index)
        if box is None:
            box = self._sandboxes[slot_index] = Sandbox(self.sandbox_config)
        return box.run(code, wall_time_s=self.timeout)

    def _run_slot(self, slot: SlotState, blocks: list[str]) -> list[str]:
        messages = []
        for k, code in enumerate(blocks[: self.max_blocks], start=1):
            try:
                result = self._run_block(slot.index, code)
            except Exception as exc:  # noqa: BLE001 (the sandbox could not even start: report, don't crash the env)
                result = ExecResult(False, "crashed", stderr=f"{type(exc).__name__}: {exc}\n", error=str(exc))
            messages.append(format_block_result(k, result))
        for k in range(self.max_blocks + 1, len(blocks) + 1):
            messages.append(f"Code block {k} failed:\n[skipped: at most {self.max_blocks} blocks run per message]")
        return messages

    def on_step(self, slots: list[SlotState]) -> None:
        """Run the code blocks of every active slot (slots in parallel) and append the tool messages."""
        work: list[tuple[SlotState, list[str]]] = []
        for slot in slots:
            if slot.done:
                continue
            message = slot.last_message()
            if message is None or message.role != self.parent_policy_role():
                continue
            blocks = extract_python_blocks(message.text)
            if blocks:
                work.append((slot, blocks))
        if not work:
            return
        if len(work) == 1:
            outputs = [self._run_slot(*work[0])]
        else:
            with ThreadPoolExecutor(max_workers=min(self.max_workers, len(work))) as pool:
                outputs = list(pool.map(lambda item: self._run_slot(*item), work))
        for (slot, blocks), messages in zip(work, outputs, strict=True):
            calls = slot.info.setdefault("tool_calls", [])
            for k, text in enumerate(messages):
                slot.add_message(self.tool_role, text)
                code = blocks[k] if k < len(blocks) else ""
                calls.append(tool_call_record(slot.turn - 1, "python", {"code": code}, text, _failed(text)))
            failed = sum(1 for text in messages if _failed(text))
            slot.info["python_blocks"] = slot.info.get("python_blocks", 0) + len(messages)
            slot.info["python_failures"] = slot.info.get("python_failures", 0) + failed
            slot.info["num_tool_calls"] = slot.info.get("num_tool_calls", 0) + len(messages)
            slot.info["tool_errors"] = slot.info.get("tool_errors", 0) + failed

    def parent_policy_role(self) -> str:
        """The role of the policy's messages in the parent env (``"assistant"`` without a parent)."""
        return getattr(self.parent, "policy_role", "assistant")

    def state_dict(self) -> dict[str, Any]:
        """Interpreter state is process memory and is not checkpointed; only the settings are."""
        return {"persistent": self.persistent, "timeout": self.timeout}

    def __repr__(self) -> str:
        return f"PythonInterpreter(persistent={self.persistent}, timeout={self.timeout})"
