"""AVX2-only CPU emulation for ``bench/bench_avx2_emulated.py`` (active only when ``LLMRL_EMULATE_AVX2=1``).

Put on ``PYTHONPATH`` so that every process of a run (the CLI, Dask workers, vLLM's engine core) imports it at
start-up. torch then reports no AVX-512, VNNI or AMX features, so vLLM loads its AVX2 kernels (``vllm._C_AVX2``,
what it loads on an AVX2-only CPU) and picks no AMX paths, and torch's oneDNN matmuls are off, as torch's own
bf16 device check turns them off on such a CPU. The kernel ISA limits themselves come from the environment the
benchmark sets (``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2``, ``MKL_ENABLE_INSTRUCTIONS=AVX2``).
"""

import os

if os.environ.get("LLMRL_EMULATE_AVX2") == "1":
    import torch
    import torch.cpu

    for _name in (
        "_is_avx512_supported",
        "_is_avx512_bf16_supported",
        "_is_vnni_supported",
        "_is_amx_tile_supported",
        "_is_amx_fp16_supported",
    ):
        setattr(torch.cpu, _name, lambda: False)
    torch.backends.mkldnn.enabled = False
