"""What the environment costs while it stands, jobs or no jobs: GKE bills a
node from its creation until its deletion, and the cluster's management fee
from the cluster's creation until its deletion, whatever the jobs do. The
idle night after a job ended is paid: `invoke status` and `invoke runs`
say what the environment costs by the hour as it stands and what it has
cost since `up`, each part priced or named as unpriced with the reason.

The parts, from what exists (read, never assumed):

- each TPU node pool (its machine type a TPU one): its nodes x chips per
  node x the chip-hour price of the pool's capacity option (its config:
  ``capacity_options.pool_option``), priced by ``prices.py`` as a run is;
- every other node pool (the cluster's ``default-pool``: the tutorial's
  ``clusters create --machine-type=n1-standard-16`` without ``--num-nodes``,
  3 nodes): its nodes x a node-hour of its machine type, priced as
  `capacity` prices the plan's (``cluster_prices.node_rate``: the
  inventory's ``prices.default-pool``, else the cached catalog's N1 vCPU
  and RAM prices, a list price before sustained-use discounts);
- the cluster management fee: ``prices.cluster-fee``, else GKE's list
  price, $0.10 an hour (``cluster_prices.fee_rate``; the line names the
  free tier, which the billing account's credits decide).

Since `up`: the cluster's ``createTime`` (GKE's Cluster resource, RFC 3339;
a NodePool has no creation time) for the fee, and each node's
``metadata.creationTimestamp`` (Kubernetes registers a node a minute or so
after its VM starts) for the nodes. Nodes deleted since (a Spot node
preempted, a pool resized or made again) are gone from the list: the
figure is a lower bound, and says so.

Pure but for ``facts`` (the reads) and ``read`` (the looks, every failure a
value: a price never stops a report)."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from playbooks.access.cli_clients import NO_ACCOUNT_WORDS, fact, json_object
from playbooks.cloud import capacity_options, cluster_prices, prices
from playbooks.cloud import pods as P
from playbooks.cloud.gke import clusters_fact, objects_command, seconds
from playbooks.config.schema import DEFAULT_POOL, Environment
from playbooks.config.tpu import of_machine_type
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT, Completed, Fact

POOL_LABEL = P.NODEPOOL_LABEL
LOWER_BOUND = ("from each node's creation as it exists now: nodes deleted since (a Spot node preempted, a pool "
               "made again) are not counted, so it is a lower bound")


@dataclass(frozen=True)
class Part:
    """One thing the environment pays for by the hour."""

    name: str                   # "v6e-16-0", "default-pool", "cluster fee"
    what: str                   # "4 nodes x 4 chips, spot", "3 nodes x n1-standard-16"
    unit_rate: float | None     # USD per node-hour (a pool) or per hour (the fee); None: no price
    units: int                  # nodes now (1 for the fee)
    price: str                  # "$1.403/chip-hour (Cloud Billing Catalog 2026-12-04)" or "no price (why)"
    unit_hours: float | None = None  # node-hours (cluster-hours) since each began; None: unknown
    unknown_since: str = ""     # why the hours since `up` are unknown

    @property
    def per_hour(self) -> float | None:
        return None if self.unit_rate is None else self.unit_rate * self.units

    @property
    def since_up(self) -> float | None:
        if self.unit_rate is None or self.unit_hours is None:
            return None
        return self.unit_rate * self.unit_hours

    def doc(self) -> dict[str, Any]:
        return {"part": self.name, "what": self.what, "units": self.units, "unit_rate": self.unit_rate,
                "per_hour": self.per_hour, "unit_hours": None if self.unit_hours is None else round(self.unit_hours, 4),
                "since_up": None if self.since_up is None else round(self.since_up, 2), "price": self.price,
                **({"unknown_since": self.unknown_since} if self.unknown_since else {})}


@dataclass
class EnvCost:
    """The environment's parts, or why they could not be read (``unknown``)."""

    parts: list[Part] = field(default_factory=list)
    up_since: float | None = None   # the cluster's createTime
    now: float = 0.0
    unknown: str = ""
    absent: str = ""                # nothing is billed: why ("no cluster", "a local cluster")

    @property
    def hourly(self) -> float:
        return sum(p.per_hour for p in self.parts if p.per_hour is not None)

    @property
    def since_up(self) -> float:
        return sum(p.since_up for p in self.parts if p.since_up is not None)

    @property
    def unpriced(self) -> list[Part]:
        return [p for p in self.parts if p.per_hour is None]

    def doc(self) -> dict[str, Any]:
        if self.unknown or self.absent:
            return {"unknown": self.unknown} if self.unknown else {"absent": self.absent}
        return {"per_hour": round(self.hourly, 2), "since_up": round(self.since_up, 2), "up_since": self.up_since,
                "hours_up": None if self.up_since is None else round((self.now - self.up_since) / 3600, 2),
                "unpriced": [p.name for p in self.unpriced], "lower_bound": LOWER_BOUND,
                "parts": [p.doc() for p in self.parts]}


