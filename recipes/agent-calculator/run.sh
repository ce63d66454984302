#!/usr/bin/env bash
# The agent recipe end to end: GRPO of calc_agent.py through the endpoint (grpo.yaml), then the held-out
# evaluation of versions 0, 5 and 10, each question played by the agent against the endpoint of the evaluation
# engine (greedy, and one sample at T=0.7). Extra arguments go to `llmrl run grpo`, e.g. `--set run_id=my-run`.
#   bash recipes/agent-calculator/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
LLMRL=${LLMRL:-.venv/bin/llmrl}
export PYTHONPATH="$PWD/recipes/agent-calculator${PYTHONPATH:+:$PYTHONPATH}"  # the agent module, for every process
RUN_ID=agent-calculator-grpo
for arg in "$@"; do
  case "$arg" in run_id=*) RUN_ID=${arg#run_id=} ;; esac
done
"$LLMRL" run grpo --config recipes/agent-calculator/grpo.yaml "$@"
"$LLMRL" run evaluate "$RUN_ID" --versions "${EVAL_VERSIONS:-0,5,10}" --questions "${EVAL_QUESTIONS:-100}" \
  --samples 1 --temperature 0.7 --max-new-tokens 64
