"""The JSON schema of a flow's config (``llmrl config schema grpo``): every setting, nested by section, typed.

The schema is pydantic's for the config dataclasses, from the validator that loads them (types, defaults,
``Literal`` choices, nested sections, unknown keys refused). Each
setting's description is the comment written beside its field in the config module (or on the comment lines
right above it), else the sentence of its section's docstring that names it; each section's description is its
class docstring. The code stays the one place they are written.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from typing import Any

_FIELD = re.compile(r"^\s+(?P<name>[A-Za-z_]\w*)\s*:\s*[^=#]+(?:=.*)?$")


def field_comments(cls: type) -> dict[str, str]:
    """Each field's comment in ``cls``'s source: the ``# ...`` after it on its line, else the comment lines above
    it, which also describe the fields right after it up to a blank line or a field with a comment of its own
    (fields without either are left out)."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):  # no source (a frozen app): no descriptions
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    comments: dict[str, str] = {}
    above: list[str] = []
    carried = False  # `above` was already given to a field: a new comment line starts a new block
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            above = [] if carried else above
            carried = False
            above.append(stripped.lstrip("#").strip())
            continue
        code, _, trailing = line.partition("  # ")
        match = _FIELD.match(code.rstrip())
        if match and match.group("name") in names:
            text = trailing.strip() or " ".join(above)
            if text:
                comments[match.group("name")] = text
            if not trailing.strip():
                carried = True
                continue  # the comment block above goes on to the next field
        above, carried = [], False
    return comments


def docstring_mentions(cls: type) -> dict[str, str]:
    """For each field named in ``cls``'s docstring as ````name````: the first sentence that names it."""
    doc = " ".join(inspect.cleandoc(cls.__doc__ or "").split())
    sentences = re.split(r"(?<=[.;])\s+(?=[A-Z`(])", doc)
    found: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        mark = f"``{f.name.rstrip('_')}``"
        hit = next((s for s in sentences if mark in s), None)
        if hit:
            found[f.name] = hit
    return found


def _sections(cls: type, found: dict[str, type]) -> dict[str, type]:
    """``cls`` and every config dataclass nested in it, by class name (the schema's ``$defs`` keys)."""
    found[cls.__name__] = cls
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        for tp in (hints[f.name], *typing.get_args(hints[f.name])):
            if isinstance(tp, type) and dataclasses.is_dataclass(tp) and tp.__name__ not in found:
                _sections(tp, found)
    return found


def config_schema(cls: type) -> dict[str, Any]:
    """The JSON schema of the config dataclass ``cls`` with each setting's and section's description."""
    from llmrl_core.pipeline.config_io import config_key, config_validator

    schema = config_validator(cls).json_schema()
    for name, section in _sections(cls, {}).items():
        node = schema if name == cls.__name__ else schema.get("$defs", {}).get(name)
        if node is None:
            continue
        if section.__doc__:
            node["description"] = inspect.cleandoc(section.__doc__)
        described: dict[str, str] = {}
        for base in reversed([c for c in section.__mro__ if dataclasses.is_dataclass(c)]):  # inherited fields too
            described.update({**docstring_mentions(base), **field_comments(base)})
        for field_name, text in described.items():  # a property is named as the key is written (``from``)
            prop = node.get("properties", {}).get(config_key(field_name))
            if prop is not None:
                prop["description"] = text
    defs = schema.get("$defs", {})
    for node in [schema, *defs.values()]:  # a section setting: its section's first docstring line
        for prop in node.get("properties", {}).values():
            target = defs.get(str(prop.get("$ref", "")).rpartition("/")[2], {})
            if "description" not in prop and target.get("description"):
                prop["description"] = target["description"].split("\n\n")[0].replace("\n", " ")
    return schema
