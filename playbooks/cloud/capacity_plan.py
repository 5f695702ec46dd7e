"""The capacity plan: which option of ``capacity:`` makes each slice's node
pool, decided once, read-only, before anything is created.

The inventory's options are tried best first: a reservation's free hosts
take as many whole slices as they hold; the slices left go to the next
options as their quota permits (each generation's quotas: config/tpu.py;
Spot: the preemptible quota; on-demand: TPUS_PER_TPU_FAMILY; flex-start: the preemptible quota, else the on-demand
one). Quota is not capacity: the plan says "quota permits N chips", never
that the chips are there (a stockout at create time moves that slice to the
next option: ``plays/nodepools.py``). A check that cannot look leaves its
option possible, never proven. A slice whose pool exists keeps it, with the
capacity GKE shows for it (its config, and our label); the quota our own
pools hold is not counted twice.

The plan is a derived fact (``plan_fact``): answered once per run, by the
capacity preflight before any change, and held, so every pool step acts on
the same plan. What the options are is ``capacity_options.py``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from playbooks.access.cli_clients import compute_describe, fact, gcloud, json_object
from playbooks.cloud import capacity_options as cap
from playbooks.cloud.gke import clusters_fact, nodepool_name, nodepools_list_fact
from playbooks.config.choices import capacity_option
from playbooks.config.schema import Environment, capacities, capacity_text, reservation_parts
from playbooks.config.tpu import chips, generation
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT, Fact

BROKEN = ("ERROR", "RUNNING_WITH_ERROR")  # a pool in these holds no usable slice: it is replaced

Look = Callable[[Fact], Any]
Quota = tuple[str, dict[str, str]]


# -- the facts the plan reads --------------------------------------------------------------
def quota_fact(env: Environment, quota: Quota) -> Fact:
    """A quota's values; a dry run assumes it permits what the inventory needs."""
    qid, dims = quota
    need = env.slices * chips(env.topology)
    assumed = {"quotaId": qid, "dimensionsInfos": [{"dimensions": {"region": env.region, **dims},
                                                    "details": {"value": str(need)}}]}
    return fact(f"quota {qid}",
                gcloud("beta", "quotas", "info", "describe", qid, "--service=compute.googleapis.com",
                       f"--project={env.project_id}", "--format=json"),
                json_object(), assumed=assumed,
                describe=lambda q: quota_summary(quota_value(q, env.region, dims), env.region))


def quota_summary(value: int | None, region: str) -> str:
    if value is None:
        return f"no value for {region}"
    return f"no limit in {region}" if value < 0 else f"{value} chips in {region}"


def quota_value(info: Any, region: str, dims: dict[str, str]) -> int | None:
    """The value in force for this region (and dimensions): the most
    specific entry that matches; None if none does. -1 means no limit."""
    best: tuple[int, int] | None = None
    for d in (info or {}).get("dimensionsInfos") or []:
        have = d.get("dimensions") or {}
        if have.get("region", region) != region:
            continue
        if any(have.get(k, v) != v for k, v in dims.items()):
            continue
        where = d.get("applicableLocations") or []
        if "region" not in have and where and region not in where and "global" not in where:
            continue
        try:
            value = int((d.get("details") or {}).get("value", 0))
        except (TypeError, ValueError):
            continue
        score = len(have)
        if best is None or score > best[0]:
            best = (score, value)
    return None if best is None else best[1]


def quotas(env: Environment) -> list[Quota]:
    """The quotas the list's options consume, each once."""
    out: list[Quota] = []
    for o in capacities(env):
        out += [q for q in cap.quotas(env, o) if q not in out]
    return out


def reservation_fact(env: Environment) -> Fact:
    owner, name = reservation_parts(env)
    return fact(f"reservation {name}",
                gcloud("compute", "reservations", "describe", name, f"--zone={env.zone}", "--format=json",
                       project=owner),
                compute_describe("reservation"), assumed={"name": name, "status": "READY", "specificReservation": {
                    "count": str(env.slices * env.hosts_per_slice), "inUseCount": "0",
                    "instanceProperties": {"machineType": env.machine_type}}},
                describe=lambda r: f"{r.get('status')}, {free_hosts(r)} of "
                                   f"{(r.get('specificReservation') or {}).get('count', '?')} free")


def free_hosts(r: Any) -> int:
    spec = (r or {}).get("specificReservation") or {}
    try:
        return int(spec.get("count") or 0) - int(spec.get("inUseCount") or 0)
    except (TypeError, ValueError):
        return 0


def reservation_machine_type(r: Any) -> str:
    spec = (r or {}).get("specificReservation") or {}
    return str((spec.get("instanceProperties") or {}).get("machineType", "")).rsplit("/", 1)[-1]


