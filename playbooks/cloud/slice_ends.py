"""What is coming for each TPU slice on GKE, read from its nodes: their
scheduled host maintenance, and a flex-start slice's end. `invoke status`
says both, per node pool (one pool is one slice), in its row
``status:slice-ends`` (``cli/status.py``).

Sources:
- Host maintenance. "When an upcoming maintenance is scheduled by the VM
  but isn't active, GKE adds `scheduled-maintenance-time` to the node
  label" (GKE 1.31.1-gke.2008000 and later, machine types with GPUs or
  TPUs): https://cloud.google.com/kubernetes-engine/docs/how-to/view-maintenance-events.
  Its key is ``cloud.google.com/scheduled-maintenance-time`` and its value
  a Unix epoch time in seconds (the node affinity examples, `DoesNotExist`
  and `Gt 1733296000`, of "Manage AI-optimized GKE clusters",
  https://cloud.google.com/ai-hypercomputer/docs/manage/manage-gke-clusters).
  GPUs and TPUs do not live-migrate: GKE terminates the node and its Pods
  for the maintenance (same page), and a multi-host slice runs only whole,
  so one node's maintenance stops the whole slice.
- Flex-start. Its VMs run at most the node pool's max run duration
  (``config.maxRunDuration`` of the pool, "3600s"), seven days when none is
  set ("If you don't specify a value for the maxRunDurationSeconds
  parameter, the default is seven days", GKE's flex-start page,
  https://cloud.google.com/kubernetes-engine/docs/concepts/dws). The
  project sets none (``config/choices.py`` FLEX_START), so its slices end
  seven days after their nodes came: the earliest node's
  ``metadata.creationTimestamp`` plus that duration.

Pure functions of the nodes' and pools' JSON and a clock: no I/O.
"""
from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass, field
from typing import Any

from playbooks.config.choices import FLEX_START

MAINTENANCE_LABEL = "cloud.google.com/scheduled-maintenance-time"
FLEX_START_NODE_LABEL = "cloud.google.com/gke-flex-start"
FLEX_START_DEFAULT_S = 7 * 24 * 3600


@dataclass
class Node:
    """What a slice's end needs of one node."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    created: str | None = None  # metadata.creationTimestamp, RFC 3339


def nodes_by_pool(doc: Any, pool_label: str) -> dict[str, list[Node]]:
    """pool -> its nodes, from `kubectl get nodes -o json`."""
    out: dict[str, list[Node]] = {}
    for n in (doc or {}).get("items") or []:
        md = n.get("metadata") or {}
        labels = {str(k): str(v) for k, v in (md.get("labels") or {}).items()}
        out.setdefault(labels.get(pool_label, ""), []).append(
            Node(str(md.get("name") or "?"), labels, md.get("creationTimestamp")))
    return out


# -- times in words ----------------------------------------------------------------------
def utc(t: float) -> str:
    """2026-12-10 14:00Z"""
    return time.strftime("%Y-%m-%d %H:%MZ", time.gmtime(t))


def span(s: float) -> str:
    """A duration, coarse: "2 d 3 h", "3 h 5 min", "12 min", "under a minute"."""
    s = abs(s)
    d, rest = divmod(int(s), 86400)
    h, rest = divmod(rest, 3600)
    m = rest // 60
    if d:
        return f"{d} d {h} h"
    if h:
        return f"{h} h {m} min"
    return f"{m} min" if m else "under a minute"


def until(t: float, now: float) -> str:
    """"in 2 d 3 h", or "3 h 5 min ago"."""
    return f"in {span(t - now)}" if t >= now else f"{span(now - t)} ago"


def rfc3339(value: Any) -> float | None:
    """A Kubernetes timestamp (2026-12-03T14:00:00Z) as epoch seconds; None
    when it is not one."""
    try:
        return float(calendar.timegm(time.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def seconds(value: Any) -> float | None:
    """A protobuf Duration as GKE's JSON writes it ("604800s"); None when
    it is not one."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)s\s*", str(value))
    return float(m.group(1)) if m else None


# -- host maintenance ------------------------------------------------------------------
@dataclass
class Maintenance:
    """A slice's nodes' scheduled maintenance: the earliest, and the labels
    that are not a time (said, never guessed)."""

    earliest: float | None = None
    node: str = ""
    scheduled: int = 0  # nodes with a readable time
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (node, value)


def maintenance(nodes: list[Node]) -> Maintenance:
    out = Maintenance()
    for n in nodes:
        if MAINTENANCE_LABEL not in n.labels:
            continue
        raw = n.labels[MAINTENANCE_LABEL]
        try:
            t = float(raw.strip())
        except ValueError:
            t = float("nan")
        if t != t or t <= 0:  # NaN or not a time
            out.unreadable.append((n.name, raw))
            continue
        out.scheduled += 1
        if out.earliest is None or t < out.earliest:
            out.earliest, out.node = t, n.name
    return out


