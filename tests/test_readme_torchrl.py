"""The README's "Speaking TorchRL" block is TorchRL code with only its imports changed: run it as written."""

from __future__ import annotations

import builtins
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _block() -> str:
    text = README.read_text()
    section = text[text.index("### Speaking TorchRL") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_torchrl_block_uses_only_ported_imports():
    imports = [line for line in _block().splitlines() if line.startswith(("from ", "import "))]
    assert not any("torchrl" in line.split("#")[0] for line in imports)
    assert sum("# torchrl." in line for line in imports) == 6  # each llmrl import names the TorchRL one it replaces


def test_the_torchrl_block_runs():
    printed: list[str] = []
    namespace = {"__builtins__": {**vars(builtins), "print": lambda *a, **k: printed.append(" ".join(map(str, a)))}}
    exec(compile(_block(), str(README), "exec"), namespace)
    kl = namespace["kl"]
    assert kl.shape[0] == 2 and float(kl.abs().max()) == 0.0  # same weights on both sides
    versions = [line.split()[0] for line in printed[2:]]
    # two batches of two dialog turns, (2 slots, 1 step) each as TorchRL lays them out, one weight update between
    assert versions == ["tensor([[0],", "tensor([[1],"]
