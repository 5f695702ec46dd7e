"""Reading a YAML file a user wrote, strictly: one line for every way it can
be wrong, and bounded work whatever it holds.

- a path that is missing, a directory or unreadable; a file over the size
  limit; bytes that are not UTF-8;
- YAML that does not parse (a tab where YAML wants spaces is called a tab),
  or nests deeper than any real file would;
- a key given twice in one mapping (YAML itself keeps the last one silently;
  here it is an error: which of the two did the author mean?);
- a number too large to read.
Anchors and aliases (and ``<<`` merges) are allowed: they share objects,
they do not copy them, so even an "alias bomb" costs only its own size.
"""
from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from .errors import InputError, shown_value

MAX_BYTES = 1024 * 1024
MAX_DEPTH = 50

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_Base):  # type: ignore[misc, valid-type]
    """SafeLoader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"a mapping key must be a plain value, not {type(key).__name__}",
                        key_node.start_mark) from None
                if first is not None:
                    raise _Duplicate(key, first.line + 1, key_node.start_mark.line + 1)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


class _Duplicate(Exception):
    def __init__(self, key: Any, first: int, again: int):
        super().__init__(key)
        self.key, self.first, self.again = key, first, again


def _depth(node: Any, limit: int) -> int:
    """The nesting depth of a composed YAML node graph (aliases are the same
    node object: each is walked once)."""
    deepest, seen, todo = 0, set(), [(node, 1)]
    while todo:
        n, d = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(n, yaml.SequenceNode):
            todo.extend((c, d + 1) for c in n.value)
        elif isinstance(n, yaml.MappingNode):
            todo.extend((c, d + 1) for pair in n.value for c in pair)
    return deepest


def _tab_at(text: str, line: int, column: int) -> bool:
    """Whether YAML's error points at a tab (PyYAML's C scanner says only
    "found character that cannot start any token")."""
    lines = text.split("\n")
    return 0 <= line < len(lines) and 0 <= column < len(lines[line]) and lines[line][column] == "\t"


def load(path: str | Path, what: str = "YAML file") -> Any:
    """The YAML document in ``path``, or an InputError naming the path and
    what is wrong with it."""
    p = Path(path)
    try:
        if p.is_dir():
            raise InputError(f"{p}: is a directory; the {what} must be a file")
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):
            # /dev/zero, a FIFO: reading one would never end.
            raise InputError(f"{p}: is not a regular file; the {what} must be one")
        size = st.st_size
        if size > MAX_BYTES:
            raise InputError(f"{p}: is {size} bytes; the {what} may be at most {MAX_BYTES // 1024} KiB")
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{p}: {what} not found") from None
    except OSError as e:
        raise InputError(f"{p}: cannot read {what} ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise InputError(f"{p}: line {line}: byte 0x{data[e.start]:02x} is not UTF-8; the {what} must be "
                         f"UTF-8 text") from None
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and _depth(node, MAX_DEPTH) > MAX_DEPTH:
            raise InputError(f"{p}: nests deeper than {MAX_DEPTH} levels; the {what} is a few levels of mappings")
        return loader.construct_document(node) if node is not None else None
    except _Duplicate as d:
        raise InputError(f"{p}: line {d.again}: key {shown_value(d.key)} is given twice in one mapping (first on "
                         f"line {d.first}); YAML would silently keep only the last, so say it once") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        if mark and _tab_at(text, mark.line, mark.column):
            raise InputError(f"{p}: a tab at line {mark.line + 1} column {mark.column + 1}: YAML indents with "
                             f"spaces, never tabs") from None
        where = f" line {mark.line + 1}:" if mark else ""
        why = " ".join(str(getattr(e, "problem", None) or e).split())
        raise InputError(f"{p}:{where} is not valid YAML ({why})") from None
    except (ValueError, RecursionError, MemoryError) as e:
        # int("1" * 5000) and its kind: a number no inventory needs.
        raise InputError(f"{p}: cannot be read ({type(e).__name__}: {shown_value(str(e))})") from None
    finally:
        loader.dispose()
