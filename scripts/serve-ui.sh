#!/usr/bin/env bash
# Serve llmrl's Prefect deployments locally, offline: a Prefect server with its UI on 127.0.0.1, the
# `llmrl-local` process work pool, every deployment of prefect.yaml, and one worker. Ctrl-C stops all.
#
#   bash scripts/serve-ui.sh            # then open http://127.0.0.1:4200
#   .venv/bin/prefect deployment run 'gsm8k-demo/local' --param questions=2   # in another shell, with
#                                       # PREFECT_API_URL=http://127.0.0.1:4200/api
#
#   PREFECT_PORT=4200                   the port (loopback only)
#   PREFECT_HOME=~/.cache/llmrl/prefect where the server keeps its database (runs survive restarts)
#   LLMRL_VENV=.venv                    the virtual environment that holds prefect and llmrl
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=${PREFECT_PORT:-4200}
PREFECT="${LLMRL_VENV:-.venv}/bin/prefect"
[ -x "$PREFECT" ] || { echo "no $PREFECT: run scripts/install.sh first" >&2; exit 2; }
export PREFECT_HOME=${PREFECT_HOME:-${LLMRL_HOME:-$HOME/.cache/llmrl}/prefect}
export PREFECT_API_URL="http://127.0.0.1:$PORT/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=true
mkdir -p "$PREFECT_HOME"

pids=()
cleanup() {
  trap - EXIT INT TERM
  # the worker first: it hangs on shutdown when the server is already gone
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "${pids[i]}" 2>/dev/null || break; sleep 1; done
    kill -KILL "${pids[i]}" 2>/dev/null || true
  done
}
trap cleanup EXIT INT TERM

"$PREFECT" server start --host 127.0.0.1 --port "$PORT" &
pids+=($!)
for _ in $(seq 1 180); do
  curl -sf "$PREFECT_API_URL/health" >/dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2>/dev/null || { echo "prefect server exited" >&2; exit 1; }
  sleep 1
done
curl -sf "$PREFECT_API_URL/health" >/dev/null || { echo "prefect server not up after 180 s" >&2; exit 1; }

"$PREFECT" work-pool inspect llmrl-local >/dev/null 2>&1 || "$PREFECT" work-pool create llmrl-local --type process
"$PREFECT" --no-prompt deploy --all
"$PREFECT" worker start --pool llmrl-local &
pids+=($!)
echo "Prefect UI: http://127.0.0.1:$PORT  (PREFECT_API_URL=$PREFECT_API_URL; Ctrl-C stops server and worker)"
wait "${pids[0]}"
