"""Inventory: environments and their variables, validated against a schema.

The schema (keys, types, defaults, rules) is given by the caller; this module
knows nothing of any cloud. Every error is one line naming the file, the
environment, the key, the value (cut at 80 characters) and the rule. The
whole file is checked when it is loaded: every environment, and what they
would share (the schema's ``across`` rule), before any command runs.
"""
from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import yamlfile
from .errors import InputError, shown_value

Rule = Callable[[Any, Mapping[str, Any]], "str | Entry | None"]

# An environment's name becomes a folder (.state/<name>/), a label and part
# of file names: a safe set of characters, no "..", a bounded length.
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
NAME_RULE = ("must be 1-63 characters: lowercase letters, digits, '.', '_', '-', starting with a letter or "
             "digit, without '..'")
MAX_ENVIRONMENTS = 100
MAX_TEXT = 1024  # characters of any string value: names, ranges, images are all far shorter


def name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be an environment's name, or None."""
    if not isinstance(name, str) or not NAME.match(name) or ".." in name:
        return NAME_RULE
    return None


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
    the value is valid, else the rule it breaks, in words (or an Entry).
    Keys are checked in schema order, so a rule may rely on the keys before
    it being valid; a derived key is computed when its turn comes."""

    name: str
    type: type | tuple[type, ...] = str
    required: bool = False
    default: Any = None
    rules: tuple[Rule, ...] = ()
    doc: str = ""
    derive: Callable[[Mapping[str, Any]], Any] | None = None
    # Given where it does nothing, a key is refused: (env) -> why it does not
    # apply there, or None.
    unused: Callable[[Mapping[str, Any]], str | None] | None = None


@dataclass(frozen=True)
class Schema:
    """Keys per kind of environment (the ``kind`` key selects one), and a
    rule over all environments of a file (two that would own one thing)."""

    kinds: Mapping[str, tuple[Key, ...]]
    default_kind: str
    across: Callable[[Mapping[str, Env]], str | None] | None = None
    env_type: type[Env] | None = None

    def keys(self, kind: str) -> dict[str, Key]:
        return {k.name: k for k in self.kinds[kind]}


class Env(Mapping[str, Any]):
    """A validated environment: read-only, its keys also attributes. A
    project subclasses it with an annotation per key (``Schema.env_type``),
    so a type checker refuses a misspelt attribute; at run time one is an
    AttributeError, never a default."""

    name: str
    _values: dict[str, Any]

    def __init__(self, name: str, values: Mapping[str, Any]):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_values", dict(values))
        for k, v in values.items():
            object.__setattr__(self, k, v)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"environment {self.name!r} is read-only (set {key} in the inventory)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self._values!r})"


@dataclass
class Inventory:
    path: Path
    default: str
    raw: Mapping[str, Mapping[str, Any]]
    schema: Schema = field(repr=False)
    envs: dict[str, Env] = field(default_factory=dict, repr=False)

    @property
    def names(self) -> list[str]:
        return list(self.raw)

    def env(self, name: str | None = None) -> Env:
        name = self.default if name is None else name
        if not isinstance(name, str) or name not in self.raw:
            why = name_problem(name)
            if why:
                raise InputError(f"environment name {shown_value(name)} {why}")
            close = difflib.get_close_matches(name, list(self.raw), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise InputError(f"{self.path}: environment {name!r} is not defined (defined: "
                             f"{', '.join(self.raw) or 'none'}){hint}")
        if name not in self.envs:
            self.envs[name] = resolve(self.path, name, self.raw[name], self.schema)
        return self.envs[name]


def _type_name(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(_type_name(x) for x in t)
    return {"str": "a string", "int": "an integer", "bool": "true or false", "dict": "a mapping",
            "list": "a list"}.get(t.__name__, t.__name__)


def did_you_mean(word: Any, options: Sequence[str]) -> str:
    """"; did you mean X?" for a value of a closed set that is another's
    spelling or case (``Spot`` for ``spot``, ``on_demand``), else ""."""
    text = str(word)
    same = [o for o in options if o.lower() == text.lower()]
    if not same:
        lower = {o.lower(): o for o in options}
        same = [lower[c] for c in difflib.get_close_matches(text.lower(), list(lower), n=1, cutoff=0.6)]
    return f"; did you mean {same[0]}?" if same else ""


def unknown_key_hint(key: Any, allowed: list[str]) -> str:
    """"did you mean X?" for a near miss, else the allowed keys."""
    close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]}?"
    return f"allowed: {', '.join(sorted(allowed))}"


def _typed(where: str, key: Key, value: Any) -> Any:
    """The value if it has the key's type (a number given for a string key
    is taken as its text), else an error."""
    if key.type is int and isinstance(value, bool):
        raise InputError(f"{where}: key {key.name!r} = {shown_value(value)} must be {_type_name(key.type)}")
    if key.type is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, key.type):
        raise InputError(f"{where}: key {key.name!r} = {shown_value(value)} must be {_type_name(key.type)}")
    if isinstance(value, str) and len(value) > MAX_TEXT:
        raise InputError(f"{where}: key {key.name!r} = {shown_value(value)} is {len(value)} characters "
                         f"(at most {MAX_TEXT})")
    return value


def _own(value: Any) -> Any:
    """A copy of a mutable value (a mapping, a list, a set), the value itself
    otherwise."""
    return copy.deepcopy(value) if isinstance(value, (dict, list, set)) else value


def resolve(path: Path, name: str, raw: Mapping[str, Any], schema: Schema) -> Env:
    where = f"{path}: environment {name!r}"
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: must be a mapping of keys to values, got {type(raw).__name__}")
    kind = raw.get("kind", schema.default_kind)
    if not isinstance(kind, str) or kind not in schema.kinds:
        hint = did_you_mean(kind, list(schema.kinds)) if isinstance(kind, str) else ""
        raise InputError(f"{where}: key 'kind' = {shown_value(kind)} is not allowed (allowed: "
                         f"{', '.join(schema.kinds)}){hint}")
    keys = schema.keys(kind)
    for k in raw:
        if k not in keys:
            raise InputError(f"{where}: unknown key {shown_value(k)} for kind {kind!r}; "
                             f"{unknown_key_hint(k, list(keys))}")
    env: dict[str, Any] = {}
    # Values as given (type-checked) or their defaults; derived keys wait.
    # A mutable value is this environment's own copy: a default ({} of
    # train_overrides) is one object of the schema, and a YAML anchor hands
    # one object to every environment that names it.
    for key in keys.values():
        if key.name in raw and raw[key.name] is not None:
            env[key.name] = _own(_typed(where, key, raw[key.name]))
        elif key.required:
            raise InputError(f"{where}: missing key {key.name!r} ({key.doc or 'required'})")
        elif key.derive is None:
            env[key.name] = _own(key.default)
    env["kind"] = kind
    # Rules in schema order; a derived key is computed when its turn comes,
    # from keys already proven valid.
    for key in keys.values():
        if key.name not in env:
            env[key.name] = key.derive(env)  # type: ignore[misc]
        for rule in key.rules:
            why = rule(env[key.name], env)
            if isinstance(why, Entry):
                raise InputError(f"{where}: key '{key.name}.{why.key}' = {shown_value(why.value)} {why.why}")
            if why:
                raise InputError(f"{where}: key {key.name!r} = {shown_value(env[key.name])} {why}")
    for key in keys.values():
        why = key.unused(env) if key.unused and raw.get(key.name) is not None else None
        if why:
            raise InputError(f"{where}: key {key.name!r} = {shown_value(raw[key.name])} is not used: {why}")
    return (schema.env_type or Env)(name, env)


def load(path: str | Path, schema: Schema) -> Inventory:
    path = Path(path)
    data = yamlfile.load(path, "inventory file")
    if not isinstance(data, Mapping):
        raise InputError(f"{path}: must be a mapping with 'environments:' and 'default:'")
    for k in data:
        # x-... keys hold YAML anchors shared by environments (as in Compose files).
        if k not in ("environments", "default") and not (isinstance(k, str) and k.startswith("x-")):
            raise InputError(f"{path}: unknown top-level key {shown_value(k)}; "
                             f"{unknown_key_hint(k, ['default', 'environments'])} (keys starting with x- may "
                             f"hold YAML anchors)")
    envs = data.get("environments")
    if not isinstance(envs, Mapping) or not envs:
        raise InputError(f"{path}: key 'environments' must map environment names to their variables")
    if len(envs) > MAX_ENVIRONMENTS:
        raise InputError(f"{path}: defines {len(envs)} environments; an inventory holds at most "
                         f"{MAX_ENVIRONMENTS}")
    for n in envs:
        why = name_problem(n)
        if why:
            raise InputError(f"{path}: environment name {shown_value(n)} {why}")
    default = data.get("default")
    if default is None:
        raise InputError(f"{path}: missing key 'default' (the environment used when none is given)")
    if not isinstance(default, str) or default not in envs:
        raise InputError(f"{path}: key 'default' = {shown_value(default)} is not an environment (defined: "
                         f"{', '.join(envs)})")
    inv = Inventory(path, default, envs, schema)
    # Every environment, now: a mistake in one that is not used today is
    # still a mistake, and what two of them share can only be seen whole.
    resolved = {n: inv.env(n) for n in envs}
    if schema.across:
        why = schema.across(resolved)
        if why:
            raise InputError(f"{path}: {why}")
    return inv
