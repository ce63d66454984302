"""``llmrl config schema|show``: every setting of every flow's config in the JSON schema, typed, with its default and
a description taken from the config modules' own comments and docstrings."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmrl_core.pipeline.config_io import config_key, config_schema
from llmrl_core.pipeline.config_schema import field_comments
from llmrl_core.pipeline.grpo_config import GRPOConfig
from llmrl_core.pipeline.offline_config import OfflineConfig
from llmrl_core.pipeline.sft_config import SFTConfig

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class _Commented:
    """A section."""

    alone: int = 1  # its own words
    # a block above two settings
    first: int = 2
    second: str = "x"
    own: float = 0.5  # ends the block

    after_blank: bool = False
    no_words: list[int] = field(default_factory=list)


def test_comments_beside_and_above_fields_become_descriptions():
    assert field_comments(_Commented) == {
        "alone": "its own words",
        "first": "a block above two settings",
        "second": "a block above two settings",
        "own": "ends the block",
    }


def _walk(cls: type, path: str = ""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield cls, f, hints[f.name], f"{path}{f.name}"
        if isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name]):
            yield from _walk(hints[f.name], f"{path}{f.name}.")


@pytest.mark.parametrize("config_cls", [GRPOConfig, SFTConfig, OfflineConfig])
def test_every_setting_is_in_the_schema_typed_with_its_default_and_described(config_cls):
    schema = config_schema(config_cls)
    defs = schema["$defs"]
    seen = 0
    for section, f, hint, dotted in _walk(config_cls):
        node = schema if section is config_cls else defs[section.__name__]
        prop = node["properties"][config_key(f.name)]  # ``from_`` is written ``from``
        assert prop.get("description"), f"{config_cls.__name__}: {dotted} has no description"
        if f.default is not dataclasses.MISSING and isinstance(f.default, int | float | str | bool):
            assert prop["default"] == f.default, dotted
        if hint is float:
            assert prop["type"] == "number", dotted
        seen += 1
    assert seen > 40
    if config_cls is GRPOConfig:
        train = defs["TrainConfig"]["properties"]
        assert train["objective"]["enum"] == ["ppo", "cispo"]
        assert "fresh optimizer" in train["resume_without_state"]["description"]
        assert defs["DaskConfig"]["properties"]["address"]["description"].startswith("e.g. tcp://")
        assert "lost worker" in defs["DaskConfig"]["properties"]["restarts"]["description"]
        # ranges and choices are in the schema (the Prefect form and the docs' reference show them)
        rollout = defs["RolloutConfig"]["properties"]
        assert rollout["temperature"]["exclusiveMinimum"] == 0 and rollout["top_p"]["maximum"] == 1
        assert rollout["dtype"]["enum"] == ["auto", "bfloat16", "float16", "float32"]
        assert rollout["sleep_level"]["enum"] == [0, 1, 2] and train["device"]["enum"] == ["auto", "cpu", "cuda"]
        assert train["token_budget"]["minimum"] == 16 and defs["DataConfig"]["properties"]["group_size"]["minimum"] == 1


def _llmrl(*args: str) -> subprocess.CompletedProcess:
    code = "from llmrl_cli.main import app; app()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.engine
def test_the_cli_prints_the_schema_and_a_resolved_checked_config():
    out = _llmrl("config", "schema", "sft")
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["$defs"]["SFTTrainConfig"]["properties"]["lr"]["type"] == "number"
    shown = _llmrl("config", "show", "grpo", "--set", "train.lr=2e-5", "--set", "rollout.workers=2")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "  lr: 2.0e-05" in shown.stdout and "  workers: 2" in shown.stdout
    bad = _llmrl("config", "show", "grpo", "--set", "train.lr=abc")
    assert bad.returncode == 2 and "error: --set train.lr=abc: train.lr: expected float, got 'abc'" in bad.stderr
