"""What the cluster costs by the hour besides its TPU slices, and the one
line that sums a plan's parts (`invoke capacity`), each part named, each
reason a part has no price said once with how to get one.

- The CPU pool (Standard's ``default-pool``): the tutorial's ``clusters
  create --machine-type=n1-standard-16`` without ``--num-nodes``, so
  gcloud's default, 3 nodes (``ClusterMode.cpu_pool_nodes``). Priced by the
  inventory's ``prices.default-pool`` (USD per node-hour), else by the
  Cloud Billing Catalog's N1 SKUs in the region (``prices.py``: USD per
  vCPU-hour and per GiB-hour of RAM) x the machine type's vCPUs and memory
  (N1 predefined: 3.75 GB of memory a vCPU standard, 6.5 highmem, 0.9
  highcpu: https://cloud.google.com/compute/docs/general-purpose-machines#n1_machines;
  Compute Engine's GB here are GiB: n1-standard-16's ``memoryMb`` is
  61440). That is the list price: N1 earns sustained-use discounts of up
  to 30% for a month's use (https://cloud.google.com/compute/docs/sustained-use-discounts),
  so the bill's rate is at most it.
- The cluster management fee: $0.10 per cluster per hour, Standard and
  Autopilot alike ("A flat cluster management fee of $0.10 per cluster per
  hour ... applies to all GKE clusters irrespective of the mode of
  operation", https://cloud.google.com/kubernetes-engine/pricing), unless
  ``prices.cluster-fee`` says otherwise. Its free tier, $74.40 of monthly
  credits per billing account for zonal and Autopilot clusters (one such
  cluster for a month), is the billing account's, which nothing here can
  see: the line says so, and ``prices.cluster-fee: 0`` where it covers
  this cluster.
- Not priced here, and said so: each node's boot disk, the bucket's
  storage and network traffic (billed by size and use); on Autopilot the
  pods' CPU and memory requests (the Ray head's: Autopilot bills them).

Pure: the catalog comes in (a dry run has none: ``prices.DRY_RUN``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from playbooks.cloud import prices
from playbooks.config import tutorial as T
from playbooks.config.schema import CLUSTER_FEE, DEFAULT_POOL, Environment

FEE = 0.10  # USD per cluster-hour (the module says where from)
PRICING = "https://cloud.google.com/kubernetes-engine/pricing"
FREE_TIER = ("its free tier's $74.40 a month per billing account covers one zonal or Autopilot cluster: set "
             "prices.cluster-fee: 0 where it covers this one")
SUSTAINED = "a list price: N1's sustained-use discounts take up to 30% off a month's use"
# GB of memory per vCPU of each N1 predefined kind (the module says where from).
N1_MEMORY = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}
NOT_COUNTED = "each node's boot disk, the bucket's storage and network traffic (billed by size and use)"
AUTOPILOT_PODS = "the pods' CPU and memory requests, the Ray head's among them (Autopilot bills them)"


@dataclass(frozen=True)
class Rate:
    """USD per ``unit`` (a chip-hour, a node-hour, an hour) or None:
    ``source`` how it was priced; else ``why`` not, and ``key`` the
    inventory's ``prices:`` key that gives one where ``why`` does not say it."""

    usd: float | None
    unit: str
    source: str = ""
    why: str = ""
    key: str = ""

    def text(self) -> str:
        if self.usd is None:
            return f"no price ({self.why}: {prices.how([self.key], self.why)})" if self.key else \
                f"no price ({self.why})"
        return f"${self.usd:.4g}/{self.unit} ({self.source})"


def tpu_rate(p: prices.Price) -> Rate:
    """A TPU option's price per chip-hour as a rate."""
    return Rate(p.per_chip_hour, "chip-hour", p.source, p.why, p.key)


@dataclass(frozen=True)
class Charge:
    """One part of the bill by the hour: ``count`` ``noun`` (16 chips, 3
    nodes; "" for the fee) at its rate."""

    name: str        # "v6e-16-0", "default-pool", "cluster fee"
    what: str        # "on-demand", "n1-standard-16", "cluster maxtext-multislice"
    count: int
    noun: str        # "chips", "nodes", ""
    rate: Rate

    @property
    def per_hour(self) -> float | None:
        return None if self.rate.usd is None else self.rate.usd * self.count

    def line(self) -> str:
        if self.per_hour is None:
            return f"{self.name}: {self.what}: {f'{self.count} {self.noun}, ' if self.noun else ''}no price"
        times = f"{self.count} {self.noun} x ${self.rate.usd:.4g}/{self.rate.unit} = " if self.noun else ""
        return f"{self.name}: {self.what}: {times}${self.per_hour:,.2f}/h ({self.rate.source})"


# -- the CPU pool and the fee ------------------------------------------------------------------
def n1_shape(machine_type: str) -> tuple[int, float] | None:
    """(vCPUs, GiB of memory) of an N1 predefined machine type, or None."""
    m = re.fullmatch(r"n1-(standard|highmem|highcpu)-(\d+)", machine_type)
    return None if m is None else (int(m.group(2)), N1_MEMORY[m.group(1)] * int(m.group(2)))


