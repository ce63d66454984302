"""Asynchronous vs synchronous GRPO: iteration throughput of the real flow with ``rollout.max_staleness`` 1 vs 0.

Usage: ``.venv/bin/python bench/bench_async.py [--iterations 4] [--prompts 8] [--workers 2] [--repeats 1]``

Each run is ``llmrl run grpo`` (the main job: two-digit addition, packaged SmolLM2-135M-Instruct), isolated as
in ``bench_orchestration.py`` (``bench/_flow_timing.py``), with ``rollout.workers`` engines; sync and async runs
alternate (``--repeats`` pairs). An iteration is timed from one version's commit to the next (Prefect's
``commit-version`` task runs), the first iteration (warm-up) excluded; the ratio of the medians is printed.

Besides the measured ratio the script prints the stage times the flow records per version (rollout, train step,
the trainer's wait for data, the engines' idle time) and the gain to expect when rollouts and training run on
separate devices: a synchronous iteration costs rollout + train + rest, an asynchronous one
max(rollout, train) + rest. On one 2-core machine the engines and the trainer share the cores, so overlapping
them mostly trades one for the other.
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

from _flow_timing import _task_runs, run_flow  # noqa: E402
from _machine import load_line, machine_line  # noqa: E402


def timed_run(staleness: int, args: argparse.Namespace, tag: str) -> dict[str, float]:
    """One isolated run; per-iteration seconds (commit to commit, warm-up excluded) and mean stage times."""
    root = Path(tempfile.mkdtemp(prefix="bench-async-"))
    try:
        run = run_flow(
            [
                f"iterations={args.iterations}",
                f"data.prompts_per_iteration={args.prompts}",
                f"data.group_size={args.group_size}",
                f"rollout.max_new_tokens={args.max_new_tokens}",
                f"rollout.workers={args.workers}",
                f"rollout.max_staleness={staleness}",
                *args.set,
            ],
            root,
            run_id=f"bench-async-k{staleness}-{tag}",
        )
        commits = sorted(
            t.end for t in _task_runs(root / "home" / "prefect" / "prefect.db") if t.name == "commit-version"
        )
        spans = [b - a for a, b in zip(commits[1:], commits[2:], strict=False)]  # commit v1 -> v2, ... (no warm-up)
        metrics = [it.metrics for it in run.iterations[1:]]

        def mean(key: str) -> float:
            values = [m[key] for m in metrics if key in m]
            return statistics.fmean(values) if values else float("nan")

        return {
            "iteration_s": statistics.median(spans),
            "rollout_s": mean("rollout_s"),
            "train_s": mean("train_s"),
            "trainer_wait_s": mean("trainer_wait_s"),
            "rollout_idle_s": mean("rollout_idle_s"),
            "startup_s": run.startup,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="sync/async pairs, alternating")
    parser.add_argument(
        "--set", action="append", default=[], help="another setting for both sides, e.g. rollout.threads=1"
    )
    args = parser.parse_args()
    print(machine_line())
    print(load_line())
    print(
        f"{args.prompts} prompts x {args.group_size}, <= {args.max_new_tokens} new tokens, {args.workers} rollout "
        f"workers, {args.iterations} iterations per run (the first not timed), {args.repeats} pair(s)"
        + (f"; {' '.join(args.set)}" if args.set else "")
    )
    started = time.perf_counter()
    results: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    for repeat in range(args.repeats):
        for staleness in (0, 1):
            r = timed_run(staleness, args, str(repeat))
            results[staleness].append(r)
            print(
                f"  max_staleness={staleness}: {r['iteration_s']:6.1f} s/iteration (rollout {r['rollout_s']:.1f} s, "
                f"train {r['train_s']:.1f} s, trainer waited {r['trainer_wait_s']:.1f} s, engines idle "
                f"{r['rollout_idle_s']:.1f} s); start-up {r['startup_s']:.0f} s; {load_line()}",
                flush=True,
            )
    med = {k: statistics.median(r["iteration_s"] for r in v) for k, v in results.items()}
    best = {k: min(r["iteration_s"] for r in v) for k, v in results.items()}
    print(
        f"async (max_staleness=1) vs sync iteration throughput: x{med[0] / med[1]:.2f} (median {med[0]:.1f} s vs "
        f"{med[1]:.1f} s; best x{best[0] / best[1]:.2f})"
    )
    sync = results[0]
    rollout = statistics.median(r["rollout_s"] for r in sync)
    train = statistics.median(r["train_s"] for r in sync)
    rest = med[0] - rollout - train
    projected = (rollout + train + rest) / (max(rollout, train) + rest)
    print(
        f"projected on separate devices (sync stage times: rollout {rollout:.1f} s, train {train:.1f} s, rest "
        f"{rest:.1f} s): x{projected:.2f} = (rollout + train + rest) / (max(rollout, train) + rest)"
    )
    print(f"total {time.perf_counter() - started:.0f} s; {load_line()}")


if __name__ == "__main__":
    main()
