"""The docs' TorchRL code runs as written: the import rule's block of docs/torchrl.md (TorchRL code with only its
imports changed) and the example transform of docs/environments.md (a reward once written as a per-conversation
``step_slot``, now TorchRL's ``Transform``). Both blocks were the README's before the docs site."""

from __future__ import annotations

import builtins
import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1] / "docs"
TORCHRL_BLOCK = (DOCS / "torchrl.md", "## The import rule")
TRANSFORM_BLOCK = (DOCS / "environments.md", "A reward that was a per-conversation `step_slot(slot)`")


def _block(where: tuple[Path, str]) -> str:
    """The first python code block after the anchor ``where[1]`` in the page ``where[0]``."""
    page, anchor = where
    text = page.read_text()
    section = text[text.index(anchor) :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _run(block: str, page: Path) -> tuple[dict[str, Any], list[str]]:
    """Execute ``block`` (from ``page``); its namespace and the lines it printed."""
    printed: list[str] = []
    namespace = {"__builtins__": {**vars(builtins), "print": lambda *a, **k: printed.append(" ".join(map(str, a)))}}
    exec(compile(block, str(page), "exec"), namespace)
    return namespace, printed


def test_the_torchrl_block_uses_only_ported_imports():
    imports = [line for line in _block(TORCHRL_BLOCK).splitlines() if line.startswith(("from ", "import "))]
    assert not any("torchrl" in line.split("#")[0] for line in imports)
    assert sum("# torchrl." in line for line in imports) == 6  # each llmrl import names the TorchRL one it replaces


def test_the_torchrl_block_runs():
    namespace, printed = _run(_block(TORCHRL_BLOCK), TORCHRL_BLOCK[0])
    kl = namespace["kl"]
    assert kl.shape[0] == 2 and float(kl.abs().max()) == 0.0  # same weights on both sides
    versions = [line.split()[0] for line in printed[2:]]
    # two batches of two dialog turns, (2 slots, 1 step) each as TorchRL lays them out, one weight update between
    assert versions == ["tensor([[0],", "tensor([[1],"]


def test_the_readme_transform_runs_and_prints_its_comment():
    block = _block(TRANSFORM_BLOCK)
    namespace, printed = _run(block, TRANSFORM_BLOCK[0])
    assert printed == [block.splitlines()[-1].split("# ", 1)[1]]
    env = namespace["env"]
    assert env.slots[0].done and not env.slots[1].done and env.slots[0].episode_reward == 1.0
