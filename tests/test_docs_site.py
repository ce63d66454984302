"""The docs site (mkdocs.yml, docs/): it builds with ``mkdocs build --strict``, its configuration reference lists
every setting ``llmrl config schema`` has, and every fenced code block of README.md and of every page is either run
by a test or marked as not runnable with a reason.

The marking convention: the line right before a fence is an HTML comment, either ``<!-- run-by: PATH -->`` (the
test or CI script that runs the block; it must name the page, or hold the block's text) or
``<!-- not-run: REASON -->``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FLOWS = ("grpo", "sft", "offline")
MARK = re.compile(r"^<!-- (run-by|not-run): (.+?) -->$")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _blocks(page: Path) -> list[tuple[int, str, str]]:
    """Each fenced block of ``page``: (line number of its opening fence, the line before it, its text)."""
    lines = page.read_text().split("\n")
    blocks, start = [], None
    for n, line in enumerate(lines):
        if not line.startswith("```"):
            continue
        if start is None:
            start = n
        else:
            blocks.append((start + 1, lines[start - 1] if start else "", "\n".join(lines[start + 1 : n])))
            start = None
    assert start is None, f"{page}: the fence at line {start + 1} is never closed"
    return blocks


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="the 'test' extra (mkdocs, mkdocs-material, mkdocstrings) is not installed")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_site_builds_strictly(site):
    for page in ("index.html", "quickstart/index.html", "concepts/index.html", "configuration/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api" / "envs" / "index.html").read_text()
    assert "ChatEnv" in api  # mkdocstrings rendered the docstrings


def _dotted(schema: dict[str, Any]) -> set[str]:
    """Every setting of a flow's JSON schema as a dotted name; a section is walked, not listed; a list of sections
    is ``name[]`` with its items' settings ``name[].key`` (the reference page's convention)."""
    defs = schema.get("$defs", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        return defs[node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else node

    def section(node: dict[str, Any]) -> dict[str, Any] | None:
        options = [resolve(node), *(resolve(o) for o in node.get("anyOf", []))]
        return next((o for o in options if "properties" in o), None)

    names: set[str] = set()

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, prop in node["properties"].items():
            sub = section(prop)
            if sub is not None:
                walk(sub, f"{prefix}{key}.")
                continue
            names.add(prefix + key)
            items = resolve(prop).get("items")
            if isinstance(items, dict) and section(items) is not None:
                walk(section(items), f"{prefix}{key}[].")

    walk(schema, "")
    return names


def test_the_config_reference_lists_every_setting_of_every_flow(site):
    from typer.testing import CliRunner

    from llmrl_cli.main import app

    html = (site / "configuration" / "index.html").read_text()
    starts = {flow: html.index(f'id="flow-{flow}"') for flow in FLOWS}
    order = sorted(FLOWS, key=starts.get)
    for flow in FLOWS:
        done = CliRunner().invoke(app, ["config", "schema", flow])  # `llmrl config schema FLOW`, in process
        assert done.exit_code == 0, done.output
        expected = _dotted(json.loads(done.stdout))
        i = order.index(flow)
        part = html[starts[flow] : starts[order[i + 1]] if i + 1 < len(order) else len(html)]
        listed = set(re.findall(r"<tr>\s*<td><code>([^<]+)</code></td>", part))
        assert expected, flow
        assert listed == expected, (flow, sorted(expected - listed), sorted(listed - expected))


def test_every_code_block_is_run_by_a_test_or_marked_not_run():
    problems = []
    count = 0
    for page in _pages():
        name = page.relative_to(ROOT).as_posix()
        for line, before, text in _blocks(page):
            count += 1
            mark = MARK.match(before.strip())
            if mark is None:
                problems.append(f"{name}:{line}: no <!-- run-by: PATH --> or <!-- not-run: REASON --> line before it")
                continue
            kind, value = mark.groups()
            if kind == "not-run":
                continue
            runner = ROOT / value.strip()
            if not runner.is_file():
                problems.append(f"{name}:{line}: run-by names {value!r}, which is not a file")
                continue
            source = runner.read_text()
            if name not in source and text.strip() not in source:
                problems.append(f"{name}:{line}: {value} neither names {name} nor holds the block")
    assert count > 20
    assert not problems, "\n".join(problems)


def test_the_readme_is_short_and_keeps_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "bash scripts/install.sh && .venv/bin/llmrl run grpo" in text
    assert "bash scripts/install.sh && bash scripts/test.sh" in text
    assert "bash scripts/install.sh && bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_llmrl_docs_serves_on_loopback_and_builds_into_site(monkeypatch):
    from typer.testing import CliRunner

    import llmrl_cli.docs_cmd as docs_cmd
    from llmrl_cli.main import app

    calls = []
    monkeypatch.setattr(docs_cmd.subprocess, "call", lambda command, cwd: calls.append(command) or 0)
    assert CliRunner().invoke(app, ["docs", "--port", "8123"]).exit_code == 0
    assert CliRunner().invoke(app, ["docs", "--build"]).exit_code == 0
    assert calls[0][-3:] == ["serve", "--dev-addr", "127.0.0.1:8123"]
    assert calls[1][-4:] == ["build", "--strict", "--site-dir", str(ROOT / "site")]
