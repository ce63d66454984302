"""Scaling of the GRPO flow: iteration time vs prompts per iteration and vs rollout workers.

Usage: ``.venv/bin/python bench/bench_scaling.py [--prompts 4 16 64] [--workers 1 2] [--workers-at 16]
[--group-size 2] [--max-new-tokens 32] [--iterations 2]``

Each point is one run of the real flow, ``llmrl run grpo`` (the main job: two-digit addition with the packaged
SmolLM2-135M-Instruct, zero-signal groups skipped by the trainer), isolated as in ``bench_orchestration.py``
(``bench/_flow_timing.py``). The prompt sweep runs with one rollout worker; the worker sweep
(``rollout.workers``) at ``--workers-at`` prompts. A run does ``--iterations`` iterations and the last one is
timed (the first is the warm-up), from its ``load-prompts`` start to the end of its last task, split into the
rollout actor's stage time, the optimizer step and the rest (orchestration: publish, Parquet, MLflow, Prefect).
Start-up (engines, trainer, cluster, version 0) is printed apart: it is paid once per run, not per iteration.

Sizes: the defaults (4, 16, 64 prompts; groups of 2; answers of at most 32 tokens; 2 iterations per run) keep
the script near 10 minutes on 2 quiet cores: every run pays ~1 minute of start-up, and the brief's 8 / 32 / 128
prompts took 21 minutes (``--prompts 8 32 128 --workers-at 32``). The trainer's share depends on how many groups
have a reward signal (the others are skipped), so the trained rows are printed with each point; with no signal
at all the trainer only runs the agreement forward pass ("step" is then the whole train task).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _path in (REPO, REPO / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from _flow_timing import run_flow  # noqa: E402
from _machine import load_line, machine_line  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workers-at", type=int, default=16, help="prompts per iteration of the worker sweep")
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=2)
    args = parser.parse_args()
    print(machine_line())
    print(load_line())
    points = [(p, 1) for p in args.prompts] + [(args.workers_at, w) for w in args.workers if w != 1]
    print(
        f"points (prompts, rollout workers): {points}; group size {args.group_size}, max {args.max_new_tokens} new "
        f"tokens, {args.iterations} iterations per run, the last one timed"
    )
    started = time.perf_counter()
    results = []
    for prompts, workers in points:
        root = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
        overrides = [
            f"iterations={args.iterations}",
            f"data.prompts_per_iteration={prompts}",
            f"data.group_size={args.group_size}",
            f"rollout.max_new_tokens={args.max_new_tokens}",
            f"rollout.workers={workers}",
        ]
        run = run_flow(overrides, root, run_id=f"bench-scaling-p{prompts}-w{workers}")
        it = run.iterations[-1]
        m = it.metrics
        results.append((prompts, workers, run, it))
        print(
            f"  {prompts:4d} prompts, {workers} worker(s): iteration {it.wall:6.1f} s "
            f"(rollout {m.get('rollout_s', 0):5.1f} s, step {it.train_compute:5.1f} s "
            f"on {m.get('train_samples', 0):.0f} rows, rest "
            f"{it.wall - it.compute:4.1f} s); start-up {run.startup:5.1f} s, command {run.wall:5.1f} s",
            flush=True,
        )
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"{'prompts':>7} {'workers':>7} {'rows':>5} {'iter s':>7} {'s/prompt':>8} {'rollout s':>9} "
        f"{'rollout tok/s':>13} {'step s':>7} {'trained':>7} {'rest s':>6} {'start-up s':>10}"
    )
    for prompts, workers, run, it in results:
        m = it.metrics
        rows = prompts * args.group_size
        tokens = m.get("response_tokens_mean", 0.0) * rows
        rollout = m.get("rollout_s", 0.0)
        print(
            f"{prompts:7d} {workers:7d} {rows:5d} {it.wall:7.1f} {it.wall / prompts:8.2f} {rollout:9.1f} "
            f"{tokens / rollout if rollout else 0:13.0f} {it.train_compute:7.1f} "
            f"{m.get('train_samples', 0):7.0f} {it.wall - it.compute:6.1f} {run.startup:10.1f}"
        )
    base = {w: it for p, w, _, it in results if p == args.workers_at}
    if 1 in base and len(base) > 1:
        for w, it in sorted(base.items()):
            if w != 1:
                r1, rw = base[1].metrics.get("rollout_s", 0.0), it.metrics.get("rollout_s", 0.0)
                print(
                    f"{w} rollout workers vs 1 at {args.workers_at} prompts: iteration x{base[1].wall / it.wall:.2f} "
                    f"faster, rollout stage x{r1 / rw if rw else float('nan'):.2f} faster"
                )
    print(f"total {time.perf_counter() - started:.0f} s; {load_line()}")


if __name__ == "__main__":
    main()
