"""Load nested config dataclasses from YAML files and ``section.field=value`` overrides, with clear errors.

Every field of a config dataclass can be set in YAML (nested mappings for nested dataclasses) or on the
command line as ``--set trainer.lr=1e-6``; values are parsed as YAML scalars (``1e-6``, ``true``,
``[1, 2]``) and validated by pydantic against the dataclasses' types (and their own ``__post_init__`` checks);
its errors are re-worded to name the dotted setting. An unknown key names the full dotted path and the valid keys,
so a typo never passes silently. A flow's ``settings`` (its config, whole or in part: what the Prefect run form
sends) go over the file and under the overrides.

The YAML reading is strict where YAML 1.1 would change what was written: a key given twice is an error naming
both lines (not "the last one wins"); only ``true``/``false`` are booleans (``no``, ``off``, ``yes``, ``on`` stay
words, so ``kl_in: no`` or ``run_id: no`` mean what they say; a boolean setting still accepts them); a number
given to a text setting keeps its digits as written (``run_id: 007`` is ``"007"``, not ``"7"``); an empty file
is an error, not the defaults.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ConfigDict, TypeAdapter, ValidationError

from llmrl_core.pipeline.config_schema import config_key, describe_section

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override is malformed; the message names the file and the dotted key."""


def _field_types(cls: type) -> dict[str, Any]:
    """Each field's type, by the key it is written as."""
    hints = typing.get_type_hints(cls)
    return {config_key(f.name): hints[f.name] for f in dataclasses.fields(cls)}


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


class _SourcedInt(int):
    """An int read from YAML, with the text it was written as (a text setting keeps that: ``str()`` gives it)."""

    source: str

    def __str__(self) -> str:
        return self.source


class _SourcedFloat(float):
    """A float read from YAML, with the text it was written as (``str()`` gives it)."""

    source: str

    def __str__(self) -> str:
        return self.source


class _ConfigLoader(yaml.SafeLoader):
    """YAML for configs: duplicate keys refused, booleans only ``true``/``false``, numbers keep their text."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"line {line}: key {key!r} is given twice (first on line {seen[key]})")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _construct_sourced_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    value = _SourcedInt(loader.construct_yaml_int(node))
    value.source = str(node.value)
    return value


def _construct_sourced_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    value = _SourcedFloat(loader.construct_yaml_float(node))
    value.source = str(node.value)
    return value


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _construct_sourced_int)
_ConfigLoader.add_constructor("tag:yaml.org,2002:float", _construct_sourced_float)
_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def read_yaml(text: str) -> Any:
    """``text`` parsed by the config rules (see the module docstring)."""
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def _plain(value: Any) -> Any:
    """``value`` without the YAML source wrappers (free-form settings such as ``env.args`` hold plain numbers)."""
    if isinstance(value, _SourcedInt):
        return int(value)
    if isinstance(value, _SourcedFloat):
        return float(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    return value


def _plain_fields(config: Any) -> Any:
    """``config`` (a config dataclass, validated) with plain numbers in every free-form setting, in place."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            _plain_fields(value)
        else:
            object.__setattr__(config, f.name, _plain(value))
    return config


def strict_config(cls: type[T]) -> type[T]:
    """``cls`` and its nested config sections made ready for pydantic: an unknown key is an error, a number given to
    a text setting is taken as written, and the JSON schema describes every setting
    (:func:`~llmrl_core.pipeline.config_schema.describe_section`). A config module calls it on its config class
    when it is defined, so any schema of it (the Prefect run form's too) is described."""
    if "__pydantic_config__" not in vars(cls):
        cls.__pydantic_config__ = ConfigDict(  # type: ignore[attr-defined]
            extra="forbid", coerce_numbers_to_str=True, json_schema_extra=describe_section
        )
    for tp in _field_types(cls).values():
        for section in _sections_in(tp):
            strict_config(section)
    return cls


@functools.cache
def config_validator(cls: type) -> TypeAdapter:
    """pydantic's validator (and JSON schema) for config dataclass ``cls``, strict as :func:`strict_config` says; built
    once per class."""
    return TypeAdapter(strict_config(cls))


