"""The codebase's structure figures (issue 67's): import circles among the project's modules, modules over 500
lines, the non-test line count and the length of ``flows.grpo.run_grpo``.

An import circle is a strongly connected component of the import graph (every ``import`` / ``from ... import``, in
functions too; imports under ``if TYPE_CHECKING:`` are left out: they never run). Run from the repository root:
``.venv/bin/python scripts/structure.py``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("llmrl_core", "runtime", "tasks", "flows", "storage", "llmrl_cli")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports (the longest module prefix of each imported name)."""
    tree = ast.parse(path.read_text())
    for node in list(ast.walk(tree)):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        for imported in names:
            parts = imported.split(".")
            prefix = next(
                (".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules), None
            )
            if prefix and prefix != name:
                found.add(prefix)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def main() -> None:
    files = {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}
    graph = {name: imported_modules(name, path, set(files)) for name, path in files.items()}
    found = circles(graph)
    print(f"import circles: {len(found)}")
    for component in found:
        print("  " + " <-> ".join(component))
    long = sorted(((len(p.read_text().splitlines()), n) for n, p in files.items()), reverse=True)
    print("modules over 500 lines: " + (", ".join(f"{n} ({k})" for k, n in long if k > 500) or "none"))
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    lines = sum(len((ROOT / f).read_text().splitlines()) for f in tracked if not f.startswith("tests/"))
    print(f"non-test Python lines: {lines}")
    flow = ast.parse((ROOT / "flows" / "grpo.py").read_text())
    run = next(n for n in flow.body if isinstance(n, ast.FunctionDef) and n.name == "run_grpo")
    print(f"run_grpo: {run.end_lineno - run.lineno + 1} lines")


if __name__ == "__main__":
    main()
