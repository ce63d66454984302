"""Every module of the project imports (the contributor tier, ``scripts/test.sh --fast``, runs this: a module whose
behaviour is tested only by engine-starting tests still loads there), and the library keeps its layering: nothing
under ``llmrl_core`` imports Prefect or MLflow."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

PACKAGES = ("llmrl_core", "runtime", "tasks", "flows", "storage", "llmrl_cli")
ROOT = Path(__file__).resolve().parents[1]


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package)
        names.extend(info.name for info in pkgutil.walk_packages([str(ROOT / package)], f"{package}."))
    return names


def test_every_module_imports() -> None:
    names = _modules()
    on_disk = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    assert len(names) == len(on_disk), "a folder without __init__.py hides its modules from the walk"
    failed = {}
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - every failure is reported, with its module
            failed[name] = repr(exc)
    assert not failed, failed


def _top_packages_loaded_by(package: str, watched: set[str]) -> list[str]:
    """Import every module of ``package`` in a fresh interpreter; which of the ``watched`` top-level packages loaded."""
    modules = [name for name in _modules() if name.split(".")[0] == package]
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(watched)!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_library_never_imports_prefect_or_mlflow() -> None:
    """``import llmrl_core`` and every module under it, in a fresh interpreter: neither Prefect nor MLflow loads."""
    assert _top_packages_loaded_by("llmrl_core", {"prefect", "mlflow"}) == []


def test_the_runtime_never_imports_the_layers_above_it() -> None:
    """``runtime`` (the Dask actors and their placement) sits below the Prefect tasks and the flows: importing every
    one of its modules loads neither ``tasks`` nor ``flows`` (nor the command line)."""
    assert _top_packages_loaded_by("runtime", {"tasks", "flows", "llmrl_cli"}) == []


def test_the_flows_import_only_prefect_tasks_and_the_config() -> None:
    """A flow is its stages in order: it imports Prefect, ``tasks`` and the config (``llmrl_core.pipeline``) and the
    standard library, never the runtime, the stores or the rest of the library (issue 67)."""
    import ast

    allowed = ("prefect", "tasks", "llmrl_core.pipeline", "flows")
    found = {}
    for path in sorted((ROOT / "flows").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if name == "__future__" or top in sys.stdlib_module_names:
                    continue
                if not any(name == a or name.startswith(f"{a}.") for a in allowed):
                    found.setdefault(path.name, []).append(name)
    assert found == {}, found
