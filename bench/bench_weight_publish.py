"""Weight publish: ``vLLMWorker.load_weights`` vs an in-memory copy of the same bytes (target P4: <= 2x).

Usage: ``.venv/bin/python bench/bench_weight_publish.py [--repeats 3] [--dtype float32] [--kv-cache-gb 1.0]
[--reload-path auto|vllm]`` (``vllm``: vLLM's own ``reload_weights`` instead of llmrl's in-place CPU reload).

Starts one resident :class:`~llmrl_core.modules.backends.vllm.worker.vLLMWorker` (packaged SmolLM2-135M) and loads the
base weights (tied ``lm_head.weight`` spelled out, as ``tasks/evaluate.py`` does). Then, interleaved and
repeated after one untimed warm-up of each: (a) ``load_weights(path)`` of a safetensors file written once,
(b) ``load_weights(bytes)`` of ``state_dict_to_bytes``, and the baselines (c) ``{k: v.clone()}`` of the state
dict and (c') a ``bytes`` copy of the serialized blob; and the GRPO flow's path for engines on the trainer's host,
(d) ``SharedWeights.write`` (a cast into a mapped safetensors file in the engine's dtype) + ``load_weights`` of it,
against (e) a clone of the weights already cast to that dtype. Prints min and median seconds of each and the ratios
(a)/(c), (b)/(c) (and against c') from medians and from mins; P4 target: engine reload / copy <= 2.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _path in (REPO, REPO / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from _machine import machine_line  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "auto"])
    parser.add_argument("--kv-cache-gb", type=float, default=1.0)
    parser.add_argument("--tmpdir", default=None, help="Where to write the safetensors file (default: system temp).")
    parser.add_argument(
        "--reload-path",
        default="auto",
        choices=["auto", "vllm"],
        help="auto: llmrl's choice (in place on an eligible CPU engine, llmrl_core.weight_sync.cpu_reload); "
        "vllm: vLLM's own reload_weights, for the comparison.",
    )
    args = parser.parse_args()

    import torch

    from llmrl_core.model_store import base_state_dict
    from llmrl_core.modules.backends.types import EngineConfig
    from llmrl_core.modules.backends.vllm.engine import shutdown_llm
    from llmrl_core.modules.backends.vllm.worker import vLLMWorker
    from llmrl_core.weight_sync.serialization import state_dict_to_bytes, write_state_dict_atomic
    from llmrl_core.weight_sync.updater import cast_floats, engine_dtype
    from storage.handoff import SharedWeights

    state = base_state_dict(None)
    blob = state_dict_to_bytes(state)
    tmp = Path(tempfile.mkdtemp(prefix="bench-weights-", dir=args.tmpdir))
    path = write_state_dict_atomic(state, tmp / "policy.safetensors")

    t = time.perf_counter()
    worker = vLLMWorker(EngineConfig(model=None, dtype=args.dtype, kv_cache_gb=args.kv_cache_gb, seed=0))
    startup_s = time.perf_counter() - t
    version = 0
    if args.reload_path == "vllm":
        worker.llm.collective_rpc(_use_vllms_reload)

    def load_file() -> None:
        nonlocal version
        version += 1
        worker.load_weights(path, version)

    def load_bytes() -> None:
        nonlocal version
        version += 1
        worker.load_weights(blob, version)

    shared = SharedWeights(engine_dtype(worker.llm) or torch.float32, Path(tmp))  # the flow's path, engines beside
    cast = cast_floats(state, shared.dtype)

    def publish_shared() -> None:
        nonlocal version
        version += 1
        written = shared.write(state)
        assert written is not None, "no room for the shared file"
        worker.load_weights(written, version)

    def copy_cast() -> None:
        copy = {k: v.clone() for k, v in cast.items()}
        del copy

    def copy_tensors() -> None:
        copy = {k: v.clone() for k, v in state.items()}
        del copy

    def copy_bytes() -> None:
        copy = bytes(memoryview(blob))  # bytes(blob) would return blob itself, not a copy
        assert len(copy) == len(blob)
        del copy

    sides = {
        "(a) load file": load_file,
        "(b) load bytes": load_bytes,
        "(c) clone tensors": copy_tensors,
        "(c') copy bytes": copy_bytes,
        "(d) shared file": publish_shared,
        "(e) clone cast": copy_cast,
    }
    timings: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for fn in sides.values():  # untimed warm-up (first reload, allocator, page cache)
            fn()
        for _ in range(args.repeats):  # interleaved: fair under background load
            for name, fn in sides.items():
                t = time.perf_counter()
                fn()
                timings[name].append(time.perf_counter() - t)
        reload_path = "in place" if worker.llm.collective_rpc(_reloads_in_place)[0] else "vLLM reload_weights"
    finally:
        shutdown_llm(worker.llm)
        shutil.rmtree(tmp, ignore_errors=True)

    mins = {name: min(v) for name, v in timings.items()}
    meds = {name: statistics.median(v) for name, v in timings.items()}
    print(machine_line())
    print(
        f"weights: {len(state)} tensors, safetensors blob {len(blob) / 1e6:.1f} MB (file "
        f"{path.name}); engine dtype={args.dtype}, started in {startup_s:.1f} s; {args.repeats} repeats; "
        f"last version loaded {worker.policy_version}; reload path: {reload_path}"
    )
    print(f"{'side':<18} {'min s':>9} {'median s':>9} {'MB/s (med)':>11}")
    for name in sides:
        print(f"{name:<18} {mins[name]:9.4f} {meds[name]:9.4f} {len(blob) / 1e6 / meds[name]:11.0f}")
    pairs = [(o, b) for o in ("(a) load file", "(b) load bytes") for b in ("(c) clone tensors", "(c') copy bytes")]
    pairs += [("(d) shared file", b) for b in ("(c) clone tensors", "(c') copy bytes", "(e) clone cast")]
    for ours, base in pairs:
        med, low = meds[ours] / meds[base], mins[ours] / mins[base]
        verdict = "meets" if med <= 2.0 else "misses"
        print(
            f"ratio {ours[:3]}/{base[:4]:<4}: median {med:7.2f}, min {low:7.2f}  "
            f"(P4 target <= 2, lower is better; median {verdict} it)"
        )


def _use_vllms_reload(worker: object) -> None:
    """In the engine: take vLLM's ``reload_weights`` for every reload of this run."""
    from llmrl_core.weight_sync.worker_extension import _worker

    _worker(worker).model_runner._llmrl_packs_in_place = False


def _reloads_in_place(worker: object) -> bool:
    from llmrl_core.weight_sync.worker_extension import _worker

    return bool(getattr(_worker(worker).model_runner, "_llmrl_packs_in_place", False))


if __name__ == "__main__":
    main()
