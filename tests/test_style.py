"""Repository rules that are cheap to check on every run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_llmrl_core_never_imports_prefect_or_mlflow():
    pattern = re.compile(r"^\s*(import|from)\s+(prefect|mlflow)\b", re.MULTILINE)
    offenders = [str(p) for p in (ROOT / "llmrl_core").rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []
