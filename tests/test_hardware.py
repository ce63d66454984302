"""``dtype: auto``: bf16 only where the hardware has native bf16, with the reason."""

from __future__ import annotations

import pytest

from llmrl_core import hardware


@pytest.mark.parametrize(
    ("flags", "dtype", "precision"),
    [
        ((), "float32", "no"),  # AVX2-only CPU: bf16 is emulated, float32 is faster
        (("avx512_bf16",), "bfloat16", "bf16"),
        (("amx_bf16", "avx512_bf16"), "bfloat16", "bf16"),
    ],
)
def test_auto_follows_the_cpu_flags(monkeypatch, flags, dtype, precision):
    monkeypatch.setattr(hardware, "cpu_bf16_flags", lambda: flags)
    choice = hardware.choose_dtype("auto", "cpu")
    assert choice.dtype == dtype
    assert ("without AMX" in choice.reason) == (not flags)
    assert hardware.mixed_precision_for("auto", "cpu")[0] == precision


def test_explicit_values_are_kept(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_bf16_flags", lambda: ())
    assert hardware.choose_dtype("bfloat16", "cpu") == hardware.DtypeChoice("bfloat16", "set explicitly")
    assert hardware.mixed_precision_for("bf16", "cpu") == ("bf16", "set explicitly")


def test_cpu_flags_are_read_from_this_machine():
    text = open("/proc/cpuinfo", encoding="utf-8").read()
    flags = set(next(line for line in text.splitlines() if line.startswith("flags")).split(":", 1)[1].split())
    hardware.cpu_bf16_flags.cache_clear()
    assert set(hardware.cpu_bf16_flags()) == flags & {"amx_bf16", "avx512_bf16"}


def test_the_grpo_config_defaults_to_auto():
    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig

    cfg = load_config(GRPOConfig, None, [])
    assert cfg.rollout.dtype == "auto" and cfg.train.mixed_precision == "auto"
