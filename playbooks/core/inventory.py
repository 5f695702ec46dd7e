"""Inventory: environments and their variables, validated against a schema.

The schema (keys, types, defaults, rules) is given by the caller; this module
knows nothing of any cloud. Every error is one line naming the file, the
environment, the key, the value and the rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from .errors import InputError

Rule = Callable[[Any, Mapping[str, Any]], "str | Entry | None"]


@dataclass(frozen=True)
class Entry:
    """What a rule on a mapping returns to name the one entry at fault:
    the error then reads `key 'name.entry' = value why`."""

    key: str
    value: Any
    why: str


@dataclass(frozen=True)
class Key:
    """One inventory key: its type, whether it is required, its default and
    its rules. A rule gets (value, whole environment) and returns None when
    the value is valid, else the rule it breaks, in words (or an Entry)."""

    name: str
    type: type | tuple[type, ...] = str
    required: bool = False
    default: Any = None
    rules: tuple[Rule, ...] = ()
    doc: str = ""
    derive: Callable[[Mapping[str, Any]], Any] | None = None


@dataclass(frozen=True)
class Schema:
    """Keys per kind of environment (the ``kind`` key selects one)."""

    kinds: Mapping[str, tuple[Key, ...]]
    default_kind: str

    def keys(self, kind: str) -> dict[str, Key]:
        return {k.name: k for k in self.kinds[kind]}


class Env(dict):
    """A validated environment: a dict with attribute access."""

    name: str = ""

    def __getattr__(self, item: str) -> Any:
        try:
            return self[item]
        except KeyError:
            raise AttributeError(item) from None


@dataclass
class Inventory:
    path: Path
    default: str
    raw: Mapping[str, Mapping[str, Any]]
    schema: Schema = field(repr=False)

    @property
    def names(self) -> list[str]:
        return list(self.raw)

    def env(self, name: str | None = None) -> Env:
        name = name or self.default
        if name not in self.raw:
            raise InputError(
                f"{self.path}: environment {name!r} is not defined (defined: {', '.join(self.raw) or 'none'})"
            )
        return resolve(self.path, name, self.raw[name], self.schema)


def _type_name(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(x.__name__ for x in t)
    return {"str": "a string", "int": "an integer", "bool": "true or false", "dict": "a mapping",
            "list": "a list"}.get(t.__name__, t.__name__)


def resolve(path: Path, name: str, raw: Mapping[str, Any], schema: Schema) -> Env:
    where = f"{path}: environment {name!r}"
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: must be a mapping of keys to values, got {type(raw).__name__}")
    kind = raw.get("kind", schema.default_kind)
    if kind not in schema.kinds:
        raise InputError(f"{where}: key 'kind' = {kind!r} is not allowed (allowed: {', '.join(schema.kinds)})")
    keys = schema.keys(kind)
    for k in raw:
        if k not in keys:
            raise InputError(
                f"{where}: unknown key {k!r} for kind {kind!r} (allowed: {', '.join(sorted(keys))})"
            )
    env = Env()
    env.name = name
    for key in keys.values():
        if key.name in raw and raw[key.name] is not None:
            value = raw[key.name]
            ok_type = key.type
            if key.type is int and isinstance(value, bool):
                raise InputError(f"{where}: key {key.name!r} = {value!r} must be {_type_name(key.type)}")
            if key.type is str and isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, ok_type):
                raise InputError(f"{where}: key {key.name!r} = {value!r} must be {_type_name(key.type)}")
            env[key.name] = value
        elif key.required:
            raise InputError(f"{where}: missing key {key.name!r} ({key.doc or 'required'})")
        elif key.derive is None:
            env[key.name] = key.default
    env["kind"] = kind
    for key in keys.values():
        if key.derive is not None and key.name not in env:
            env[key.name] = key.derive(env)
    for key in keys.values():
        for rule in key.rules:
            why = rule(env[key.name], env)
            if isinstance(why, Entry):
                raise InputError(f"{where}: key '{key.name}.{why.key}' = {why.value!r} {why.why}")
            if why:
                raise InputError(f"{where}: key {key.name!r} = {env[key.name]!r} {why}")
    return env


def load(path: str | Path, schema: Schema) -> Inventory:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: inventory file not found") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise InputError(f"{path}:{where} is not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, Mapping):
        raise InputError(f"{path}: must be a mapping with 'environments:' and 'default:'")
    unknown = set(data) - {"environments", "default"}
    if unknown:
        raise InputError(f"{path}: unknown top-level key {sorted(unknown)[0]!r} (allowed: default, environments)")
    envs = data.get("environments")
    if not isinstance(envs, Mapping) or not envs:
        raise InputError(f"{path}: key 'environments' must map environment names to their variables")
    for n in envs:
        if not isinstance(n, str) or not n:
            raise InputError(f"{path}: environment name {n!r} must be a non-empty string")
    default = data.get("default")
    if default is None:
        raise InputError(f"{path}: missing key 'default' (the environment used when none is given)")
    if default not in envs:
        raise InputError(f"{path}: key 'default' = {default!r} is not an environment (defined: {', '.join(envs)})")
    return Inventory(path, default, envs, schema)
