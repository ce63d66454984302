"""One-line description of the machine a benchmark ran on (CPU model, cores, bf16/AVX flags)."""

from __future__ import annotations

import os
import platform

_FLAGS = ("avx512_bf16", "amx_bf16", "avx2")


def _cpuinfo() -> tuple[str, set[str]]:
    """(CPU model name, set of CPU flags) from /proc/cpuinfo; (platform's guess, empty set) elsewhere."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return model or platform.processor() or platform.machine() or "unknown CPU", flags


def machine_line() -> str:
    """E.g. ``machine: AMD EPYC, 2 cores, avx512_bf16=no amx_bf16=no avx2=yes``."""
    model, flags = _cpuinfo()
    marks = " ".join(f"{flag}={'yes' if flag in flags else 'no'}" for flag in _FLAGS)
    return f"machine: {model}, {os.cpu_count()} cores, {marks}"


def load_line() -> str:
    """E.g. ``load average 1.52 (1 min), 2 cores``: how busy the (possibly shared) machine is right now."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min), {os.cpu_count()} cores"


if __name__ == "__main__":
    print(machine_line())
