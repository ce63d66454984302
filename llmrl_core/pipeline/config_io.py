"""Load nested config dataclasses from YAML files and ``section.field=value`` overrides, with clear errors.

Every field of a config dataclass can be set in YAML (nested mappings for nested dataclasses) or on the
command line as ``--set trainer.lr=1e-6``; values are parsed as YAML scalars (``1e-6``, ``true``,
``[1, 2]``) and checked against the field's type. An unknown key names the full dotted path and the
valid keys, so a typo never passes silently.

The YAML reading is strict where YAML 1.1 would change what was written: a key given twice is an error naming
both lines (not "the last one wins"); only ``true``/``false`` are booleans (``no``, ``off``, ``yes``, ``on`` stay
words, so ``kl_in: no`` or ``run_id: no`` mean what they say; a boolean setting still accepts them); a number
given to a text setting keeps its digits as written (``run_id: 007`` is ``"007"``, not ``"7"``); an empty file
is an error, not the defaults.
"""

from __future__ import annotations

import dataclasses
import json
import keyword
import re
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")
_YAML_BOOL_WORDS = {False: ("no", "off", "false"), True: ("yes", "on", "true")}
_BOOL_WORDS = {word: flag for flag, words in _YAML_BOOL_WORDS.items() for word in words}


class ConfigError(ValueError):
    """A config file or override is malformed; the message names the file and the dotted key."""


def _config_key(name: str) -> str:
    """The key a field is written as: a Python keyword's field (``from_``) without its trailing underscore."""
    return name[:-1] if name.endswith("_") and keyword.iskeyword(name[:-1]) else name


def _field_types(cls: type) -> dict[str, Any]:
    """Each field's type, by the key it is written as."""
    hints = typing.get_type_hints(cls)
    return {_config_key(f.name): hints[f.name] for f in dataclasses.fields(cls)}


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


class _SourcedInt(int):
    """An int read from YAML, with the text it was written as (a text setting keeps that)."""

    source: str


class _SourcedFloat(float):
    """A float read from YAML, with the text it was written as."""

    source: str


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
    """Free-form values (``env.args``, lists of Any) without the YAML source wrappers."""
    if isinstance(value, _SourcedInt):
        return int(value)
    if isinstance(value, _SourcedFloat):
        return float(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    return value


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _coerce(value, option, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{where}: cannot be {value!r}")
    if _is_dataclass_type(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return build(tp, value, where)
    if tp is Any:
        return _plain(value)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        item_type = args[0] if args else Any
        items = [_coerce(v, item_type, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return _plain(dict(value))
    if origin is typing.Literal:
        if isinstance(value, bool):  # YAML 1.1 reads a bare no/off/yes/on as a bool: map it back to the choice
            value = next((c for c in typing.get_args(tp) if c in _YAML_BOOL_WORDS[value]), value)
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}: must be one of {list(typing.get_args(tp))}, got {value!r}")
        return value
    if tp is bool and isinstance(value, str) and value.lower() in _BOOL_WORDS:  # yes/no/on/off are words in YAML
        return _BOOL_WORDS[value.lower()]
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # YAML 1.1 reads "1e-6" (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if tp is bool and isinstance(value, bool):
        return value
    if tp is str and isinstance(value, _SourcedInt | _SourcedFloat):
        return value.source  # as written: run_id: 007 stays "007"
    if tp is str and isinstance(value, str | int | float) and not isinstance(value, bool):
        return str(value)
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r}")


def build(cls: type[T], data: Mapping[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from a (nested) mapping; missing keys keep their defaults."""
    types_ = _field_types(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        key = f"{where}.{unknown[0]}" if where else unknown[0]
        raise ConfigError(f"unknown config key {key!r}; valid keys here: {sorted(types_)}")
    names = {_config_key(f.name): f.name for f in dataclasses.fields(cls)}
    kwargs = {
        names[key]: _coerce(value, types_[key], f"{where}.{key}" if where else key) for key, value in data.items()
    }
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where or cls.__name__}: {err}") from err


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain nested dicts (for YAML, hashing and MLflow params), keys as they are written."""

    def keys_as_written(value: Any) -> Any:
        if isinstance(value, dict):
            return {_config_key(k): keys_as_written(v) for k, v in value.items()}
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


def _apply_override(data: dict[str, Any], cls: type, override: str) -> None:
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
            node_cls = field_type


def settings_overrides(settings: Mapping[str, Any]) -> list[str]:
    """``section.key=value`` override strings for the settings that are given (not ``None``).

    Flows take their main settings as typed parameters (a form in the Prefect UI) and pass them on with this;
    strings are quoted, so a run id such as ``no`` or ``007`` stays a string.
    """
    return [
        f"{key}={json.dumps(value) if isinstance(value, str) else value}"
        for key, value in settings.items()
        if value is not None
    ]


def load_config(cls: type[T], path: str | Path | None = None, overrides: Iterable[str] = ()) -> T:
    """Defaults of ``cls``, then the YAML file at ``path`` (if any), then ``overrides`` (``a.b=value``)."""
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
    for override in overrides:
        _apply_override(data, cls, override)
    try:
        return build(cls, data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}" if path is not None else str(err)) from err