def maintenance_words(m: Maintenance, now: float) -> str:
    """"maintenance 2026-12-10 14:00Z, in 2 d 3 h (node N, 1 of its nodes)",
    "none scheduled", with any unreadable label said."""
    parts = []
    if m.earliest is not None:
        due = until(m.earliest, now) if m.earliest >= now else f"due {until(m.earliest, now)}"
        parts.append(f"maintenance {utc(m.earliest)}, {due} (node {m.node}"
                     + (f"; {m.scheduled} nodes scheduled)" if m.scheduled > 1 else ")"))
    for node, raw in m.unreadable:
        parts.append(f"maintenance label of node {node} unreadable: {raw!r}")
    return "; ".join(parts) or "no maintenance scheduled"


# -- flex-start ends ---------------------------------------------------------------------
def is_flex_start(pool: Any, nodes: list[Node], capacity_label: str) -> bool:
    """Whether a pool is flex-start: its own config when GKE's pool list was
    read (``pool``), else its nodes' labels (ours, or GKE's)."""
    if pool is not None:
        return bool(((pool or {}).get("config") or {}).get("flexStart"))
    return any(n.labels.get(capacity_label) == FLEX_START.name or n.labels.get(FLEX_START_NODE_LABEL) == "true"
               for n in nodes)


def run_duration(pool: Any) -> tuple[float | None, str]:
    """(seconds, where from) of a flex-start pool's max run duration: its
    config's, else GKE's default; None with the value when unreadable."""
    raw = ((pool or {}).get("config") or {}).get("maxRunDuration")
    if raw in (None, ""):
        return float(FLEX_START_DEFAULT_S), "GKE's default"
    s = seconds(raw)
    return (s, "the pool's max run duration") if s is not None else (None, str(raw))


def flex_end(pool: Any, nodes: list[Node]) -> float | None:
    """A flex-start slice's end: its first node's creation plus its run
    duration (None: no nodes, or a time unreadable)."""
    duration, _ = run_duration(pool)
    created = [rfc3339(n.created) for n in nodes]
    if duration is None or not created or any(t is None for t in created):
        return None
    return min(t for t in created if t is not None) + duration


def coming(doc: Any, pool_label: str, capacity_label: str, pools: list[str]) -> dict[str, tuple[float, str]]:
    """Each of ``pools``' nearest end, from `kubectl get nodes -o json`: its
    earliest scheduled maintenance, or its flex-start end (its run duration
    GKE's default: the watch reads no pool config), with it in words."""
    out: dict[str, tuple[float, str]] = {}
    for name, nodes in nodes_by_pool(doc, pool_label).items():
        if name not in pools:
            continue
        m = maintenance(nodes)
        if m.earliest is not None:
            out[name] = (m.earliest, f"host maintenance at {utc(m.earliest)} (node {m.node})")
        end = flex_end(None, nodes) if is_flex_start(None, nodes, capacity_label) else None
        if end is not None and (name not in out or end < out[name][0]):
            out[name] = (end, f"flex-start end at {utc(end)} ({span(FLEX_START_DEFAULT_S)} from its first node)")
    return out


def flex_end_words(pool: Any, nodes: list[Node], now: float) -> str:
    """"flex-start ends 2026-12-10 14:00Z, in 5 d 2 h (7 d from its first
    node, GKE's default)", or why it cannot say."""
    duration, source = run_duration(pool)
    if duration is None:
        return f"flex-start end unknown: max run duration unreadable: {source!r}"
    if not nodes:
        return f"flex-start, no nodes yet: it runs {span(duration)} from when they come"
    created = [(rfc3339(n.created), n) for n in nodes]
    bad = [n for t, n in created if t is None]
    if bad:
        return f"flex-start end unknown: creation time of node {bad[0].name} unreadable: {bad[0].created!r}"
    first = min(t for t, _ in created if t is not None)
    end = first + duration
    left = f"in {span(end - now)}" if end >= now else f"past its end by {span(now - end)}"
    return f"flex-start ends {utc(end)}, {left} ({span(duration)} from its first node, {source})"


def slice_words(name: str, nodes: list[Node], pool: Any, flex: bool, now: float) -> tuple[str, bool]:
    """(one slice's words, whether a maintenance is scheduled or due)."""
    m = maintenance(nodes)
    words = maintenance_words(m, now) if nodes else ""
    if flex:
        words = "; ".join(w for w in (words, flex_end_words(pool, nodes, now)) if w)
    words = words or "no nodes"
    return f"{name}: {words}", m.earliest is not None
