#!/usr/bin/env bash
# The GPU checks, on a CUDA machine where vLLM is not installed (run from the repository root):
#   1. the gpu-marked tests;
#   2. bench/bench_trainer_agreement.py on CUDA (skipped with SKIP_AGREEMENT=1): the Transformers engine's sampling
#      speed and its log-probs against the trainer's, fp32 and bf16;
#   3. the main job (`llmrl run grpo`: 10 GRPO iterations and the held-out evaluation) with rollout.backend=transformers,
#      trainer and engine sharing the GPU (weight route auto: the shared-memory file), Prefect / Dask / MLflow as in
#      any run;
#   4. the same for IPC_JOB_ITERATIONS (default 3) iterations with rollout.weight_sync=cuda_ipc (the engine opens the
#      trainer's weights on the GPU), to set its hand-over beside the shared file's;
#   5. `llmrl plan` of the main job on this GPU, and each run's per-version hand-over, time and peak CUDA memory
#      (bench/run_metrics.py).
# Each step's output goes to $OUT (default /tmp/llmrl-gpu-checks). Python packages the machine lacks can be put on
# PYTHONPATH beforehand; LLMRL_HOME defaults to a fresh folder under /tmp.
set -uo pipefail
OUT=${OUT:-/tmp/llmrl-gpu-checks}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export LLMRL_HOME=${LLMRL_HOME:-/tmp/llmrl-gpu-home}
PY=${PY:-python3}
LLMRL=("$PY" -c "from llmrl_cli.main import app; app()")  # the `llmrl` command, without installing the project
RUNS="$LLMRL_HOME/runs"

echo "=== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
"$PY" -c "import importlib.util as u; print('vllm installed:', u.find_spec('vllm') is not None)"

echo "=== 1. gpu-marked tests"
timeout 300 "$PY" -m pytest -q -m gpu -rs -p no:cacheprovider \
  tests/test_train_step.py tests/test_categorical_sequential.py tests/test_weight_sync.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -8

if [ "${SKIP_AGREEMENT:-0}" != 1 ]; then
  echo "=== 2. engine vs trainer log-probs and speeds on CUDA"
  timeout 300 "$PY" bench/bench_trainer_agreement.py --device cuda --prompts 64 --max-new-tokens 128 2>&1 \
    | grep -v "Loading weights" | tee "$OUT/agreement.log"
fi

run_job() {  # name timeout args...
  local name=$1 limit=$2 start
  shift 2
  start=$(date +%s)
  timeout "$limit" "${LLMRL[@]}" run grpo --set rollout.backend=transformers --set runs_dir="$RUNS" \
    --set run_id="$name" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? in $(( $(date +%s) - start )) s"
  grep -E "reach the engines|memory plan|CUDA memory|held-out accuracy|version [0-9]+ -> |Error|error" "$OUT/$name.log" | tail -30
  "$PY" bench/run_metrics.py "$RUNS" "$name" --json "$OUT/$name.metrics.json" 2>&1 | tail -14
}

echo "=== 3. the main job, rollout.backend=transformers (weight route auto)"
run_job gpu-main "${MAIN_JOB_TIMEOUT:-420}"

echo "=== 4. the same with rollout.weight_sync=cuda_ipc"
run_job gpu-ipc "${IPC_JOB_TIMEOUT:-240}" --set iterations="${IPC_JOB_ITERATIONS:-3}" \
  --set rollout.weight_sync=cuda_ipc --set final_eval.questions=0

echo "=== 5. the memory plan of the main job on this GPU"
"${LLMRL[@]}" plan --set rollout.backend=transformers 2>&1 | tee "$OUT/plan.log"
