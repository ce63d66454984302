#!/usr/bin/env bash
# The benchmark suite, one script after the other (never side by side: each measures ours against the raw
# library interleaved in one process). About 17 minutes on 2 cores. Results: bench/README.md.
#   bash bench/run_all.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
REPEATS=5
[ "${1:-}" = "--quick" ] && REPEATS=2
"$PY" bench/_machine.py
echo "== P1 (engine call) generation: llmrl generate vs raw vllm.LLM.generate, float32 and bfloat16"
"$PY" bench/bench_generate.py --prompts 16 --max-tokens 64 --dtype float32 --repeats 3 --skip-hf
"$PY" bench/bench_generate.py --prompts 16 --max-tokens 64 --dtype bfloat16 --repeats 3 --skip-hf
echo "== P1 rollout stage: the rollout actor (env, collector, records, Parquet shard) vs raw vllm.LLM.generate"
"$PY" bench/bench_rollout_stage.py --prompts 8 --group-size 8 --repeats 3
echo "== P4 weight publish: engine reload (file, bytes) vs in-memory copies"
"$PY" bench/bench_weight_publish.py --repeats 2
echo "== P5 storage: TrajectoryStore write+read vs raw pyarrow"
"$PY" bench/bench_storage.py --rows 2048 --repeats "$REPEATS"
echo "== train step and sampler agreement: fp32 vs bf16 autocast"
"$PY" bench/bench_trainer_agreement.py --prompts 16 --max-new-tokens 48
