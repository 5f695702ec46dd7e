"""What a run costs: chip-hours always, dollars where a price is known.
Pure functions of a run's events and its price basis: no I/O.

- Two figures of chips, each second. **Billed**: the slices whose nodes
  exist (GKE bills a node from its creation to its deletion, whatever the
  job does). **Used**: the slices of the job's worker group. Their
  difference is its own cause, ``held`` ("held, not training"): a returned
  slice until the grow takes it in, the slices idle between two jobs.
- What proves a slice billed (``Ledger``): from the run's start every slice
  of its ``priced`` event is (its pool existed when `train` priced it); a
  slice stops at a loss that takes its nodes (a chaos kill of a twin's host;
  on GKE a pod lost to a preemption, maintenance or its node gone) and is
  billed again from the event that shows it back (``host_back``: the twin's
  host restarted; ``scheduled``: a pod placed on a node again). A pod that
  failed or was deleted keeps its node billed; so does a worker Ray marks
  dead. Between jobs the slices billed stay billed (the pools exist; a
  teardown between two jobs of one run is not in its timeline).
- What the worker group holds: its slices as its workers say them (the
  trainer's ``worker_started``: rank and slice, its own time; Ray Train's
  "Started training worker group of size N" where none was recorded).
  From a submit until the first group, the job holds every slice billed;
  from a loss until the next group, the group's slices still billed; from a
  job's end until the next submit, none.
- Dollars: each slice's chips at its own option's price (the ``priced``
  event's ``options`` and ``rates``, index = slice), each period at the
  price recorded for it (a resubmit's ``priced`` applies from its time).
  A slice's price is known where its workers' slice name says which
  option it runs on: the ``priced`` event's ``names`` (the twin's hosts);
  on GKE its ``pools`` (slice i is node pool i) and the pod watch's
  ``scheduled`` events, each with the pool of the pod's node: a replica
  (slice name) seen on one pool only is that pool's slice (``placed``).
  Where a replica's pool is not known, the slices' prices differ and fewer
  than all are held, the dollars are a range (the cheapest to the dearest
  slices that many), never a mean. A slice without a price leaves the run
  without one: chip-hours only.
- A host the follower set aside (``quarantined``: stall_action: restart, a
  failed health gate; ``runs/restart.py``): on the twin its host is
  stopped, not billed (as a lost host); on GKE its slice's nodes exist and
  bill, not in any worker group: their own cause, ``quarantined``, until a
  pod is placed on its pool again (the pool made again), the host is
  released (``released``: ``invoke hosts.release``; then billed and held
  until a worker group takes it) or the run's next job is priced.
- Each second of the goodput report (``goodput.py``'s segments: productive
  or one cause of badput) costs the chips used then; the chips billed and
  not used then are ``held``.
- The estimate before a submit: the steps left x the step time measured
  (the run's own last job, else the newest run of the same model here) x
  the chips x the price, plus the start-up, compile and checkpoint seconds
  that run measured; a lower bound (waiting for capacity, incidents).
  Where no run measured one, the step time estimated from the model and
  the chips (``job/save_plan.py``, the checkpoint period's), said so.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from playbooks.cloud import prices
from playbooks.config.schema import Environment, capacities
from playbooks.runs import events as E

PRICED = E.PRICED
HELD = "held"  # cost's own cause: chips billed, not in the worker group
HELD_WHAT = "held, not training"
QUARANTINED = "quarantined"  # cost's own cause: a slice set aside, its nodes billed (GKE)
QUARANTINED_WHAT = "quarantined (set aside, billed)"
# A pod lost this way took its node with it (pod_watch.py's words); a failed
# or deleted pod leaves its node, billed.
NODE_GONE = ("preemption", "maintenance", "node gone", "preemption or maintenance")

RANGE_WHY = ("while it held fewer slices than all, which ones is not recorded (on GKE a KubeRay replica's node pool, "
             "where no pod of it was seen placed on a node of a pool): the cheapest to the dearest that many")
Money = float | list[float]  # USD: a figure, or [low, high] where which slices were held is not known


@dataclass(frozen=True)
class Held:
    """``k`` slices out of ``among`` (their names): all of them when ``k``
    is their number, else which ``k`` is not known (nor is it when
    ``among`` names no slice of the basis)."""

    among: frozenset[str]
    k: int


@dataclass
class Basis:
    """What a run holds and what a chip-hour of it costs. Per slice (index =
    slice): ``options`` its capacity option, ``rates`` USD per chip-hour or
    None, ``ranges`` [cheapest, dearest] where its option is one of several
    (Autopilot), ``names`` the slice name its workers report (TPU_NAME),
    recorded only where slice i is known to run on ``options[i]`` (the
    twin's hosts; on GKE, where a KubeRay replica is not pinned to a pool,
    ``placed`` fills them in from the pods' nodes: "" where not known),
    ``pools`` each slice's node pool (GKE Standard). ``simulated``: a local
    twin's chips."""

    slices: int
    hosts_per_slice: int
    chips_per_host: int
    options: list[str] = field(default_factory=list)
    rates: list[float | None] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    why: str = ""        # why there is no price, when there is none
    simulated: bool = False
    names: list[str] = field(default_factory=list)
    ranges: list[list[float] | None] = field(default_factory=list)
    pools: list[str] = field(default_factory=list)

    @property
    def chips(self) -> int:
        return self.slices * self.chips_per_slice

    @property
    def chips_per_slice(self) -> int:
        return self.hosts_per_slice * self.chips_per_host

    def bounds(self, i: int) -> tuple[float, float] | None:
        """Slice i's price per chip-hour: (it, it), a range, or None."""
        r = self.rates[i] if i < len(self.rates) else None
        if r is not None:
            return (r, r)
        g = self.ranges[i] if i < len(self.ranges) else None
        return (g[0], g[1]) if g else None

    @property
    def per_chip_hour(self) -> float | None:
        """The one price of every slice, when they have one and the same
        (else None: each slice is priced at its own)."""
        if self.simulated or len(self.rates) < self.slices or any(r is None for r in self.rates):
            return None
        known = {r for r in self.rates if r is not None}
        return known.pop() if len(known) == 1 else None

    def rate_sum(self, held: Held) -> tuple[float, float] | None:
        """USD per hour of one chip of each slice held: exact when which
        slices is known (or their prices are one), else the cheapest to the
        dearest ``k`` slices; None when one that may be held has no price.
        A held name whose slice is not known is on one of the slices no
        name is known of (the cheapest of them to the dearest)."""
        if held.k <= 0:
            return (0.0, 0.0)
        if self.simulated:
            return None
        index = {n: i for i, n in enumerate(self.names) if n}
        known = [index[n] for n in held.among if n in index]
        free = [i for i in range(self.slices) if i not in index.values()]
        unknown = len(held.among) - len(known)
        if held.among and held.k <= len(held.among) and unknown <= len(free):
            fixed, rest = known, free if unknown else []
        else:  # which is not known: any k of the slices
            fixed, rest, unknown = [], list(range(self.slices)), held.k
        got, others = [self.bounds(i) for i in fixed], [self.bounds(i) for i in rest]
        if held.k > len(fixed) + min(unknown, len(rest)):
            return None
        mine, theirs = [b for b in got if b is not None], [b for b in others if b is not None]
        if len(mine) + len(theirs) < len(got) + len(others):  # one that may be held has no price
            return None
        lows = sorted([b[0] for b in mine] + sorted(b[0] for b in theirs)[:unknown])
        highs = sorted([b[1] for b in mine] + sorted((b[1] for b in theirs), reverse=True)[:unknown], reverse=True)
        return (sum(lows[:held.k]), sum(highs[:held.k]))

    def slice_text(self) -> str:
        """'slice 0 on-demand $2.7, slice 1 spot $1.403'."""
        out = []
        for i in range(self.slices):
            opt = self.options[i] if i < len(self.options) else "?"
            b = self.bounds(i)
            money = "no price" if b is None else f"${b[0]:.4g}" if b[0] == b[1] else f"${b[0]:.4g}-{b[1]:.4g}"
            out.append(f"slice {i} {opt} {money}")
        return ", ".join(out)

    def price_text(self) -> str:
        if self.simulated:
            return "no price: a local run's chips are simulated"
        if any(self.bounds(i) is None for i in range(self.slices)):
            return f"no price ({self.why or 'no price known for its capacity'})"
        src = ", ".join(dict.fromkeys(self.sources))
        one = self.per_chip_hour
        if one is not None:
            kinds = ", ".join(dict.fromkeys(f"{o} ${one:.4g}" for o in self.options))
            return f"${one:.4g}/chip-hour ({kinds}; {src})"
        why = f"; {self.why}" if self.why else ""
        return f"{self.slice_text()} per chip-hour ({src}{why})"

    def hourly(self) -> tuple[float, float] | None:
        """USD per hour of every slice."""
        r = self.rate_sum(Held(frozenset(), self.slices))
        return None if r is None else (r[0] * self.chips_per_slice, r[1] * self.chips_per_slice)

    def event_fields(self) -> dict[str, Any]:
        return {"slices": self.slices, "hosts_per_slice": self.hosts_per_slice, "chips_per_host": self.chips_per_host,
                "options": self.options, "rates": self.rates, "sources": self.sources, "why": self.why,
                "simulated": self.simulated, "names": self.names, "ranges": self.ranges,
                **({"pools": self.pools} if self.pools else {})}


def env_basis(env: Environment, options: list[str] | None, catalog: prices.Catalog | str | None,
              names: list[str] | None = None, pools: list[str] | None = None) -> Basis:
    """The environment's slices, each on its option (``options``, one per
    slice; None: on Standard the first of ``capacity:``, on Autopilot not
    known: its ComputeClass picks each node's among ``capacity:``, so each
    slice is priced from the cheapest to the dearest of them), priced; a
    local twin's chips are simulated and have no price. ``names``: the
    slice names its workers report, where slice i is known to be on
    ``options[i]``; ``pools``: each slice's node pool (GKE Standard)."""
    if env.platform.simulated:
        return Basis(env.slices, env.hosts_per_slice, env.chips_per_host, simulated=True,
                     why="a local run's chips are simulated", names=list(names or []))
    if options is None and env.cluster_mode.our_node_pools:
        options = [capacities(env)[0]] * env.slices
    if options is None:
        listed = capacities(env)
        got = [prices.price(env, o, catalog) for o in listed]
        rates = [p.per_chip_hour for p in got]
        span = [min(r for r in rates if r is not None), max(r for r in rates if r is not None)] \
            if all(r is not None for r in rates) else None
        why = (f"Autopilot's ComputeClass picks each node's option among {', '.join(listed)}: not recorded"
               if len(listed) > 1 else "")
        if len(listed) == 1:
            return Basis(env.slices, env.hosts_per_slice, env.chips_per_host, [listed[0]] * env.slices,
                         [rates[0]] * env.slices, [p.source for p in got if p.source],
                         next((p.said for p in got if p.why), ""))
        return Basis(env.slices, env.hosts_per_slice, env.chips_per_host, [" or ".join(listed)] * env.slices,
                     [None] * env.slices, [p.source for p in got if p.source],
                     next((p.said for p in got if p.why), why) if span is None else why, ranges=[span] * env.slices)
    got = [prices.price(env, o, catalog) for o in options]
    return Basis(env.slices, env.hosts_per_slice, env.chips_per_host, list(options), [p.per_chip_hour for p in got],
                 [p.source for p in got if p.source], next((p.said for p in got if p.why), ""),
                 names=list(names or []), pools=list(pools or []))


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _rate(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e6 else None


def _span(v: Any) -> list[float] | None:
    if isinstance(v, list) and len(v) == 2 and (lo := _rate(v[0])) is not None and (hi := _rate(v[1])) is not None \
            and lo <= hi:
        return [lo, hi]
    return None


def basis_of(e: dict) -> Basis | None:
    """A ``priced`` event's basis, or None when it is not whole."""
    s, h, c = _int(e.get("slices")), _int(e.get("hosts_per_slice")), _int(e.get("chips_per_host"))
    if s is None or h is None or c is None:
        return None

    def listed(k: str) -> list:
        v = e.get(k)
        return v if isinstance(v, list) else []

    rates = [_rate(r) for r in listed("rates")]
    opts, srcs = [str(o) for o in listed("options")], [str(x) for x in listed("sources")]
    names = [str(n) for n in listed("names")]
    names = names if len(names) == s and len(set(names)) == s else []  # one name a slice, or none at all
    pools = [str(n) for n in listed("pools")]
    pools = pools if len(pools) == s and len(set(pools)) == s else []  # one pool a slice, or none at all
    return Basis(s, h, c, opts, rates, srcs, str(e.get("why") or ""), bool(e.get("simulated")), names,
                 [_span(r) for r in listed("ranges")], pools)


def recorded_bases(events: Iterable[dict]) -> list[tuple[float, Basis]]:
    """(from, basis) of each submission's ``priced`` event, in time order."""
    out = []
    for e in events:
        if e.get("kind") == PRICED and (b := basis_of(e)) is not None:
            out.append((float(e["t"]), b))
    return sorted(out, key=lambda x: x[0])


def recorded_basis(events: Iterable[dict]) -> Basis | None:
    """The basis recorded with the run's last submission, if any."""
    got = recorded_bases(events)
    return got[-1][1] if got else None


# -- which slice a replica is (GKE) -------------------------------------------------------
def placed(events: Iterable[dict]) -> dict[str, str]:
    """Each replica (slice name) the pod watch saw placed on nodes of one
    node pool only, and that pool (its ``scheduled`` events' ``pool``); a
    replica seen on two pools is left out (which, when, is not known)."""
    seen: dict[str, set[str]] = {}
    for e in events:
        if e.get("kind") == E.SCHEDULED and e.get("slice") and e.get("pool"):
            seen.setdefault(str(e["slice"]), set()).add(str(e["pool"]))
    return {n: next(iter(p)) for n, p in seen.items() if len(p) == 1}


def resolve(b: Basis, where: dict[str, str]) -> Basis:
    """A GKE basis with the names of its slices filled in where a replica
    was seen on slice i's pool alone (``placed``): "" where not known, or
    where two replicas were seen on one pool."""
    if b.names or not b.pools:
        return b
    names = []
    for pool in b.pools:
        on = [n for n, p in where.items() if p == pool]
        names.append(on[0] if len(on) == 1 else "")
    return replace(b, names=names) if any(names) else b


# -- what is billed and what is used, when -----------------------------------------------
@dataclass(frozen=True)
class Period:
    """From ``t`` on: the basis that prices it, the slices billed, those used."""

    t: float
    basis: Basis
    billed: Held
    used: Held
    quarantined: Held = Held(frozenset(), 0)  # billed, set aside (GKE)

    @property
    def held(self) -> Held:
        among = self.billed.among - self.used.among if self.used.k == len(self.used.among) else self.billed.among
        return Held(among - self.quarantined.among, max(0, self.billed.k - self.used.k - self.quarantined.k))


def _groups(events: list[dict]) -> dict[int, frozenset[str]]:
    """Each worker group's slices (by its rank 0's ``worker_started``, the
    index in ``events``): the slices its workers said, each worker given to
    the rank 0 of its size nearest in time."""
    starts = [(i, e) for i, e in enumerate(events) if e.get("kind") == E.WORKER_STARTED]
    zeros = [(i, e) for i, e in starts if e.get("rank") == 0]
    out: dict[int, set[str]] = {i: set() for i, _ in zeros}
    for _, w in starts:
        mine = [(abs(float(w["t"]) - float(z["t"])), i) for i, z in zeros if z.get("workers") == w.get("workers")]
        if mine and w.get("slice"):
            out[min(mine)[1]].add(str(w["slice"]))
    return {i: frozenset(s) for i, s in out.items()}


def _takes_nodes(e: dict) -> bool:
    """A loss whose nodes are gone: a chaos kill of a twin's host, a pod
    lost with its node on GKE."""
    if e.get("kind") != E.WORKER_LOST:
        return False
    return (e.get("source") == "chaos" and bool(e.get("host"))) or (e.get("source") == "pods"
                                                                  and e.get("by") in NODE_GONE)


class _Walk:
    """What is billed and used as the events come (``ledger``)."""

    def __init__(self, basis: Basis, groups: dict[int, frozenset[str]], where: dict[str, str]):
        self.where = where
        self.basis, self.groups = resolve(basis, where), groups
        self.absent: set[str] = set()
        self.gone = 0  # slices gone whose name was not recorded
        self.aside: set[str] = set()  # slices set aside, still billed (GKE)
        self.aside_unnamed = 0  # the same, their name not known
        self.running = True
        self.group: tuple[frozenset[str] | None, int] | None = None
        self.out: list[Period] = []

    def period(self, t: float) -> Period:
        names, b = set(self.basis.names) - {""}, self.basis
        every = len(names) == b.slices  # each slice's name known (else which are billed is not)
        kb = max(0, b.slices - len(self.absent & names if every else self.absent) - self.gone)
        among = frozenset(names - self.absent) if every else frozenset()
        billed = Held(among, kb)
        aside = Held(frozenset(self.aside - self.absent),
                     min(kb, len(self.aside - self.absent) + self.aside_unnamed))
        free = Held(among - aside.among, max(0, kb - aside.k))  # billed, not set aside
        if not self.running:
            used = Held(frozenset(), 0)
        elif self.group is None:
            used = free
        else:
            said, k = self.group
            if said is not None and len(said) == k:
                live = frozenset(said - self.absent - self.aside)
                used = Held(live, min(len(live), free.k))
            else:
                used = Held(free.among, min(k, free.k))
        return Period(t, b, billed, used, aside)

    def snap(self, t: float) -> None:
        p, out = self.period(t), self.out
        if out and out[-1].t == t:
            out[-1] = p
        elif not out or (out[-1].basis, out[-1].billed, out[-1].used, out[-1].quarantined) != (
                p.basis, p.billed, p.used, p.quarantined):
            out.append(p)

    def see(self, i: int, e: dict) -> bool:
        """Take one event in; True when it changed what is billed or used."""
        kind = e.get("kind")
        if kind == PRICED and (b := basis_of(e)) is not None:
            b = resolve(b, self.where)
            if (b.slices, b.names) != (self.basis.slices, self.basis.names):
                self.absent, self.gone = set(), 0
            self.aside, self.aside_unnamed = set(), 0
            self.basis = b
        elif kind in (E.SUBMITTED, E.JOB_END):
            self.running, self.group = kind == E.SUBMITTED, None
        elif kind == E.WORKER_STARTED and i in self.groups:
            n = _int(e.get("workers"))
            said = self.groups[i]
            self.group = (said, math.ceil(n / self.basis.hosts_per_slice) if n else len(said))
        elif kind in E.GROUP_LINES and not self.groups and (n := _int(e.get("workers"))) is not None:
            self.group = (None, math.ceil(n / self.basis.hosts_per_slice))
        elif _takes_nodes(e):
            if e.get("slice"):
                self.absent.add(str(e["slice"]))
            else:
                self.gone += 1
        elif kind == E.QUARANTINED:
            self.set_aside(str(e.get("slice") or ""))
        elif kind == E.RELEASED:
            self.release(str(e.get("slice") or ""))
        elif kind in (*E.BACK, E.SCHEDULED) and e.get("slice") and str(e["slice"]) in self.aside:
            self.aside.discard(str(e["slice"]))  # its pool made again: a pod placed on it
        elif kind in (*E.BACK, E.SCHEDULED) and e.get("slice"):
            if str(e["slice"]) in self.absent:
                self.absent.discard(str(e["slice"]))
            elif self.gone:
                self.gone -= 1
        else:
            return False
        return True


    def set_aside(self, slice_: str) -> None:
        """A ``quarantined`` slice: the twin's host stopped (not billed); on
        GKE its pool (slice i is pool i) billed and set aside."""
        if self.basis.simulated:
            if slice_:
                self.absent.add(slice_)
            else:
                self.gone += 1
            return
        name = self.pool_slice(slice_)
        if name is not None:
            self.aside.add(name)
        else:
            self.aside_unnamed += 1

    def pool_slice(self, pool: str) -> str | None:
        """The slice name of a GKE node pool (slice i is pool i), where known."""
        b = self.basis
        i = b.pools.index(pool) if pool in b.pools else None
        return b.names[i] if i is not None and i < len(b.names) and b.names[i] else None

    def release(self, slice_: str) -> None:
        """A ``released`` slice (``invoke hosts.release``): the twin's host
        started again, billed again; on GKE its nodes no longer set aside,
        billed and held until a worker group takes the slice."""
        if self.basis.simulated:
            if slice_ in self.absent:
                self.absent.discard(slice_)
            elif not slice_ and self.gone:
                self.gone -= 1
            return
        name = self.pool_slice(slice_)
        if name is not None:
            self.aside.discard(name)
        elif self.aside_unnamed:
            self.aside_unnamed -= 1


def ledger(events: list[dict], fallback: Basis) -> list[Period]:
    """The periods of a run, in time order: each ``priced`` event's basis
    from its time (the first also before it; ``fallback`` where none), the
    slices billed and used (the module says what proves each)."""
    evs = sorted((e for e in events if E.number(e.get("t")) is not None), key=lambda e: float(e["t"]))
    bases = recorded_bases(evs)
    walk = _Walk(bases[0][1] if bases else fallback, _groups(evs), placed(evs))
    walk.snap(float("-inf"))
    for i, e in enumerate(evs):
        if walk.see(i, e):
            walk.snap(float(e["t"]))
    return walk.out


# -- chip-hours and dollars by cause ---------------------------------------------------------
class _Sum:
    """Chip-hours and [low, high] dollars of one part; ``priced`` False
    once a period of it had no price."""

    def __init__(self) -> None:
        self.hours, self.low, self.high, self.priced = 0.0, 0.0, 0.0, True

    def add(self, seconds: float, basis: Basis, held: Held) -> None:
        if held.k <= 0 or seconds <= 0:
            return
        ch = seconds * held.k * basis.chips_per_slice / 3600
        self.hours += ch
        r = basis.rate_sum(held)
        if r is None:
            self.priced = False
        else:
            per = seconds * basis.chips_per_slice / 3600
            self.low, self.high = self.low + per * r[0], self.high + per * r[1]

    def money(self) -> Money | None:
        if not self.priced:
            return None
        lo, hi = round(self.low, 2), round(self.high, 2)
        return lo if lo == hi else [lo, hi]


def tally(segments: list[tuple[float, float, str]], periods: list[Period]) -> tuple[_Sum, dict[str, _Sum]]:
    """The chips billed (the whole) and, per cause, the chips used, over the
    goodput segments; what was billed and not used is ``HELD``."""
    billed, by = _Sum(), {HELD: _Sum(), QUARANTINED: _Sum()}
    for a, b, cause in segments:
        for j, p in enumerate(periods):
            lo = max(a, p.t)
            hi = min(b, periods[j + 1].t if j + 1 < len(periods) else float("inf"))
            if hi <= lo:
                continue
            billed.add(hi - lo, p.basis, p.billed)
            by.setdefault(cause, _Sum()).add(hi - lo, p.basis, p.used)
            by[HELD].add(hi - lo, p.basis, p.held)
            by[QUARANTINED].add(hi - lo, p.basis, p.quarantined)
    return billed, by


def windows(uncertain: dict | None) -> list[tuple[float, float]]:
    """The time windows of the goodput report's events timed within bounds,
    merged (``goodput.uncertain`` merges them, within the run)."""
    return [(float(a), float(b)) for a, b in (uncertain or {}).get("windows") or []]


def within(segments: list[tuple[float, float, str]], spans: list[tuple[float, float]]
           ) -> list[tuple[float, float, str]]:
    """The parts of the segments inside the spans."""
    return [(max(a, lo), min(b, hi), c) for a, b, c in segments for lo, hi in spans if min(b, hi) > max(a, lo)]


def report(events: list[dict], segments: list[tuple[float, float, str]], causes: Iterable[str],
           basis: Basis, recorded: bool, uncertain: dict | None = None) -> dict[str, Any]:
    """The goodput report's cost part: chip-hours billed and used, of the
    productive time, of each cause and held not training; dollars where a
    price is known (a [low, high] range where which slices is not known);
    the prices of each slice, per submission. ``uncertain`` (the goodput
    report's events timed within bounds): the chip-hours billed in their
    windows may belong to the cause beside theirs (``uncertain_chip_hours``)."""
    periods = ledger(events, basis)
    billed, by = tally(segments, periods)
    loose, _ = tally(within(segments, windows(uncertain)), periods)
    productive = by.pop("productive", _Sum())
    names = [*causes, HELD, QUARANTINED]
    bases = recorded_bases(events) or [(float("-inf"), basis)]
    last = bases[-1][1]
    used = billed.hours - by[HELD].hours - by[QUARANTINED].hours
    out: dict[str, Any] = {
        "chips": last.chips, "chips_simulated": last.simulated,
        "chip_hours": round(billed.hours, 4), "used_chip_hours": round(used, 4),
        "productive_chip_hours": round(productive.hours, 4),
        "badput_chip_hours": {c: round(by.get(c, _Sum()).hours, 4) for c in names},
        "basis": "recorded when the run was submitted" if recorded else
                 "not recorded with the run: the environment's slices and prices now",
        "per_chip_hour": last.per_chip_hour, "currency": "USD",
        "price": last.price_text(),
        "prices": [{"from": None if math.isinf(t) else t, "text": b.price_text(),
                    "slices": [{"slice": i, "option": b.options[i] if i < len(b.options) else None,
                                "per_chip_hour": b.rates[i] if i < len(b.rates) else None,
                                **({"range": b.ranges[i]} if i < len(b.ranges) and b.ranges[i] else {})}
                               for i in range(b.slices)]} for t, b in bases],
    }
    if loose.hours:
        out["uncertain_chip_hours"] = round(loose.hours, 4)
    if billed.priced and not last.simulated:
        out["cost"] = billed.money()
        if loose.hours:
            out["uncertain_cost"] = loose.money()
        out["productive_cost"] = productive.money()
        out["badput_cost"] = {c: by.get(c, _Sum()).money() for c in names}
    return out


def money_text(m: Money | None) -> str:
    """'$0.33', '$0.29-0.35', or '' (no price)."""
    if m is None:
        return ""
    if isinstance(m, list):
        return f"${m[0]:,.2f}-{m[1]:,.2f}"
    return f"${m:,.2f}"


def cost_text(c: dict[str, Any]) -> str:
    """'12.3 chip-hours, $33.21' or '12.3 chip-hours (no price ...)'."""
    sim = " (simulated chips)" if c.get("chips_simulated") else ""
    if c.get("cost") is None:
        return f"{c['chip_hours']:.4g} chip-hours{sim}"
    return f"{c['chip_hours']:.4g} chip-hours, {money_text(c['cost'])}"


def header_lines(c: dict[str, Any]) -> list[str]:
    """The goodput report's cost lines: billed and used, each slice's price
    (each submission's, when they differ), and the basis."""
    sim = " (simulated: a local run)" if c.get("chips_simulated") else ""
    money = f", {money_text(c['cost'])}" if c.get("cost") is not None else ""
    out = [f"  cost: {c['chip_hours']:.4g} chip-hours billed{money} ({c['used_chip_hours']:.4g} used by the worker "
           f"group), {c['chips']} chips{sim}"]
    priced = c.get("prices") or []
    if len(priced) > 1:
        out += [f"    from {E.when(p['from']) if p['from'] is not None else 'the start'}: {p['text']}" for p in priced]
    else:
        out.append(f"    at {c['price']}")
    if isinstance(c.get("cost"), list):
        out.append(f"    (a range: {RANGE_WHY})")
    if c.get("uncertain_chip_hours"):
        money = f" ({money_text(c['uncertain_cost'])})" if c.get("uncertain_cost") is not None else ""
        out.append(f"    up to {c['uncertain_chip_hours']:.4g} chip-hours{money} of the causes' below may belong to "
                   f"the cause beside theirs: Ray's lines timed within bounds (times not exact, below)")
    return out + [f"    ({c['basis']})"]


# -- before a submit ---------------------------------------------------------------
def group_step_seconds(events: list[dict], hosts: int | None = None) -> list[float]:
    """MaxText's step times past each worker group's first two steps (they
    compile), of the groups of ``hosts`` hosts (all groups when None)."""
    vals: list[float] = []
    seen, size = 0, None
    for e in events:
        kind = e.get("kind")
        if kind in E.GROUP_LINES:
            seen, size = 0, _int(e.get("workers"))
        elif kind in E.STARTS:
            seen = 0
        elif kind == E.STEP and isinstance(e.get("seconds"), (int, float)) and not isinstance(e["seconds"], bool):
            seen += 1
            if seen > 2 and (hosts is None or size in (None, hosts)):
                vals.append(float(e["seconds"]))
    return vals


def model_of(events: list[dict]) -> str | None:
    return next((str(e["model"]) for e in reversed(events) if e.get("kind") == E.MODEL_CHECK and e.get("model")),
                None)


@dataclass(frozen=True)
class StepTime:
    seconds: float
    basis: str  # "median of 57 steps of run X"
    run: str = ""  # the run it was measured in
    estimated: bool = False  # from the model and the chips, not a run's


def estimated_step(seconds: float, why: str) -> StepTime:
    """The step time estimated (the checkpoint period's estimate, whose
    line gives its arithmetic), where no run measured one (``why``)."""
    return StepTime(seconds, f"estimated, as the checkpoint period's line shows; none measured: {why}",
                    estimated=True)


@dataclass(frozen=True)
class Overhead:
    """What a job spends besides its steps, as a run measured it (its
    goodput report): start-up and compile once per job, checkpoint saves
    per step."""

    startup_s: float
    compile_s: float
    checkpoint_per_step_s: float
    run: str

    def seconds(self, steps: int) -> float:
        return self.startup_s + self.compile_s + self.checkpoint_per_step_s * steps

    def text(self, steps: int) -> str:
        return (f"{self.startup_s:.3g} s start-up + {self.compile_s:.3g} s compile + "
                f"{self.checkpoint_per_step_s * steps:.3g} s checkpoint saves (run {self.run}'s, per job)")


def overhead_of(report: dict[str, Any], run: str) -> Overhead | None:
    """A run's start-up, compile (each per job) and checkpoint seconds (per
    step counted), from its goodput report; None when it has none."""
    jobs, counted = len(report.get("jobs") or []), (report.get("steps") or {}).get("counted") or 0
    bad = report.get("badput_s") or {}
    if not jobs or not counted:
        return None
    return Overhead(bad.get("startup", 0.0) / jobs, bad.get("compile", 0.0) / jobs,
                    bad.get("checkpoint", 0.0) / counted, run)


def measured(runs: list[tuple[str, list[dict]]], run: str, model: str, hosts: int) -> StepTime | None:
    """The step time to estimate with: the run's own (its groups of every
    host, else any of its groups), else the newest run of the same model
    here. ``runs``: (name, events), newest first."""
    ordered = sorted(runs, key=lambda r: r[0] != run)  # the run itself first, then newest first
    for name, evs in ordered:
        if name != run and model_of(evs) != model:
            continue
        for want, what in ((hosts, f"{hosts} hosts"), (None, "any size")):
            vals = group_step_seconds(evs, want)
            if vals:
                return StepTime(statistics.median(vals), f"median of {len(vals)} steps of run {name}"
                                + ("" if want is not None else f", worker groups of {what}"), name)
    return None


LOWER_BOUND = "at least: waiting for capacity and incidents not included"
NOT_MEASURED = "a lower bound: start-up, compile and checkpoint saves not included (none measured)"
ESTIMATED = ("an estimate: its step time estimated; start-up, compile, checkpoint saves, waiting for capacity and "
             "incidents not included")


def estimate(steps_left: int, step: StepTime | None, basis: Basis, why: str | None = None,
             overhead: Overhead | None = None) -> str:
    """The one line `train` prints before it submits: the steps left x the
    step time (measured, else estimated: ``estimated_step``), plus the
    start-up, compile and checkpoint seconds measured (else it says they
    are left out), x the chips x each slice's price."""
    per_hour = basis.hourly() if not basis.simulated else None
    hourly = None if per_hour is None else _dollars(per_hour) + "/h"
    price = basis.price_text()
    if steps_left <= 0:
        return "cost estimate: no step left to train"
    if step is None:
        per = f" ({hourly} while it runs)" if hourly else ""
        return (f"cost estimate: {steps_left} steps x unknown step time ({why or 'none measured'}) x "
                f"{basis.chips} chips: unknown{per}; {price}")
    seconds = steps_left * step.seconds + (overhead.seconds(steps_left) if overhead else 0.0)
    hours = seconds / 3600
    ch = hours * basis.chips
    extra = f" + {overhead.text(steps_left)}" if overhead else ""
    bound = ESTIMATED if step.estimated else LOWER_BOUND if overhead else NOT_MEASURED
    head = (f"cost estimate: ({steps_left} steps x {step.seconds:.3g} s ({step.basis}){extra}) x {basis.chips} chips"
            f" = {ch:.4g} chip-hours")
    if per_hour is None:
        return f"{head} ({bound}); {price}"
    one = basis.per_chip_hour
    times = f" x ${one:.4g}" if one is not None else ""
    return (f"{head}{times} = {_dollars((per_hour[0] * hours, per_hour[1] * hours))} ({hours * 60:.3g} min at "
            f"{hourly}; {bound}); {price}")


def _dollars(r: tuple[float, float]) -> str:
    return f"${r[0]:,.2f}" if round(r[0], 2) == round(r[1], 2) else f"${r[0]:,.2f}-{r[1]:,.2f}"