# -- reading what exists ----------------------------------------------------------------------------
def node_times(c: Completed) -> dict[str, list[float | None]]:
    """pool -> its nodes' creation times (seconds since the epoch; None
    where a node's is not a time), from the nodes of ``gke.objects_command``."""
    out: dict[str, list[float | None]] = {}
    for n in P.gke_nodes(json_object("nodes")(c)):
        md = n.get("metadata") or {}
        pool = (md.get("labels") or {}).get(POOL_LABEL)
        if pool:
            out.setdefault(pool, []).append(seconds(md.get("creationTimestamp")))
    return out


def nodes_fact(env: Environment) -> Fact:
    """Every node of a pool (the same command as status's TPU nodes: one call)."""
    return fact("nodes", objects_command(env), node_times, assumed={},
                describe=lambda d: ", ".join(f"{p} {len(ts)}" for p, ts in sorted(d.items())) or "none")


def facts(env: Environment) -> tuple[Fact, ...]:
    return (clusters_fact(env), nodes_fact(env))


def why_not(e: ProbeFailed) -> str:
    if NO_ACCOUNT_WORDS in f"{e.why} {e.stderr}":
        return "gcloud has no account"  # its fix is said once, by status's diagnosis and `invoke doctor`
    return e.why.removeprefix("could not look: ")


def read(env: Environment, look: Callable[[Fact], Any], now: float | None = None) -> EnvCost:
    """The environment's cost from the cluster (``clusters list``: its
    createTime and node pools), its nodes (kubectl) and the cached catalog
    (never a request: `invoke capacity` reads it); what cannot be read is
    said, never a stop."""
    now = time.time() if now is None else now
    if not env.platform.cloud:
        return EnvCost(now=now, absent="a local cluster on this machine's CPU: no cloud bill")
    cluster_probe, nodes_probe = facts(env)
    try:
        cluster = look(cluster_probe)
    except ProbeFailed as e:
        return EnvCost(now=now, unknown=f"the cluster could not be read: {why_not(e)}")
    if cluster is ABSENT:
        return EnvCost(now=now, absent=f"no cluster {env.cluster_name}: nothing of it is billed")
    nodes: dict[str, list[float | None]] | None
    why_nodes = ""
    try:
        nodes = look(nodes_probe)
    except ProbeFailed as e:
        nodes, why_nodes = None, why_not(e)
    catalog = prices.cached(env) if prices.needs_catalog(env, cpu=True) else None
    return priced(env, cluster, nodes, catalog, now, why_nodes)


# -- pricing it (pure) ----------------------------------------------------------------------------------
def _count(pool: dict) -> int:
    """A pool's nodes as configured (per zone x its zones)."""
    n = pool.get("initialNodeCount")
    n = n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0
    return n * max(1, len(pool.get("locations") or []))


def _hours(times: list[float | None], now: float) -> float | None:
    if any(t is None for t in times):
        return None
    return sum(max(0.0, now - t) for t in times if t is not None) / 3600


def _catalog_why(catalog: prices.Catalog | str | None) -> str | None:
    return None if catalog is not None else ("no Cloud Billing Catalog read in the last day (`invoke capacity` "
                                             "reads it; status and runs never send a request)")


def tpu_rate(env: Environment, pool: dict, chips: int,
             catalog: prices.Catalog | str | None) -> tuple[float | None, str]:
    """USD per node-hour of a TPU pool: its chips x its option's price."""
    option = capacity_options.pool_option(pool)
    p = prices.price(env, option, catalog if catalog is not None else _catalog_why(catalog))
    return (None if p.per_chip_hour is None else p.per_chip_hour * chips), f"{option} {p.text()}"


