"""``dtype: auto``: bfloat16 where this hardware runs it fast, float32 elsewhere, with the reason.

bf16 pays on CUDA devices that support it, and on CPUs with native bf16 arithmetic (AMX or AVX512-BF16).
On other CPUs (AVX2 only, e.g. many AMD EPYC) bf16 is emulated: raw vLLM CPU measured 99 tok/s in float32 and
29 tok/s in bfloat16 on such a machine, so float32 is the fast choice there. The CPU flags come from
``/proc/cpuinfo`` (Linux), falling back to torch's reported CPU capability.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclass(frozen=True)
class DtypeChoice:
    """A resolved dtype (``bfloat16`` or ``float32``) and why it was chosen."""

    dtype: str
    reason: str

    @property
    def bf16(self) -> bool:
        """Whether the choice is bfloat16."""
        return self.dtype == "bfloat16"


@functools.cache
def cpu_bf16_flags() -> tuple[str, ...]:
    """The native-bf16 CPU features of this machine (``amx_bf16``, ``avx512_bf16``), possibly none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return tuple(f for f in BF16_CPU_FLAGS if f in flags)
    except OSError:
        pass
    try:
        import torch

        capability = str(torch.backends.cpu.get_cpu_capability()).upper()
    except (ImportError, AttributeError):
        return ()
    return ("amx_bf16",) if "AMX" in capability else ("avx512_bf16",) if "BF16" in capability else ()


def choose_dtype(requested: str, device: str = "cpu") -> DtypeChoice:
    """Resolve ``requested`` (``auto`` or an explicit dtype) for ``device`` (``cpu`` or ``cuda``)."""
    if requested != "auto":
        return DtypeChoice(requested, "set explicitly")
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return DtypeChoice("bfloat16", f"CUDA device {torch.cuda.get_device_name(0)} supports bf16")
        return DtypeChoice("float32", "CUDA device without bf16 support")
    flags = cpu_bf16_flags()
    if flags:
        return DtypeChoice("bfloat16", f"CPU has native bf16 ({', '.join(flags)})")
    return DtypeChoice("float32", "CPU without AMX or AVX512-BF16: bf16 would be emulated and slower")


def mixed_precision_for(requested: str, device: str) -> tuple[str, str]:
    """The trainer's ``mixed_precision`` (``bf16`` or ``no``) for ``auto``, with the reason."""
    if requested != "auto":
        return requested, "set explicitly"
    choice = choose_dtype("auto", device)
    return ("bf16" if choice.bf16 else "no"), choice.reason


def gpu_ids(indices: list[int] | None = None) -> list[str]:
    """Stable ids of this process's CUDA devices (all visible ones, or ``indices``): their UUIDs, which name one
    physical GPU whatever ``CUDA_VISIBLE_DEVICES`` renumbered; ``[]`` without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    chosen = range(torch.cuda.device_count()) if indices is None else indices
    return [str(torch.cuda.get_device_properties(i).uuid) for i in chosen]


def where_am_i(device: str, indices: list[int] | None = None) -> dict[str, str]:
    """``host`` and ``gpus`` (comma-separated :func:`gpu_ids`) of a process using ``device``, for its ``describe()``
    (the weight route between trainer and engines depends on them)."""
    import socket

    return {"host": socket.gethostname(), "gpus": ",".join(gpu_ids(indices) if device.startswith("cuda") else [])}


def cuda_peak_gib(prefix: str) -> dict[str, float]:
    """This process's peak CUDA memory since it started, in GiB (``<prefix>_cuda_peak_gib``: what its tensors held at
    most, ``<prefix>_cuda_reserved_gib``: what PyTorch's allocator took from the device), for setting the run's
    figures beside ``llmrl plan``'s; empty where this process has not used CUDA (a vLLM engine's model lives in
    vLLM's own engine process)."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized() or not torch.cuda.max_memory_reserved():
        return {}
    gib = float(1 << 30)
    return {
        f"{prefix}_cuda_peak_gib": torch.cuda.max_memory_allocated() / gib,
        f"{prefix}_cuda_reserved_gib": torch.cuda.max_memory_reserved() / gib,
    }
