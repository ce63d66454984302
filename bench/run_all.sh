#!/usr/bin/env bash
# The benchmark suite, one script after the other (never side by side: each measures ours against the raw
# library interleaved in one process); each script's time and the suite's are printed. 25.8 min on 2 AMD EPYC cores
# (2026-11-30, the time-to-accuracy part at its smoke size here: 5.3 min of it); 15.5 min on 2 Intel Xeon cores
# with AMX before that part was added. P2, P3, scaling and time to accuracy run smaller sizes here than their
# defaults (the full time-to-accuracy comparison is its own ~35 min run). Results: bench/README.md.
#   bash bench/run_all.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
REPEATS=5 TRL_REPEATS=3 P3_ITERATIONS=4 SCALING=(--prompts 4 16 --workers 1 2 --workers-at 4)
TTA=(--steps 2 --llmrl-steps 3 --eval-questions 50)  # a smoke run: the full comparison (10 / 12 / 200) is its own ~35 min run
if [ "${1:-}" = "--quick" ]; then
  REPEATS=2 TRL_REPEATS=2 P3_ITERATIONS=2 SCALING=(--prompts 4 --workers 1 2 --workers-at 4)
  TTA=(--steps 1 --llmrl-steps 1 --eval-questions 20)
fi
SUITE_START=$SECONDS
took() { echo "-- took $(( SECONDS - STEP_START )) s (suite so far: $(( SECONDS - SUITE_START )) s)"; STEP_START=$SECONDS; }
STEP_START=$SECONDS
"$PY" bench/_machine.py
echo "== P1 (engine call) generation: llmrl generate vs raw vllm.LLM.generate, float32 and bfloat16"
"$PY" bench/bench_generate.py --prompts 16 --max-tokens 64 --dtype float32 --repeats 3 --skip-hf
"$PY" bench/bench_generate.py --prompts 16 --max-tokens 64 --dtype bfloat16 --repeats 3 --skip-hf
took
echo "== P1 rollout stage: the rollout actor (env, collector, records, Parquet shard) vs raw vllm.LLM.generate"
"$PY" bench/bench_rollout_stage.py --prompts 8 --group-size 8 --repeats 3
took
echo "== P4 weight publish: engine reload (file, bytes) vs in-memory copies"
"$PY" bench/bench_weight_publish.py --dtype auto --repeats 2
took
echo "== P5 storage: TrajectoryStore write+read vs raw pyarrow"
"$PY" bench/bench_storage.py --rows 2048 --repeats "$REPEATS"
took
echo "== train step and sampler agreement: fp32 vs bf16 autocast"
"$PY" bench/bench_trainer_agreement.py --prompts 16 --max-new-tokens 48
took
echo "== P2 train step: ours vs TRL GRPOTrainer (separate venv bench/.venv-trl), bf16 autocast"
"$PY" bench/bench_train_vs_trl.py --prompts 4 --group-size 4 --repeats "$TRL_REPEATS"
took
echo "== P3 orchestration: the GRPO flow's iteration time minus engine/trainer compute"
"$PY" bench/bench_orchestration.py --iterations "$P3_ITERATIONS"
took
echo "== scaling: GRPO flow iteration time vs prompts per iteration and rollout workers"
"$PY" bench/bench_scaling.py "${SCALING[@]}"
took
echo "== time to accuracy: llmrl's main job vs trl.GRPOTrainer, held-out accuracy against wall-clock time"
"$PY" bench/bench_time_to_accuracy.py "${TTA[@]}"
took
echo "== the suite took $(( SECONDS - SUITE_START )) s"
