#!/usr/bin/env bash
# The reasoning-gym recipe end to end: GRPO on chain_sum (recipes/reasoning-gym/grpo.yaml), then the held-out
# evaluation (reasoning_gym:test: the same dataset and config, another seed) of every kept version, greedy and
# sampled. Extra arguments go to `llmrl run grpo`, e.g. `--set run_id=my-run`.
#   bash recipes/reasoning-gym/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
LLMRL=${LLMRL:-.venv/bin/llmrl}
RUN_ID=reasoning-gym-chain-sum
EVAL_ARGS=()
for arg in "$@"; do
  case "$arg" in
    run_id=*) RUN_ID=${arg#run_id=} ;;
    runs_dir=*) EVAL_ARGS+=(--runs-dir "${arg#runs_dir=}") ;;
  esac
done
"$LLMRL" run grpo --config recipes/reasoning-gym/grpo.yaml "$@"
"$LLMRL" run evaluate "$RUN_ID" --questions "${EVAL_QUESTIONS:-200}" --samples "${EVAL_SAMPLES:-2}" --temperature 0.7 --max-new-tokens 32 \
  "${EVAL_ARGS[@]}"
