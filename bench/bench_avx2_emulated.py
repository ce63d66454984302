"""bf16 vs float32 GRPO iterations on an emulated AVX2-only CPU (what ``dtype: auto`` chooses there, and why).

Usage: ``.venv/bin/python bench/bench_avx2_emulated.py [--iterations 3] [--config recipes/arithmetic/grpo.yaml]``

On a CPU without AMX or AVX512-BF16, ``dtype: auto`` runs rollouts in float32 and trains without autocast; the
default before ``auto`` was bfloat16 for both. This script runs the real flow (``llmrl run grpo``, the main job or
``--config``) twice under an AVX2-only emulation — once as ``auto`` resolves on such a CPU (``rollout.dtype=float32
train.mixed_precision=no``), once with the old bf16 default — and prints per-iteration wall, rollout and train-step
times and their ratios. The emulation (``bench/_avx2_emulation/sitecustomize.py`` plus ISA limits for ATen,
oneDNN and MKL) makes vLLM load the AVX2 kernels it loads on such a CPU and keeps every library off AVX-512/AMX
code; it is an emulation on a newer CPU (same cores, caches and memory), so absolute times are not those of an
AVX2 machine. ``--no-emulation`` runs the same pair natively.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _path in (REPO, REPO / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from _flow_timing import run_flow  # noqa: E402
from _machine import load_line, machine_line  # noqa: E402

EMULATION_ENV = {
    "LLMRL_EMULATE_AVX2": "1",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}
SIDES = {
    "auto on AVX2 (float32)": ["rollout.dtype=float32", "train.mixed_precision=no"],
    "old default (bfloat16)": ["rollout.dtype=bfloat16", "train.mixed_precision=bf16"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--config", default=None, help="a GRPO config (default: the main job)")
    parser.add_argument("--no-emulation", action="store_true", help="run both sides on this CPU as it is")
    args = parser.parse_args()
    print(machine_line())
    if not args.no_emulation:
        os.environ.update(EMULATION_ENV)
        shim = str(REPO / "bench" / "_avx2_emulation")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (shim, os.environ.get("PYTHONPATH")) if p)
        print(f"emulating an AVX2-only CPU: {' '.join(f'{k}={v}' for k, v in EMULATION_ENV.items())} + {shim}")
    print(load_line())
    common = [f"iterations={args.iterations}"]
    runs = {}
    for name, overrides in SIDES.items():
        root = Path(tempfile.mkdtemp(prefix="bench-avx2-"))
        try:
            print(
                f"running {name}: llmrl run grpo{f' --config {args.config}' if args.config else ''} "
                f"--set {' --set '.join(common + overrides)}",
                flush=True,
            )
            runs[name] = run_flow(common + overrides, root, run_id="bench-avx2", config=args.config)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        run = runs[name]
        print(f"  command {run.wall:.1f} s, start-up {run.startup:.1f} s")
        print(f"  {'iter':>4} {'wall s':>8} {'rollout s':>9} {'step s':>8}")
        for it in run.iterations:
            print(f"  {it.version:>4} {it.wall:8.1f} {it.metrics.get('rollout_s', 0):9.1f} {it.train_compute:8.1f}")
    print(load_line())
    fast, slow = (runs[name] for name in SIDES)

    print(f"median over iterations 1..{args.iterations - 1} (iteration 0 is warm-up), bf16 / float32:")
    for label, get in (
        ("iteration wall", lambda it: it.wall),
        ("rollout stage", lambda it: it.metrics.get("rollout_s", 0.0)),
        ("train step", lambda it: it.train_compute),
    ):
        a = statistics.median(get(it) for it in fast.steady)
        b = statistics.median(get(it) for it in slow.steady)
        print(f"  {label:<15} float32 {a:7.1f} s  bfloat16 {b:7.1f} s  ratio {b / a:5.2f}x")
    print(
        f"  whole command   float32 {fast.wall:7.1f} s  bfloat16 {slow.wall:7.1f} s  "
        f"ratio {slow.wall / fast.wall:5.2f}x"
    )


if __name__ == "__main__":
    main()
