"""The rollout stage vs raw vLLM (target P1): tokens/s of ``RolloutWorker.rollout`` ÷ ``vllm.LLM.generate``.

Usage: ``.venv/bin/python bench/bench_rollout_stage.py [--prompts 8] [--group-size 8] [--dtype auto] [--repeats 3]``

"Ours" is the flows' rollout actor doing a whole stage: the env renders the prompts (chat template, few-shot
turns), the collector steps the env, the reward parser scores, rows become trajectory records and a Parquet
staging shard is written. "Raw" is ``vllm.LLM.generate`` on the same engine, with the exact prompt token ids
the stage sampled from (read back from its shard), the same temperature / top_p / max_tokens and log-probs of
the sampled tokens (the stage needs them), one seeded request per row. The task is the main job's (two-digit
addition, ``llmrl_cli/main_job.yaml``). Rounds alternate (ours, raw, ...) after one untimed warm-up of each;
the actor runs in this process here (in a flow it is a Dask actor: its calls carry rows and a summary only).
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from llmrl_cli.run import MAIN_JOB
    from llmrl_core.model_store import resolve_model
    from llmrl_core.modules.backends.vllm.engine import shutdown_llm
    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig
    from runtime.rollout_actor import RolloutWorker, sampling_config
    from storage.trajectories import TrajectoryStore
    from tasks.grpo_stages import load_prompts

    cfg = load_config(
        GRPOConfig,
        MAIN_JOB,
        [
            f"data.prompts_per_iteration={args.prompts}",
            f"data.group_size={args.group_size}",
            f"rollout.dtype={args.dtype}",
            f"rollout.max_new_tokens={args.max_new_tokens}",
            "progress=false",
        ],
    )
    print(machine_line())
    t0 = time.perf_counter()
    model_dir = resolve_model(cfg.model)
    worker = RolloutWorker(cfg, model_dir)
    llm = worker.worker.llm
    print(
        f"engine: {worker.describe()['rollout_dtype']} ({worker.describe()['rollout_dtype_reason']}), "
        f"started in {time.perf_counter() - t0:.1f} s; {args.prompts} prompts x {args.group_size} samples, "
        f"max {args.max_new_tokens} new tokens, T={cfg.rollout.temperature}"
    )
    staging = tempfile.mkdtemp(prefix="bench-rollout-")
    store = TrajectoryStore(staging)
    state = None
    times: dict[str, list[float]] = {"ours": [], "raw": []}
    tokens: dict[str, list[int]] = {"ours": [], "raw": []}

    def ours(shard: int) -> tuple[float, int, list[list[int]]]:
        nonlocal state
        rows, state = load_prompts.fn(cfg, state)
        start = time.perf_counter()
        worker.rollout(rows, 0, staging, shard)
        seconds = time.perf_counter() - start
        records = store.read_records(cfg.run_id, version=0)  # this round's shard only (partition cleared before)
        return seconds, sum(sum(r.response_mask) for r in records), [r.prompt_tokens for r in records]

    def raw(prompts: list[list[int]], shard: int) -> tuple[float, int]:
        s = sampling_config(cfg, 0, shard)
        params = [
            SamplingParams(
                max_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, seed=s.seed + i, logprobs=0
            )
            for i in range(len(prompts))
        ]
        start = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        seconds = time.perf_counter() - start
        return seconds, sum(len(o.outputs[0].token_ids) for o in outs)

    store.delete_partition(cfg.run_id, 0)
    _, _, prompts = ours(0)  # warm-up of both sides
    raw(prompts, 0)
    for rep in range(1, args.repeats + 1):
        store.delete_partition(cfg.run_id, 0)
        seconds, n, prompts = ours(rep)
        times["ours"].append(seconds)
        tokens["ours"].append(n)
        seconds, n = raw(prompts, rep)
        times["raw"].append(seconds)
        tokens["raw"].append(n)
    print(f"{'side':6} {'min s':>8} {'median s':>9} {'tokens/s (med)':>15} {'tokens/s (best)':>16}")
    rate = {}
    for side in ("ours", "raw"):
        per_s = [n / t for n, t in zip(tokens[side], times[side], strict=True)]
        rate[side] = (statistics.median(per_s), max(per_s))
        print(
            f"{side:6} {min(times[side]):8.2f} {statistics.median(times[side]):9.2f} {rate[side][0]:15.1f} "
            f"{rate[side][1]:16.1f}"
        )
    print(
        f"P1 tokens/s ratio ours/raw: median {rate['ours'][0] / rate['raw'][0]:.3f}, "
        f"best {rate['ours'][1] / rate['raw'][1]:.3f} (target >= 0.95)"
    )
    dtype = worker.describe()["rollout_dtype"]
    shutdown_llm(llm)
    from _roofline import share_of_peak  # measured with the engine gone: the cores are the peak's alone

    print(
        f"of the machine (generated tokens only, best run): ours {share_of_peak(model_dir, rate['ours'][1], dtype)}; "
        f"raw {share_of_peak(model_dir, rate['raw'][1], dtype)}"
    )


if __name__ == "__main__":
    main()
