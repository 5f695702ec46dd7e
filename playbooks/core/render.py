"""Rendering ``${VAR}`` templates with envsubst, never silently.

envsubst turns an unset variable into an empty string. So: the template's
variables must be exactly the ones given, each non-empty; envsubst is told
which variables to touch (its SHELL-FORMAT argument); and the rendered text
is checked for any ``${...}`` left before it reaches its reader.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from .command import Command
from .errors import InputError

VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
LEFT = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*")


def variables(text: str) -> list[str]:
    """The ``${VAR}`` names used outside comments, in first-use order."""
    seen: list[str] = []
    for line in text.splitlines():
        body = line.split("#", 1)[0] if line.lstrip().startswith("#") else line
        for name in VAR.findall(body):
            if name not in seen:
                seen.append(name)
    return seen


def check_values(path: str, text: str, values: Mapping[str, str]) -> list[str]:
    """Refuse a variable the template uses but is not given, or given empty,
    and a given one the template does not use."""
    used = variables(text)
    for name in used:
        if name not in values:
            raise InputError(f"{path}: variable ${{{name}}} has no value (given: {', '.join(sorted(values))})")
        if values[name] is None or str(values[name]).strip() == "":
            raise InputError(f"{path}: variable ${{{name}}} is empty")
        if "$" in str(values[name]):
            raise InputError(f"{path}: variable ${{{name}}} = {values[name]!r} holds '$'")
    unused = sorted(set(values) - set(used))
    if unused:
        raise InputError(f"{path}: the template does not use {', '.join(unused)}")
    return used


def leftover(text: str) -> str | None:
    """A complaint when rendered text still holds a ``${...}`` (outside comments)."""
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        m = VAR.search(line)
        if m:
            return f"rendered manifest still holds {m.group(0)} on line {n}: refusing to apply it"
    return None


def envsubst(path: str, values: Mapping[str, str], root: Path | None = None) -> Command:
    """``VAR=value ... envsubst '${VAR} ...' < path``, the variables checked."""
    text = ((root / path) if root else Path(path)).read_text()
    used = check_values(path, text, values)
    shell_format = " ".join(f"${{{n}}}" for n in used)
    return Command(("envsubst", shell_format), env=tuple((n, str(values[n])) for n in used), stdin_file=path)


def render(text: str, values: Mapping[str, str]) -> str:
    """The same substitution in Python (for checks and tests, not for apply)."""
    out = VAR.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), text)
    why = leftover(out)
    if why:
        raise InputError(why)
    return out
