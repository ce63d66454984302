"""docs/environments.md "Bring your environment", route 3 (the README's before the docs site): the verifiers
environment as printed loads with verifiers' own API and its rubric pays the right answer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers", reason="the optional 'verifiers' extra is not installed")


def test_the_readme_verifiers_env_loads_and_its_rubric_pays():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "environments.md").read_text()
    section = readme[readme.index("**3. The ecosystem's environments, by config.**") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/environments.md", "exec"), namespace)
    env = namespace["load_environment"](n=4)
    assert isinstance(env, vf.SingleTurnEnv)
    rows = env.get_dataset()
    assert len(rows) == 4 and rows[3]["answer"] == "6"
    exact = namespace["exact"]
    assert "exact" in env.rubric._get_reward_func_names()  # the env's rubric scores with it (SingleTurnEnv groups it)
    assert exact(completion=[{"role": "assistant", "content": "It is 6."}], answer="6") == 1.0
    assert exact(completion=[{"role": "assistant", "content": "It is 7."}], answer="6") == 0.0