def config_schema(cls: type) -> dict[str, Any]:
    """The JSON schema of the config dataclass ``cls`` with each setting's and section's description."""
    return config_validator(cls).json_schema()


_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}  # pydantic's range errors, in the words of the other checks
_EXPECTED = {"bool": "bool", "int": "int", "float": "float", "string": "str", "list": "a list", "tuple": "a list"}


def _field_path(loc: tuple[Any, ...], where: str) -> str:
    parts = [where] if where else []
    for key in loc:
        parts.append(f"[{key}]" if isinstance(key, int) else config_key(str(key)))
    return ".".join(parts).replace(".[", "[")


def _sections_in(tp: Any) -> list[type]:
    """The config dataclasses a field's type names: itself, or inside ``X | None`` / ``list[X]``."""
    return [t for t in (tp, *typing.get_args(tp)) if _is_dataclass_type(t)]


def _declared_at(cls: type, loc: tuple[Any, ...]) -> Any:
    """The declared type of the setting at ``loc`` (a pydantic error's location), following the sections from
    ``cls``; ``None`` off them."""
    tp: Any = cls
    for key in loc:
        if isinstance(key, int):  # an item of a list setting: the item's section
            continue
        sections = _sections_in(tp)
        if not sections:
            return None
        tp = _field_types(sections[0]).get(str(key))
    return tp


def _message(error: Mapping[str, Any], cls: type, where: str) -> str:
    """One pydantic error as a config message naming the dotted setting."""
    loc = tuple(error["loc"])
    kind = error["type"]
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        sections = _sections_in(_declared_at(cls, loc[:-1]))
        valid = sorted(_field_types(sections[0])) if sections else []
        return f"unknown config key {_field_path(loc, where)!r}; valid keys here: {valid}"
    path = _field_path(loc, where) or where or cls.__name__
    given = _plain(error.get("input"))
    if kind == "missing":
        return f"{path}: a required setting is missing"
    if kind in ("value_error", "assertion_error"):
        cause = error.get("ctx", {}).get("error")
        return f"{path}: {cause if cause is not None else error['msg']}"
    if kind == "literal_error":
        tp = _declared_at(cls, loc)
        literal = next((t for t in (tp, *typing.get_args(tp)) if typing.get_origin(t) is typing.Literal), tp)
        choices = typing.get_args(literal)
        return f"{path}: must be one of {list(choices)}, got {given!r}"
    bound = next((b for b in _BOUNDS if b in error.get("ctx", {})), None)
    if bound is not None:
        limit = error["ctx"][bound]
        limit = format(limit, "g") if isinstance(limit, float) else limit
        return f"{path} must be {_BOUNDS[bound]} {limit}, got {given!r}"
    if kind == "finite_number":
        return f"{path} must be a finite number, got {given!r}"
    if kind in ("dataclass_type", "dataclass_exact_type", "model_type", "dict_type"):
        return f"{path}: expected a mapping of settings, got {given!r}"
    stem = kind.split("_")[0]
    if stem in _EXPECTED:
        return f"{path}: expected {_EXPECTED[stem]}, got {given!r}"
    return f"{path}: {error['msg']}, got {given!r}"


