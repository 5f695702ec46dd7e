"""What the watch gives notice of, and when: each host (a GKE slice's node
pool; a simulated host on the twin) whose scheduled host maintenance, or
whose flex-start end, comes within the environment's ``maintenance_lead``
seconds. The watch (``follow.Watch.maintenance``) gives each one notice once
(a time moved later is a new one), through the target's own way
(``restart.Quarantine.notice``): the job saves, and shrinks at that save,
before the window. Pure: the times come from a look (GKE's node labels,
``cloud/slice_ends.py``; the twin's record, ``twin/maintenance_sim.py``)."""
from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from playbooks.runs import events as E


@dataclass(frozen=True)
class Coming:
    """A host's end to come: when, and what it is, in words."""

    host: str
    at: float
    why: str


def due(coming: Mapping[str, tuple[float, str]], now: float, lead: float,
        noticed: Collection[tuple[str, float]]) -> list[Coming]:
    """The hosts to give notice now: their end within ``lead`` seconds (or
    past), not noticed yet for that time, in time order."""
    out = [Coming(h, at, why) for h, (at, why) in coming.items() if at - now <= lead and (h, at) not in noticed]
    return sorted(out, key=lambda c: (c.at, c.host))


def noticed_in(events: Iterable[Any]) -> set[tuple[str, float]]:
    """The notices a run's timeline says were given (a watch started again
    gives none twice)."""
    out = set()
    for e in events:
        at = E.number(e.get("at"))
        if e.get("kind") == E.NOTICE_GIVEN and e.get("by") == BY and isinstance(e.get("host"), str) and at is not None:
            out.add((e["host"], at))
    return out


def saved_after(events: Iterable[Any], t: float) -> int | None:
    """The step of the first save finalized after ``t`` (the notice's), or None."""
    for e in events:
        if e.get("kind") == E.CHECKPOINT_FINALIZED and e.get("finalized") is True and (E.number(e.get("t")) or 0) > t:
            return E.step_of(e)
    return None


def over(aside: Collection[str], coming: Mapping[str, tuple[float, str]]) -> list[str]:
    """The hosts set aside for their maintenance whose end is no longer
    announced (GKE removes the label when the maintenance is done): to be
    given back."""
    return sorted(h for h in aside if h not in coming)


# The watch's events and lines name it so.
BY = "maintenance"
