#!/usr/bin/env bash
# The tool recipe end to end: GRPO with the Python interpreter (recipes/arithmetic-tool/grpo.yaml), then the
# held-out evaluation of versions 0, 4, 8, 12, each question played in the run's env (tool calls
# executed), greedy and sampled. Extra arguments go to `llmrl run grpo`, e.g. `--set run_id=my-run`.
#   bash recipes/arithmetic-tool/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
LLMRL=${LLMRL:-.venv/bin/llmrl}
RUN_ID=arithmetic-tool-grpo
for arg in "$@"; do
  case "$arg" in run_id=*) RUN_ID=${arg#run_id=} ;; esac
done
"$LLMRL" run grpo --config recipes/arithmetic-tool/grpo.yaml "$@"
"$LLMRL" run evaluate "$RUN_ID" --questions "${EVAL_QUESTIONS:-150}" --samples "${EVAL_SAMPLES:-2}" --temperature 0.7 --max-new-tokens 64