def build(cls: type[T], data: Mapping[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from a (nested) mapping, validated by pydantic; missing keys keep their defaults.

    Types are pydantic's (lax mode: ``8`` for a float, ``"off"`` for a bool); a number given to a text setting is
    taken as written; the dataclasses' own checks (``__post_init__``) run as part of it. Every problem is a
    :class:`ConfigError` naming the dotted setting.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping of settings, got {data!r}")
    try:
        config = config_validator(cls).validate_python(data)
    except ValidationError as err:
        raise ConfigError("; ".join(_message(e, cls, where) for e in err.errors(include_url=False))) from err
    except TypeError as err:
        raise ConfigError(f"{where or cls.__name__}: {err}") from err
    return _plain_fields(config)


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain nested dicts (for YAML, hashing and MLflow params), keys as they are written."""

    def keys_as_written(value: Any) -> Any:
        if isinstance(value, dict):
            return {config_key(k): keys_as_written(v) for k, v in value.items()}
        return value

    return keys_as_written(dataclasses.asdict(config))


def _override_value(raw: str, override: str) -> Any:
    """The value of ``--set key=value`` read as YAML (empty: the empty string); bad YAML names the override."""
    if not raw.strip():
        return ""
    try:
        return read_yaml(raw)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"override {override!r}: the value is not valid YAML ({problem}); quote it") from err


def _apply_override(data: dict[str, Any], cls: type, override: str, source: Any = None) -> None:
    """Put one ``section.key=value`` override into ``data`` (the settings read from ``source``, a config file)."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like section.key=value")
    dotted, raw = override.split("=", 1)
    keys = dotted.strip().split(".")
    node, node_cls = data, cls
    for i, key in enumerate(keys):
        if node_cls is None:  # inside a free-form mapping setting (env.args, env.options): any key
            if i == len(keys) - 1:
                node[key] = _override_value(raw, override)
            else:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"{'.'.join(keys[: i + 1])} is not a mapping in override {override!r}")
            continue
        types_ = _field_types(node_cls)
        if key not in types_:
            path = ".".join(keys[: i + 1])
            raise ConfigError(f"unknown config key {path!r} in override {override!r}; valid: {sorted(types_)}")
        if i == len(keys) - 1:
            node[key] = _override_value(raw, override)
        else:
            field_type = types_[key]
            if typing.get_origin(field_type) is dict or field_type is dict:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"{'.'.join(keys[: i + 1])} is not a mapping in override {override!r}")
                node_cls = None
                continue
            if not _is_dataclass_type(field_type):
                raise ConfigError(f"{'.'.join(keys[: i + 1])} is not a section in override {override!r}")
            node = node.setdefault(key, {})
            if not isinstance(node, dict):  # e.g. a config file's `data:` written as a list
                raise ConfigError(
                    f"{source or 'config'}: {'.'.join(keys[: i + 1])}: expected a mapping of settings, got "
                    f"{node!r:.80}; cannot apply --set {override}"
                )
            node_cls = field_type


def _merged(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``top``'s settings put over it, section by section (a nested mapping merges, a value replaces)."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(dict(out[key]), value)
        else:
            out[key] = value
    return out


def settings_mapping(settings: Any) -> dict[str, Any]:
    """A flow's ``settings`` parameter as a nested mapping: a config dataclass whole, a mapping (what the Prefect
    run form sends: the settings it shows) as given, ``None`` as no settings."""
    if settings is None:
        return {}
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        return to_dict(settings)
    if isinstance(settings, Mapping):
        return dict(settings)
    raise ConfigError(f"settings: expected a config or a mapping of settings, got {type(settings).__name__}")


def load_config(cls: type[T], path: str | Path | None = None, overrides: Iterable[str] = (), settings: Any = None) -> T:
    """Defaults of ``cls``, then the YAML file at ``path`` (if any), then ``settings`` (a nested mapping, or a whole
    config: see :func:`settings_mapping`), then ``overrides`` (``a.b=value``)."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        try:
            loaded = read_yaml(path.read_text())
        except FileNotFoundError as err:
            raise ConfigError(f"{path}: config file not found") from err
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML ({err})") from err
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from err
        if loaded is None:
            raise ConfigError(
                f"{path}: the config file is empty (no settings); give its settings, or leave out --config for the "
                "flow's defaults"
            )
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping, got {type(loaded).__name__}")
        data = loaded
    data = _merged(data, settings_mapping(settings))
    overrides = list(overrides)
    for override in overrides:
        _apply_override(data, cls, override, path)
    try:
        return build(cls, data)
    except ConfigError as err:
        source = _override_named(str(err), overrides) or path
        raise ConfigError(f"{source}: {err}" if source is not None else str(err)) from err


def _override_named(message: str, overrides: list[str]) -> str | None:
    """``--set key=value`` when ``message`` (a config error) is about a setting one of ``overrides`` gave: the error
    names where the bad value came from, not the config file it replaced (the last such override wins, as it does
    when applied)."""
    named = None
    for override in overrides:
        key = override.partition("=")[0].strip()
        if key and re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", message):
            named = f"--set {override}"
    return named
