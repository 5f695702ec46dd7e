"""Fixture mode, for tests: probes answered from declared facts. A probe
the fixture did not declare is an error, never a default."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import PlaybookError
from .facts import Completed, Fact


class UndeclaredFact(PlaybookError):
    pass


class Answers:
    """Fixture answers given in turn (the last one repeats): the state before
    a change, then after it."""

    def __init__(self, *values: Any):
        self.values = list(values)
        self.i = 0

    def next(self) -> Any:
        v = self.values[min(self.i, len(self.values) - 1)]
        self.i += 1
        return v


@dataclass
class Value:
    """An in-process fact's answer (no command ran)."""
    value: Any


def answer(declared: dict[str, Any], fact: Fact, step: str) -> Completed | Value:
    """The declared answer to ``fact``: a Completed command, or a Value."""
    if fact.key not in declared:
        raise UndeclaredFact(f"step {step!r}: probe not declared by the fixture: {fact.key}")
    value = declared[fact.key]
    if isinstance(value, Answers):
        value = value.next()
    if isinstance(value, Exception):
        raise value
    if isinstance(value, Completed):
        return value
    if fact.python is not None:
        return Value(value)
    if isinstance(value, str):
        return Completed(fact.line(), 0, value, "")
    return Completed(fact.line(), 0, json.dumps(value), "")
