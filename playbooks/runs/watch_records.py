"""What the watch in a GKE head pod records, brought back to this machine.

The watch there (``runs/cluster_watch.py``) writes the run's timeline in
its own folder on the head, which this machine cannot read. So each event
it writes is also a line of its Ray job's log (``timeline.append``: the
mark, then ``{"run": RUN, "event": {...}}``), and this machine takes them
back from that log:

- while `invoke train` or `logs --follow` views the job: the watch's log
  followed beside the job's (``follow``);
- after, for a job nobody viewed (`train --detach`): `invoke watch --run R
  --job J` on the ended job reads its watch's whole log (``import_text``,
  plays/watch.py).

An event comes in once (the timeline's own key: a log read again adds
nothing). A host the watch set aside comes into this machine's record
(`invoke hosts`) when its ``quarantined`` event first comes in (replacing
an older record of it here: the watch sets aside only a host it does not
hold, such as one whose pool was made again): a host released here is not
set aside again by a later read of the same log.
A line that is not a well-formed event of a valid run is skipped."""
from __future__ import annotations

import json
from typing import Any

from playbooks.config.maxtext_settings import run_name_problem
from playbooks.runs import events as E
from playbooks.runs import quarantine_record as R
from playbooks.runs import timeline
from playbooks.runs.timeline import MARK


class Importer:
    """The watch's log lines in, its events into this machine's timelines
    (of ``runs``: None, any run; each line's run checked)."""

    def __init__(self, env: Any, runs: tuple[str, ...] | None = None):
        self.env, self.runs = env, runs
        self.keys: dict[str, set] = {}
        self.added = 0

    def line(self, line: str) -> None:
        got = parse(line)
        if got is None:
            return
        run, e = got
        if self.runs is not None and run not in self.runs:
            return
        if run not in self.keys:
            self.keys[run] = {timeline.key(x) for x in timeline.read(self.env, run)}
        k = timeline.key(e)
        if k in self.keys[run]:
            return
        self.keys[run].add(k)
        timeline.append(self.env, run, [e])
        self.added += 1
        if e.get("kind") == E.QUARANTINED and e.get("host"):
            self.set_aside(e)

    def set_aside(self, e: dict) -> None:
        """The host into this machine's record, as the watch recorded it;
        a record of it here older than the event is replaced (the watch set
        aside only a host no longer held: its pool made again, new nodes)."""
        host = str(e["host"])
        hosts = R.read(self.env)
        had = hosts.get(host)
        if had is not None and (R.since(had) or 0.0) >= float(e["t"]):
            return
        hosts[host] = R.entry(str(e.get("slice") or host), str(e.get("why") or "?"),
                              f"{e.get('by') or '?'} (the watch in the cluster)",
                              [str(n) for n in e.get("nodes") or []], since=float(e["t"]))
        R.write(self.env, hosts)


def parse(line: str) -> tuple[str, dict] | None:
    """(run, event) of one of the watch's lines; None for any other line."""
    at = line.find(MARK)
    if at < 0:
        return None
    try:
        doc = json.loads(line[at + len(MARK):])
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("run"), str) or run_name_problem(doc["run"]):
        return None
    e = timeline.event_of(json.dumps(doc.get("event")))
    return None if e is None else (doc["run"], e)


def import_text(env: Any, text: str, runs: tuple[str, ...] | None = None) -> int:
    """A watch's whole log: how many events came in."""
    imp = Importer(env, runs)
    for line in text.splitlines():
        imp.line(line)
    return imp.added
