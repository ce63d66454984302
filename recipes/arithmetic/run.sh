#!/usr/bin/env bash
# The arithmetic recipe end to end: GRPO (recipes/arithmetic/grpo.yaml), then the held-out evaluation of
# every kept version against the base model, greedy and sampled. Extra arguments go to `llmrl run grpo`,
# e.g. `--set run_id=my-run` or `--set train.lr=2e-5`.
#   bash recipes/arithmetic/run.sh          # about 30 minutes on 2 CPU cores (GRPO ~25, evaluation ~4)
set -euo pipefail
cd "$(dirname "$0")/../.."
LLMRL=${LLMRL:-.venv/bin/llmrl}
RUN_ID=arithmetic-grpo
for arg in "$@"; do
  case "$arg" in run_id=*) RUN_ID=${arg#run_id=} ;; esac
done
"$LLMRL" run grpo --config recipes/arithmetic/grpo.yaml "$@"
"$LLMRL" run evaluate "$RUN_ID" --questions "${EVAL_QUESTIONS:-200}" --samples "${EVAL_SAMPLES:-2}" --temperature 0.7