def node_rate(env: Environment, machine_type: str, catalog: prices.Catalog | str | None) -> Rate:
    """USD per node-hour of a CPU node: the inventory's ``prices.default-pool``,
    else its vCPUs and memory at the catalog's N1 prices in the region."""
    given = (env.get("prices") or {}).get(DEFAULT_POOL)
    if given is not None:
        return Rate(float(given), "node-hour", "inventory prices:")
    shape = n1_shape(machine_type)
    if shape is None:
        return Rate(None, "node-hour", why=f"{machine_type} is not an N1 predefined machine type, the CPU SKUs read "
                                           f"here", key=DEFAULT_POOL)
    if not isinstance(catalog, prices.Catalog):
        return Rate(None, "node-hour", why=catalog or "the catalog was not read", key=DEFAULT_POOL)
    core, ram = (catalog.rates.get(p, {}).get(env.region) for p in (prices.N1_CORE, prices.N1_RAM))
    if core is None or ram is None:
        part = prices.N1_CORE if core is None else prices.N1_RAM
        two = catalog.unpriced.get(part, {}).get(env.region)
        why = f"lists {two}" if two else f"has no {part} SKU in {env.region}"
        return Rate(None, "node-hour", why=f"the Cloud Billing Catalog ({catalog.date}) {why}", key=DEFAULT_POOL)
    vcpus, gib = shape
    return Rate(vcpus * core + gib * ram, "node-hour",
                f"{vcpus} vCPU x ${core:.4g} + {gib:g} GiB x ${ram:.4g}: Cloud Billing Catalog {catalog.date}; "
                f"{SUSTAINED}")


def fee_rate(env: Environment) -> Rate:
    """USD per hour of the cluster management fee."""
    given = (env.get("prices") or {}).get(CLUSTER_FEE)
    if given is not None:
        return Rate(float(given), "hour", "inventory prices:")
    return Rate(FEE, "hour", f"GKE's list price, {PRICING}; {FREE_TIER}")


def cluster_charges(env: Environment, catalog: prices.Catalog | str | None) -> list[Charge]:
    """The cluster's parts besides the TPU slices, as `up` makes them: its
    CPU pool (Standard) and the fee."""
    nodes = env.cluster_mode.cpu_pool_nodes
    pool = [Charge(DEFAULT_POOL, T.CLUSTER_MACHINE_TYPE, nodes, "nodes",
                   node_rate(env, T.CLUSTER_MACHINE_TYPE, catalog))] if nodes else []
    return [*pool, Charge("cluster fee", f"cluster {env.cluster_name}", 1, "", fee_rate(env))]


# -- the plan's line --------------------------------------------------------------------------------
def missing(unpriced: list[Charge]) -> str:
    """Each reason once: the parts it leaves without a price, and how to
    get one (the keys of ``prices:``; in a dry run, a run that reads the catalog)."""
    groups: dict[str, list[Charge]] = {}
    for c in unpriced:
        groups.setdefault(c.rate.why, []).append(c)
    out = []
    for why, cs in groups.items():
        keys = list(dict.fromkeys(c.rate.key for c in cs if c.rate.key))
        out.append(f"no price for {', '.join(c.name for c in cs)} ({why})" + (f": {prices.how(keys, why)}" if keys
                                                                              else ""))
    return "; ".join(out)


def summary(charges: list[Charge], pods_by_request: bool) -> tuple[str, list[str]]:
    """The plan's hourly cost, its parts named (the TPU slices together),
    and one line per part; what is not counted, in a line of its own
    (``pods_by_request``: a cluster with no CPU pool of ours, Autopilot,
    bills the pods' requests)."""
    priced = [c for c in charges if c.per_hour is not None]
    tpu = [c for c in charges if c.rate.unit == "chip-hour"]
    tpu_priced = [c for c in tpu if c.per_hour is not None]
    parts = []
    if tpu_priced:
        k = f"{len(tpu_priced)}" if len(tpu_priced) == len(tpu) else f"{len(tpu_priced)} of {len(tpu)}"
        parts.append(f"{k} TPU slice(s) ({sum(c.count for c in tpu_priced)} chips) "
                     f"${sum(c.per_hour or 0.0 for c in tpu_priced):,.2f}/h")
    parts += [f"{c.name} ${c.per_hour:,.2f}/h" for c in priced if c not in tpu]
    total = sum(c.per_hour or 0.0 for c in priced)
    unpriced = [c for c in charges if c.per_hour is None]
    if not unpriced:
        head = f"the plan costs ${total:,.2f}/h: {', '.join(parts)}"
    else:
        known = f"the plan costs at least ${total:,.2f}/h ({', '.join(parts)})" if parts else "the plan has no price"
        head = f"{known}; {missing(unpriced)}"
    left = f"{AUTOPILOT_PODS}, {NOT_COUNTED}" if pods_by_request else NOT_COUNTED
    return head, [c.line() for c in charges] + [f"not counted: {left}: not priced here"]
