"""Every TorchRL LLM-API name llmrl has takes TorchRL's arguments: names, kinds, defaults, as recorded from
TorchRL 0.14.1 itself (tests/goldens/torchrl/api_probes.json), imported by the one porting rule
``torchrl.<pkg>.llm[.<sub>]`` -> ``llmrl_core.<pkg>[.<sub>]``. llmrl may add keyword arguments after TorchRL's, and
may accept more than TorchRL (an argument TorchRL requires may have a default here, a keyword-only one may be
positional): every TorchRL call still works unchanged."""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest

PROBES = json.loads((Path(__file__).parent / "goldens" / "torchrl" / "api_probes.json").read_text())["signatures"]

# Names whose TorchRL form needs TorchRL itself: ``default_spec`` builds a torchrl ``Composite`` spec.
NOT_PORTED = {"History.default_spec", "ChatHistory.default_spec"}

# Names of TorchRL's reference page whose constructor llmrl does not (yet) take as TorchRL does, and why. Each must
# still differ (the test below fails once one matches, so the list stays true).
DEPARTURES = {
    "ContentBase": "a dataclass here; TorchRL's a tensorclass (batch_size/device/names) with size, function_* fields",
    "LLMHashingEnv": "a list-based env of chained integer hashes here; TorchRL's hashes tensors with a hashing_module",
    "Tokenizer": "a slot transform here (tokenizer, add_special_tokens); TorchRL's a generic key-mapping transform",
}


def ported(import_line: str) -> str:
    """``from torchrl.envs.llm import X`` -> ``llmrl_core.envs`` (the README's porting rule)."""
    module = import_line.split()[1]
    parts = [p for p in module.split(".")[1:] if p != "llm"]
    return ".".join(["llmrl_core", *parts])


def ours(name: str, import_line: str):
    owner, _, member = name.partition(".")
    obj = getattr(importlib.import_module(ported(import_line)), owner)
    return getattr(obj, member) if member else obj


def signature_problems(name: str) -> list[str]:
    """How llmrl's ``name`` fails to take TorchRL's arguments (empty: it takes them)."""
    probe = PROBES[name]
    params = inspect.signature(ours(name, probe["import"])).parameters
    has_var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    problems = []
    for theirs in probe["parameters"]:
        if theirs["kind"] in ("VAR_KEYWORD", "VAR_POSITIONAL"):
            continue
        mine = params.get(theirs["name"])
        if mine is None:
            problems.append(f"no {theirs['name']}" + (" (only **kwargs)" if has_var_keyword else ""))
        elif theirs["has_default"] and mine.default is inspect.Parameter.empty:
            problems.append(f"{theirs['name']}: optional in TorchRL, required here")
        elif theirs["has_default"] and repr(mine.default) != theirs["default"]:
            problems.append(f"{theirs['name']} defaults to {mine.default!r}, TorchRL's to {theirs['default']}")
        elif theirs["kind"] == "POSITIONAL_OR_KEYWORD" and mine.kind is inspect.Parameter.KEYWORD_ONLY:
            problems.append(f"{theirs['name']} is keyword-only here, positional in TorchRL")
    positional = [p["name"] for p in probe["parameters"] if p["kind"] == "POSITIONAL_OR_KEYWORD"]
    mine_positional = [n for n, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    if mine_positional[: len(positional)] != positional:
        problems.append(f"positional order {mine_positional} != TorchRL's {positional}")
    return problems


@pytest.mark.parametrize("name", sorted(set(PROBES) - NOT_PORTED - set(DEPARTURES)))
def test_torchrl_arguments_are_accepted_with_torchrls_defaults(name):
    problems = signature_problems(name)
    assert not problems, f"{name}: " + "; ".join(problems)


@pytest.mark.parametrize("name", sorted(DEPARTURES))
def test_the_listed_departures_still_differ(name):
    assert name in PROBES and "error" not in PROBES[name]
    assert signature_problems(name), f"{name} now takes TorchRL's arguments: drop it from DEPARTURES"


def test_the_names_not_ported_need_torchrl_itself():
    assert NOT_PORTED <= set(PROBES)
    for name in NOT_PORTED:
        owner, _, member = name.partition(".")
        assert not hasattr(ours(owner, PROBES[name]["import"]), member)