def priced(env: Environment, cluster: dict, nodes: dict[str, list[float | None]] | None,
           catalog: prices.Catalog | str | None, now: float, why_nodes: str = "") -> EnvCost:
    """Each part of the cluster, priced: its node pools (from ``nodes``, the
    nodes that exist; else each pool's configured count, and no hours since
    `up`), and the cluster fee."""
    up = seconds(cluster.get("createTime"))
    autopilot = bool((cluster.get("autopilot") or {}).get("enabled"))
    parts: list[Part] = []
    for pool in cluster.get("nodePools") or []:
        name = str(pool.get("name") or "?")
        mt = str((pool.get("config") or {}).get("machineType") or "?")
        if nodes is not None:
            times = nodes.get(name, [])
            count, hours, unknown = len(times), _hours(times, now), ""
            if hours is None:
                unknown = "a node's creationTimestamp is not a time"
        else:
            count, hours, unknown = _count(pool), None, f"its nodes could not be read: {why_nodes}"
        gen = of_machine_type(mt)
        if autopilot:
            rate, price = None, ("no price (Autopilot bills by what its pods ask, its ComputeClass choosing each "
                                 "node's option: not priced here)")
            what = f"{count} nodes x {mt}"
        elif gen is not None:
            chips = gen.machine_types[mt].chips
            rate, price = tpu_rate(env, pool, chips, catalog)
            what = f"{count} nodes x {chips} chips ({mt}), {capacity_options.pool_capacity(pool)}"
        elif name == DEFAULT_POOL:
            node = cluster_prices.node_rate(env, mt, catalog if catalog is not None else _catalog_why(catalog))
            rate, price = node.usd, node.text()
            what = f"{count} nodes x {mt}"
        else:
            rate, price = None, "no price (a node pool this project does not make)"
            what = f"{count} nodes x {mt}"
        if nodes is None:
            what += " (as configured)"
        parts.append(Part(name, what, rate, count, price, hours, unknown))
    fee = cluster_prices.fee_rate(env)
    parts.append(Part("cluster fee", f"cluster {env.cluster_name}", fee.usd, 1, fee.text(),
                      None if up is None else max(0.0, now - up) / 3600,
                      "" if up is not None else "the cluster's createTime is not a time"))
    return EnvCost(parts, up, now)


# -- how it reads --------------------------------------------------------------------------------------
def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def headline(c: EnvCost) -> str:
    """One line: the hourly cost as it stands, since `up`, what has no price."""
    if c.unknown:
        return f"environment cost: unknown: {c.unknown}"
    if c.absent:
        return f"environment cost: none: {c.absent}"
    un = c.unpriced
    without = f"; without {', '.join(p.name for p in un)}: no price" if un else ""
    partial = [p.name for p in c.parts if p.per_hour is not None and p.since_up is None]
    since = "since up: unknown (the cluster's createTime is not a time)" if c.up_since is None else (
        f"${c.since_up:,.2f} since up {_when(c.up_since)} ({(c.now - c.up_since) / 3600:.1f} h, at least"
        + (f"; without {', '.join(partial)}: hours unknown" if partial else "") + ")")
    return f"environment cost: ${c.hourly:,.2f}/h as it stands, {since}{without}"


def lines(c: EnvCost) -> list[str]:
    """The headline, then each part: its units, its hourly cost, since `up`."""
    out = [headline(c)]
    if c.unknown or c.absent:
        return out
    width = max(len(p.name) for p in c.parts)
    for p in c.parts:
        if p.per_hour is None:
            out.append(f"  {p.name:<{width}}  {p.what}: {p.price}")
            continue
        hourly = f"${p.per_hour:,.2f}/h"
        since = (f", ${p.since_up:,.2f} since up ({p.unit_hours:.1f} {'node' if p.name != 'cluster fee' else 'cluster'}"
                 f"-h)" if p.since_up is not None and p.unit_hours is not None else
                 f", since up unknown ({p.unknown_since})")
        out.append(f"  {p.name:<{width}}  {p.what}: {hourly}{since}; {p.price}")
    out.append(f"  since up: {LOWER_BOUND}")
    return out