def reservation_problem(env: Environment, r: Any) -> str | None:
    """Why the inventory's reservation cannot hold any slice (None: it can,
    as many as its free hosts)."""
    owner, name = reservation_parts(env)
    if r is ABSENT:
        return (f"no reservation {name} in zone {env.zone} of project {owner}: check its name, zone and project (a "
                f"shared one is projects/OWNER/reservations/NAME)")
    if r.get("status") != "READY":
        return f"reservation {name} is {r.get('status')}, not READY"
    mt = reservation_machine_type(r)
    if mt != env.machine_type:
        return f"reservation {name} holds {mt or 'no'} machines, this inventory needs {env.machine_type}"
    return None


# -- the plan --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Offer:
    """What one option can take of the slices that have no pool yet, alone
    (options that share a quota each show all of it)."""

    option: str
    words: str            # "spot", "reservation zeta-resv"
    slices: int | None    # whole slices; None: its check could not look (possible, never proven)
    why: str              # "4 of 4 hosts free", "quota ... permits 64 chips", "could not look ..."

    def text(self) -> str:
        n = "? (not checked)" if self.slices is None else str(self.slices)
        return f"{self.words} {n} ({self.why})"


@dataclass(frozen=True)
class Slot:
    """One slice: the option that makes (or made) its pool, and why."""

    index: int
    pool: str
    option: str | None    # None: no option of the list can take it
    words: str
    why: str
    proven: bool = True
    exists: bool = False  # its pool is there (the plan keeps it)

    def line(self) -> str:
        return f"{self.pool}: {self.words} ({self.why})"


@dataclass(frozen=True)
class Plan:
    slots: tuple[Slot, ...]
    offers: tuple[Offer, ...]
    options: tuple[str, ...]
    chips_per_slice: int

    def option(self, i: int) -> str | None:
        return self.slots[i].option

    def lines(self) -> list[str]:
        return [s.line() for s in self.slots]

    @property
    def missing(self) -> list[Slot]:
        return [s for s in self.slots if s.option is None]

    @property
    def unproven(self) -> list[Slot]:
        return [s for s in self.slots if s.option is not None and not s.proven]

    def offer(self, option: str) -> Offer | None:
        return next((o for o in self.offers if o.option == option), None)

    def proven_empty(self, option: str) -> bool:
        """The preflight proved this option can take no slice (its quota, its
        free hosts): a failed create does not move there."""
        o = self.offer(option)
        return o is not None and o.slices == 0

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for s in self.slots:
            counts[s.words if s.option else "missing"] = counts.get(s.words if s.option else "missing", 0) + 1
        return f"{len(self.slots)} slice(s): " + ", ".join(f"{n} {w}" for w, n in counts.items())

    def shortfall(self, env: Environment) -> str | None:
        """One line when the options cannot make every slice: what each can
        take and what is missing (before any create)."""
        gone = self.missing
        if not gone:
            return None
        alt = [c for c in generation(env).capacity_options if c not in self.options]
        fixes = []
        if any(cap.quotas(env, o) for o in self.options):
            fixes.append("request quota (IAM & Admin > Quotas)")
        if any(capacity_option(o).reserved for o in self.options):
            fixes.append("free hosts of the reservation")
        if alt:
            fixes.append(f"add an option to capacity: ({', '.join(alt)})")
        if env.slices > 1:
            fixes.append("or set slices: lower")
        return (f"the capacity options cannot make every slice: {'; '.join(o.text() for o in self.offers)}; "
                f"missing {len(gone)} of {len(self.slots)} slices ({len(gone) * self.chips_per_slice} chips, "
                f"{self.chips_per_slice} per slice): {', '.join(fixes)}")


class _Quota:
    """A quota's chips left for new slices: its value less what this
    cluster's pools already hold of it; None when it could not be read."""

    def __init__(self, label: str, value: int | None, used: int, why: str):
        self.label, self.value, self.used, self.why = label, value, used, why
        self.left: float | None = None if value is None else float("inf") if value < 0 else value - used

    def permits(self) -> str:
        if self.value is None:
            return self.why
        held = f", {self.used} of them held by this cluster's pools" if self.used else ""
        return f"quota {self.label} permits {'no limit' if self.value < 0 else f'{self.value} chips'}{held}"

    def fits(self, n: int) -> bool:
        return self.left is None or self.left >= n


def make(env: Environment, look: Look) -> Plan:
    """The plan, from the facts: the cluster's pools, the quotas and the
    reservation of the list's options: each slice its pool if it has one,
    else the first option with room (``Planner``)."""
    return Planner(env, look).plan()


