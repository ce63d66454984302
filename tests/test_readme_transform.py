"""The README's example transform (a reward once written as a per-conversation ``step_slot``, now TorchRL's
``Transform``) runs as written and prints what its comment says."""

from __future__ import annotations

import builtins
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _block() -> str:
    text = README.read_text()
    section = text[text.index("A reward that was a per-conversation `step_slot(slot)`") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_transform_runs_and_prints_its_comment():
    printed: list[str] = []
    namespace = {"__builtins__": {**vars(builtins), "print": lambda *a, **k: printed.append(" ".join(map(str, a)))}}
    exec(compile(_block(), str(README), "exec"), namespace)
    promised = _block().splitlines()[-1].split("# ", 1)[1]
    assert printed == [promised]
    env = namespace["env"]
    assert env.slots[0].done and not env.slots[1].done and env.slots[0].episode_reward == 1.0
