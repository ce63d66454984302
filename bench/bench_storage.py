"""Trajectory write + read: llmrl's ``TrajectoryStore`` vs raw ``pyarrow.parquet`` on the same table (target P5).

Usage: ``.venv/bin/python bench/bench_storage.py [--rows 2048] [--repeats 5] [--group-size 4] [--char-tokens]``

One round = write the table then read it back. "ours" is ``TrajectoryStore.write_shard`` (validation, atomic
write) followed by ``TrajectoryStore.read_table`` (shard listing, schema check, dataset scan); "raw" is
``pyarrow.parquet.write_table`` (pyarrow's defaults, same compression as the store) followed by
``pyarrow.parquet.read_table``; "raw-tuned" is the same with the store's encoding (``TrajectoryStore.write_options``:
no dictionary pages, statistics on flat columns), so ours / raw-tuned is the cost of the store's own work.
Rounds are interleaved (ours, raw, ours, raw, ...) after one untimed warm-up of each, every round on a fresh
path (files removed between rounds, outside the timing). Prints min and median seconds and rows/s for each
side, and the throughput ratio raw_time / ours_time (P5 target: >= 0.9, higher is better).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _path in (REPO, REPO / "bench", REPO / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from _machine import machine_line  # noqa: E402

from storage.schema import records_to_table  # noqa: E402
from storage.trajectories import TrajectoryStore  # noqa: E402

RUN_ID = "bench-storage"
VERSION = 0


def build_table(rows: int, group_size: int, tokenizer) -> pa.Table:
    """``rows`` trajectory rows from ``tests/storage_records.make_records`` (GSM8K test questions)."""
    import storage_records

    make_records = storage_records.make_records
    records = []
    seed = 0
    while len(records) < rows:  # 1319 GSM8K test questions per call; more rows re-sample with a new seed
        n_prompts = -(-(rows - len(records)) // group_size)
        records += make_records(
            RUN_ID, VERSION, n_prompts=n_prompts, group_size=group_size, tokenizer=tokenizer, seed=seed
        )
        seed += 1
    return records_to_table(records[:rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument(
        "--char-tokens", action="store_true", help="Token ids from characters instead of the SmolLM2 tokenizer."
    )
    parser.add_argument("--tmpdir", default=None, help="Where to write (default: the system temp folder).")
    args = parser.parse_args()

    tokenizer = None
    if not args.char_tokens:
        from transformers import AutoTokenizer

        from llmrl_core.model_store import ensure_default_model

        tokenizer = AutoTokenizer.from_pretrained(str(ensure_default_model()))
    table = build_table(args.rows, args.group_size, tokenizer)
    n_rows = table.num_rows

    root = Path(tempfile.mkdtemp(prefix="bench-storage-", dir=args.tmpdir))
    compression = TrajectoryStore(root / "probe").compression  # the store's default codec, used for raw too
    sizes: dict[str, int] = {}

    def run_ours(i: int) -> tuple[float, float]:
        store = TrajectoryStore(root / f"ours-{i}")
        t0 = time.perf_counter()
        info = store.write_shard(RUN_ID, VERSION, i, table)
        t1 = time.perf_counter()
        got = store.read_table(RUN_ID, version=VERSION)
        t2 = time.perf_counter()
        assert got.num_rows == n_rows, (got.num_rows, n_rows)
        sizes["ours"] = info.size_bytes or 0
        return t1 - t0, t2 - t1

    def raw_side(name: str, **options: object) -> Callable[[int], tuple[float, float]]:
        """One round of raw pyarrow: ``write_table(**options)`` then ``read_table``, on a fresh file."""

        def run(i: int) -> tuple[float, float]:
            path = root / f"{name}-{i}.parquet"
            t0 = time.perf_counter()
            pq.write_table(table, path, **options)
            t1 = time.perf_counter()
            got = pq.read_table(path)
            t2 = time.perf_counter()
            assert got.num_rows == n_rows, (got.num_rows, n_rows)
            sizes[name] = path.stat().st_size
            return t1 - t0, t2 - t1

        return run

    run_raw = raw_side("raw", compression=compression)  # pyarrow's defaults but the codec
    # raw pyarrow with the store's encoding: what validation and the atomic write cost on their own
    run_raw_tuned = raw_side("raw-tuned", **TrajectoryStore(root / "probe").write_options)

    def clean(i: int) -> None:
        shutil.rmtree(root / f"ours-{i}", ignore_errors=True)
        (root / f"raw-{i}.parquet").unlink(missing_ok=True)
        (root / f"raw-tuned-{i}.parquet").unlink(missing_ok=True)

    sides = (("ours", run_ours), ("raw", run_raw), ("raw-tuned", run_raw_tuned))
    timings: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in sides}
    try:
        for _name, fn in sides:  # untimed warm-up: imports, codec setup, page cache
            fn(0)
        clean(0)
        for i in range(1, args.repeats + 1):  # interleaved: fair under background load
            for name, fn in sides:
                timings[name].append(fn(i))
            clean(i)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    total = {name: [w + r for w, r in timings[name]] for name in timings}
    mins = {name: min(v) for name, v in total.items()}
    meds = {name: statistics.median(v) for name, v in total.items()}

    print(machine_line())
    print(
        f"table: {n_rows} rows, {table.nbytes / 1e6:.1f} MB in memory; compression={compression}; "
        f"file {sizes['ours'] / 1e6:.2f} MB (ours) / {sizes['raw'] / 1e6:.2f} MB (raw); {args.repeats} repeats"
    )
    print(f"{'side':<10} {'min s':>9} {'median s':>9} {'write med':>10} {'read med':>9} {'rows/s (med)':>13}")
    for name, _ in sides:
        write_med = statistics.median(w for w, _ in timings[name])
        read_med = statistics.median(r for _, r in timings[name])
        print(
            f"{name:<10} {mins[name]:9.4f} {meds[name]:9.4f} {write_med:10.4f} {read_med:9.4f} "
            f"{n_rows / meds[name]:13.0f}"
        )
    tput_med, tput_min = meds["raw"] / meds["ours"], mins["raw"] / mins["ours"]
    print(f"time ratio ours/raw:             median {1 / tput_med:.3f}, min {1 / tput_min:.3f}")
    verdict = "meets" if tput_med >= 0.9 else "misses"
    print(
        f"throughput ratio raw_time/ours:  median {tput_med:.3f}, min {tput_min:.3f}  "
        f"(P5 target >= 0.9, higher is better; median {verdict} it)"
    )
    print(
        f"raw-tuned (pyarrow with the store's encoding) / ours: median {meds['raw-tuned'] / meds['ours']:.3f} "
        "(what validation, the sha256 and the atomic, fsynced write cost)"
    )


if __name__ == "__main__":
    main()