class Planner:
    """The room each option has (its quota's chips left, the reservation's
    free hosts), spent slice by slice in the list's order."""

    def __init__(self, env: Environment, look: Look):
        self.env, self.look = env, look
        self.opts = capacities(env)
        self.per = chips(env.topology)
        self.kept = self.kept_pools()
        self.left = self.quotas_left()
        self.res_free, self.res_why = self.reservation_room()

    def plan(self) -> Plan:
        offers = tuple(self.offer(o) for o in self.opts)  # what each option offers, before any slice takes room
        slots = tuple(self.slot(i) for i in range(self.env.slices))
        return Plan(slots, offers, self.opts, self.per)

    def kept_pools(self) -> dict[int, Any]:
        """The slices whose pool exists and is not broken."""
        env, pools = self.env, {}
        if self.look(clusters_fact(env)) is not ABSENT:
            pools = {p.get("name"): p for p in self.look(nodepools_list_fact(env))}
        return {i: pools[nodepool_name(env, i)] for i in range(env.slices)
                if nodepool_name(env, i) in pools and pools[nodepool_name(env, i)].get("status") not in BROKEN}

    def quotas_left(self) -> dict[str, _Quota]:
        env, out = self.env, {}
        for q in quotas(env):
            label = f"{cap.quota_label(q)} in {env.region}"
            used = sum(self.per for p in self.kept.values() if cap.quotas(env, cap.pool_option(p))[:1] == (q,))
            try:
                value = quota_value(self.look(quota_fact(env, q)), env.region, q[1])
                why = f"quota {label} has no value for {env.region}" if value is None else ""
            except ProbeFailed as e:  # the quota step says the whole of it
                value, why = None, f"quota {label}: {_short(e.why)}"
            out[q[0]] = _Quota(label, value, used, why)
        return out

    def reservation_room(self) -> tuple[int | None, str]:
        """Whole slices the reservation has free (None: could not look), and why."""
        if not any(capacity_option(o).reserved for o in self.opts):
            return 0, ""
        try:
            r = self.look(reservation_fact(self.env))
        except ProbeFailed as e:  # the reservation step says the whole of it
            return None, f"reservation: {_short(e.why)}"
        problem = reservation_problem(self.env, r)
        if problem:
            return 0, problem
        count = (r.get("specificReservation") or {}).get("count", "?")
        return free_hosts(r) // self.env.hosts_per_slice, f"{free_hosts(r)} of {count} hosts free"

    def quotas_of(self, option: str) -> list[_Quota]:
        return [self.left[x[0]] for x in cap.quotas(self.env, option)]

    def offer(self, o: str) -> Offer:
        env = self.env
        if capacity_option(o).reserved:
            return Offer(o, cap.words(env, o), self.res_free, self.res_why)
        qs = self.quotas_of(o)
        if any(x.left is None for x in qs):
            return Offer(o, o, None, "; ".join(x.why for x in qs if x.left is None))
        n = min(env.slices, sum(max(0, int(min(x.left or 0, env.slices * self.per))) // self.per for x in qs))
        return Offer(o, o, n, ", else ".join(x.permits() for x in qs))

    def slot(self, i: int) -> Slot:
        """Slice i: its pool, or the first option with room left (taking it)."""
        env, name = self.env, nodepool_name(self.env, i)
        if i in self.kept:
            p = self.kept[i]
            why = f"its pool, {p.get('status')}" + ("" if cap.as_asked(env, p) else
                                                    f"; not in capacity {capacity_text(env)}")
            return Slot(i, name, cap.pool_option(p), cap.pool_capacity(p), why, exists=True)
        for o in self.opts:
            slot = self.take_reservation(i, name) if capacity_option(o).reserved else self.take_quota(i, name, o)
            if slot is not None:
                return slot
        return Slot(i, name, None, "none", f"no option of capacity {capacity_text(env)} can take it")

    def take_reservation(self, i: int, name: str) -> Slot | None:
        if self.res_free is not None and self.res_free <= 0:
            return None
        self.res_free = None if self.res_free is None else self.res_free - 1
        return Slot(i, name, "reservation", cap.words(self.env, "reservation"),
                    f"not checked: {self.res_why}" if self.res_free is None else self.res_why,
                    proven=self.res_free is not None)

    def take_quota(self, i: int, name: str, o: str) -> Slot | None:
        fit = next((x for x in self.quotas_of(o) if x.fits(self.per)), None)
        if fit is None:
            return None
        if fit.left is not None:
            fit.left -= self.per
        return Slot(i, name, o, o, f"not checked: {fit.why}" if fit.left is None else fit.permits(),
                    proven=fit.left is not None)


def _short(text: str, most: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= most else text[:most - 3] + "..."


def plan_fact(env: Environment) -> Fact:
    """The plan, derived once per run from the facts above and held (see
    ``Fact``): the preflight's plan step makes it, the pool steps act on it."""
    return Fact(name="capacity plan", display=f"capacity plan: {env.slices} slice(s) from {capacity_text(env)}",
                derive=lambda look: make(env, look), describe=lambda p: p.summary())
