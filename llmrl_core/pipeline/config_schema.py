"""The JSON schema of a flow's config (``llmrl config schema grpo``): every setting, nested by section, typed.

The schema is pydantic's for the config dataclasses, from the validator that loads them (types, defaults,
``Literal`` choices, nested sections, unknown keys refused). Each setting is titled by its key as written and
described by the comment beside its field in the config module (or on the comment lines right above it), else
the sentence of its section's docstring that names it; each section's description is its class docstring. The
code stays the one place they are written. pydantic applies this itself (:func:`describe_section` is each
section's ``json_schema_extra``), so every schema of a config has it, the Prefect run form's included.
"""

from __future__ import annotations

import dataclasses
import inspect
import keyword
import re
import typing
from typing import Any

_FIELD = re.compile(r"^\s+(?P<name>[A-Za-z_]\w*)\s*:\s*[^=#]+(?:=.*)?$")


def config_key(name: str) -> str:
    """The key a field is written as: a Python keyword's field (``from_``) without its trailing underscore."""
    return name[:-1] if name.endswith("_") and keyword.iskeyword(name[:-1]) else name


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


def describe_section(schema: dict[str, Any], cls: type) -> None:
    """pydantic's ``json_schema_extra`` hook of a config section: the section's docstring as its description, each
    setting titled by the key it is written as (``run_id``, ``from``) and described by its comment (or the docstring
    sentence that names it); a setting that is a section gets that section's first docstring line."""
    if cls.__doc__:
        schema["description"] = inspect.cleandoc(cls.__doc__)
    described: dict[str, str] = {}
    for base in reversed([c for c in cls.__mro__ if dataclasses.is_dataclass(c)]):  # inherited fields too
        described.update({**docstring_mentions(base), **field_comments(base)})
    hints = typing.get_type_hints(cls)
    properties = schema.get("properties", {})
    for f in dataclasses.fields(cls):
        prop = properties.get(config_key(f.name))
        if prop is None:
            continue
        prop["title"] = config_key(f.name)
        section = next((t for t in (hints[f.name], *typing.get_args(hints[f.name])) if _is_section(t)), None)
        text = described.get(f.name) or (inspect.cleandoc(section.__doc__).split("\n\n")[0] if section else "")
        if text:
            prop["description"] = " ".join(text.split())


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp) and bool(tp.__doc__)
