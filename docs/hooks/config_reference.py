"""MkDocs hook: the configuration reference page, generated from the flows' pydantic schema at build time.

``docs/configuration.md`` holds a marker line; this hook replaces it with one table per config section of every
flow ``llmrl config schema`` knows (grpo, sft, offline): each setting's dotted name, type, default, constraints and
description, all read from the schema (``llmrl_core.pipeline.config_io.config_schema``). Nothing of it is
written by hand, so the page cannot drift from the code.

It also serves the result images that live outside ``docs/`` (``bench/results/*.png``, ``recipes/*/results/*.png``)
at their repository paths, so the benchmark and recipe pages can show them without copies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

MARKER = "<!-- config-reference -->"
ROOT = Path(__file__).resolve().parents[2]
IMAGES = ("bench/results/*.png", "recipes/*/results/*.png")


def flow_schemas() -> dict[str, dict[str, Any]]:
    """Each flow's JSON schema, as ``llmrl config schema FLOW`` prints it."""
    from llmrl_cli.config_cmd import FlowName, config_class
    from llmrl_core.pipeline.config_io import config_schema

    return {flow.value: config_schema(config_class(flow)) for flow in FlowName}


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``node`` with a ``$ref`` replaced by its definition (the node's own keys win)."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[1]]
        return {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _section(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema with properties that ``node`` is (or may be, in an ``anyOf``), else None."""
    node = _resolve(node, defs)
    if "properties" in node:
        return node
    for option in node.get("anyOf", []):
        found = _section(option, defs)
        if found:
            return found
    return None


def settings(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """Every setting of a flow as (section, dotted name, its schema), sections depth first. A list of sections
    (``env.rewards``) is named ``name[]`` and its items' settings ``name[].key``."""
    defs = schema.get("$defs", {})
    found: list[tuple[str, str, dict[str, Any]]] = []

    def walk(section: str, node: dict[str, Any], prefix: str) -> None:
        nested: list[tuple[str, dict[str, Any]]] = []
        for key, prop in node.get("properties", {}).items():
            name = f"{prefix}{key}"
            sub = _section(prop, defs)
            items = _resolve(prop, defs).get("items")
            item_section = _section(items, defs) if isinstance(items, dict) else None
            if sub is not None:
                nested.append((name, sub))
                continue
            found.append((section, name, _resolve(prop, defs)))
            if item_section is not None:
                nested.append((f"{name}[]", item_section))
        for name, sub in nested:
            walk(name, sub, f"{name}.")

    walk("", schema, "")
    return found


def type_text(node: dict[str, Any]) -> str:
    """A short type: ``string``, ``integer or null``, ``list of number``, ``map``, ``one of ...``."""
    if "enum" in node:
        return "choice"
    if "anyOf" in node:
        return " or ".join(dict.fromkeys(type_text(option) for option in node["anyOf"]))
    kind = node.get("type")
    if kind == "array":
        items = node.get("items")
        if isinstance(items, dict) and items:
            return f"list of {type_text(items)}"
        return "list"
    if kind == "object":
        return "map"
    if "$ref" in node:
        return "section"
    return str(kind or "any")


def constraints_text(node: dict[str, Any], defs: dict[str, Any]) -> str:
    """What the schema allows beyond the type: choices, bounds, lengths, patterns, nullability, a section's items."""
    parts: list[str] = []
    choices = node.get("enum") or [c for o in node.get("anyOf", []) for c in o.get("enum", [])]
    if choices:
        parts.append("one of " + ", ".join(f"`{c}`" for c in choices))
    for key, word in (
        ("minimum", "≥"),
        ("exclusiveMinimum", ">"),
        ("maximum", "≤"),
        ("exclusiveMaximum", "<"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
    ):
        if key in node:
            parts.append(f"{word} {node[key]}")
    if "pattern" in node:
        parts.append(f"matches `{node['pattern']}`")
    if any(o.get("type") == "null" for o in node.get("anyOf", [])):
        parts.append("may be null")
    if "default" not in node:
        parts.append("no default: given or built from its section")
    items = node.get("items")
    if isinstance(items, dict) and _section(items, defs) is not None:
        parts.append("each item's settings below")
    return "; ".join(parts)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(node: dict[str, Any]) -> str:
    if "default" not in node:
        return ""
    return f"`{json.dumps(node['default'], ensure_ascii=False)}`".replace("|", "\\|")


def reference_markdown(schemas: dict[str, dict[str, Any]] | None = None) -> str:
    """The generated part of the page: per flow, per section, one table row per setting."""
    schemas = flow_schemas() if schemas is None else schemas
    out: list[str] = []
    for flow, schema in schemas.items():
        defs = schema.get("$defs", {})
        out += [f"## `{flow}` {{#flow-{flow}}}", "", _cell(schema.get("description", "")), ""]
        current = None
        for section, name, node in settings(schema):
            if section != current:
                current = section
                title = f"`{section}`" if section else "top level"
                out += ["", f"### {flow}: {title}", ""]
                if section:
                    sub = _section_by_name(schema, section)
                    if sub is not None and sub.get("description"):
                        out += [_cell(sub["description"]), ""]
                out += ["| setting | type | default | constraints | description |", "|---|---|---|---|---|"]
            row = [
                f"`{name}`",
                _cell(type_text(node)),
                _default(node),
                _cell(constraints_text(node, defs)),
                _cell(node.get("description", "")),
            ]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    return "\n".join(out)


def _section_by_name(schema: dict[str, Any], dotted: str) -> dict[str, Any] | None:
    defs = schema.get("$defs", {})
    node: dict[str, Any] | None = schema
    for part in dotted.split("."):
        if node is None:
            return None
        key, is_list = (part[:-2], True) if part.endswith("[]") else (part, False)
        prop = node.get("properties", {}).get(key)
        if prop is None:
            return None
        if is_list:
            items = _resolve(prop, defs).get("items")
            node = _section(items, defs) if isinstance(items, dict) else None
        else:
            node = _section(prop, defs)
    return node


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, reference_markdown())


def on_files(files: Files, config: Any) -> Files:
    """Serve the result images outside ``docs/`` at their repository paths."""
    for pattern in IMAGES:
        for path in sorted(ROOT.glob(pattern)):
            src_uri = path.relative_to(ROOT).as_posix()
            if files.get_file_from_path(src_uri) is None:
                files.append(File(src_uri, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
