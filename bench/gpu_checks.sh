#!/usr/bin/env bash
# The GPU checks, on a CUDA machine where vLLM is not installed (run from the repository root):
#   1. the gpu-marked tests;
#   2. bench/bench_trainer_agreement.py on CUDA: the Transformers engine's sampling speed and its log-probs against
#      the trainer's, fp32 and bf16;
#   3. the main job (`llmrl run grpo`: 10 GRPO iterations and the held-out evaluation) with rollout.backend=transformers,
#      trainer and engine sharing the GPU, Prefect / Dask / MLflow as in any run.
# Each step's output goes to $OUT (default /tmp/llmrl-gpu-checks). Python packages the machine lacks can be put on
# PYTHONPATH beforehand; LLMRL_HOME defaults to a fresh folder under /tmp.
set -uo pipefail
OUT=${OUT:-/tmp/llmrl-gpu-checks}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export LLMRL_HOME=${LLMRL_HOME:-/tmp/llmrl-gpu-home}
PY=${PY:-python3}
LLMRL=("$PY" -c "from llmrl_cli.main import app; app()")  # the `llmrl` command, without installing the project

echo "=== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
"$PY" -c "import importlib.util as u; print('vllm installed:', u.find_spec('vllm') is not None)"

echo "=== 1. gpu-marked tests"
timeout 300 "$PY" -m pytest -q -m gpu -rs -p no:cacheprovider \
  tests/test_train_step.py tests/test_categorical_sequential.py tests/test_weight_sync.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -8

echo "=== 2. engine vs trainer log-probs and speeds on CUDA"
timeout 300 "$PY" bench/bench_trainer_agreement.py --device cuda --prompts 64 --max-new-tokens 128 2>&1 \
  | grep -v "Loading weights" | tee "$OUT/agreement.log"

echo "=== 3. the main job, rollout.backend=transformers"
start=$(date +%s)
timeout "${MAIN_JOB_TIMEOUT:-420}" "${LLMRL[@]}" run grpo --set rollout.backend=transformers \
  --set runs_dir="$LLMRL_HOME/runs" > "$OUT/main_job.log" 2>&1
echo "main job rc=$? in $(( $(date +%s) - start )) s"
grep -E "rollouts in|weight route|memory plan|held-out accuracy|reward|iteration|Error|error" "$OUT/main_job.log" | tail -40
