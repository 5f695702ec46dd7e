"""Getting the TPUs: the capacity options (on-demand, Spot, a reservation,
flex-start) as node pool flags and pod node selectors, and what a failed
pool's conditions say (no capacity, no quota, or something else). The
read-only preflight that checks them is ``plays/capacity.py``.

Sources, for what each option needs:
- Spot: `--spot`; GKE labels Spot nodes `cloud.google.com/gke-spot=true`
  (https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms,
  .../concepts/cluster-autoscaler).
- A specific reservation: `--reservation-affinity=specific --reservation=R`,
  R a name or projects/P/reservations/NAME for a shared one (gcloud 528
  command_lib/container/flags.py; api_adapter turns it into
  SPECIFIC_RESERVATION with key compute.googleapis.com/reservation-name).
  A pool that consumes a reservation needs no TPU quota
  (https://cloud.google.com/kubernetes-engine/docs/troubleshooting/tpus).
- Flex-start for a multi-host slice: `--flex-start`, autoscaling from 0 to
  one slice's hosts (`--enable-autoscaling --num-nodes=0 --min-nodes=0
  --max-nodes=<hosts>`), `--reservation-affinity=none` (flex-start consumes
  no reservation), `--location-policy=ANY` and `--no-enable-autorepair`
  (GKE's flex-start TPU guide,
  https://cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training-tpu;
  the same flags as xpk's TPU flex-start pools, src/xpk/core/capacity.py).
  Without queued provisioning: xpk uses none for TPU slices, and it would
  need Kueue. Its nodes are labelled `cloud.google.com/gke-flex-start=true`;
  flex-start consumes preemptible quota, else on-demand quota.
"""
from __future__ import annotations

import re
from typing import Any

from .schema import FLEX_WAIT_DEFAULT, Environment


# -- the options -------------------------------------------------------------------
def pool_flags(env: Environment) -> list[str]:
    """What `gcloud container node-pools create` adds for the capacity."""
    if env.capacity == "spot":
        return ["--spot"]
    if env.capacity == "reservation":
        return ["--reservation-affinity=specific", f"--reservation={env.reservation}"]
    if env.capacity == "flex-start":
        return ["--flex-start", "--enable-autoscaling", "--min-nodes=0", f"--max-nodes={env.hosts_per_slice}",
                "--location-policy=ANY", "--reservation-affinity=none", "--no-enable-autorepair"]
    return []


def initial_nodes(env: Environment) -> int:
    """A flex-start pool starts empty; the others with one slice's hosts."""
    return 0 if env.capacity == "flex-start" else env.hosts_per_slice


def node_selector(env: Environment) -> dict[str, str]:
    """What the TPU workers add to their nodeSelector, on Standard, to land on
    nodes of this capacity (GKE's node labels); a reservation's pools are the
    only ones of their shape here, so nothing is added for it. (On Autopilot
    the ComputeClass's priorities carry the capacity: autopilot.priorities.)"""
    if env.capacity == "spot":
        return {"cloud.google.com/gke-spot": "true"}
    if env.capacity == "flex-start":
        return {"cloud.google.com/gke-flex-start": "true"}
    return {}


def wait_seconds(env: Environment) -> float | None:
    """How long the slices' nodes may take to come: flex-start waits for
    capacity by design (capacity_wait); the others do not say."""
    if env.get("capacity") == "flex-start":
        return float(env.capacity_wait or FLEX_WAIT_DEFAULT)
    return None


def pool_capacity(p: Any) -> str:
    """The capacity a node pool has, in the inventory's words."""
    cfg = (p or {}).get("config") or {}
    if cfg.get("flexStart"):
        return "flex-start"
    if cfg.get("spot") or cfg.get("preemptible"):
        return "spot"
    aff = cfg.get("reservationAffinity") or {}
    if aff.get("consumeReservationType") == "SPECIFIC_RESERVATION":
        return f"reservation {','.join(aff.get('values') or []) or '?'}"
    return "on-demand"


def wanted_capacity(env: Environment) -> str:
    return f"reservation {env.reservation}" if env.capacity == "reservation" else env.capacity


def preemptible(env: Environment) -> bool:
    return env.get("capacity") in ("spot", "flex-start")


# -- why a pool has no nodes -----------------------------------------------------------
_NO_CAPACITY = re.compile(r"(GCE_STOCKOUT|ZONE_RESOURCE_POOL_EXHAUSTED\w*|does not have enough resources|"
                          r"lack of capacity|Requested resource is exhausted|resource_availability|STOCKOUT|"
                          r"is currently unavailable in the)", re.I)
_NO_QUOTA = re.compile(r"(GCE_QUOTA_EXCEEDED|Quota '[^']+' exceeded|Insufficient (regional )?quota|"
                       r"QUOTA_EXCEEDED|quotaExceeded)", re.I)


def pool_problem(p: Any) -> str:
    """What GKE says is wrong with a pool: its conditions (code, message),
    else its status message."""
    parts = []
    for c in (p or {}).get("conditions") or []:
        code, message = c.get("code") or c.get("canonicalCode") or "", c.get("message") or ""
        parts.append(message if message.startswith(code) else f"{code}: {message}".strip(": "))
    return "; ".join(parts) or (p or {}).get("statusMessage") or "no message"


def classify(text: str) -> str:
    """"quota", "capacity" or "other", from GKE's or Compute Engine's words."""
    if _NO_QUOTA.search(text):
        return "quota"
    if _NO_CAPACITY.search(text):
        return "capacity"
    return "other"


def options(env: Environment, kind: str, zones: list[str] | None) -> str:
    """What to do about a pool without nodes."""
    out = ["re-run (`invoke nodepools`) to replace the broken pool"]
    others = [z for z in zones or [] if z != env.zone and z.startswith(env.region + "-")]
    if kind == "capacity" and others:
        out.append(f"or set zone: to one of {', '.join(others)} (they offer {env.machine_type})")
    if kind == "quota":
        out.append("or request the quota (IAM & Admin > Quotas)")
    alt = [c for c in ("spot", "flex-start", "reservation") if c != env.capacity]
    out.append(f"or another capacity: ({', '.join(alt)})")
    return "; ".join(out)


def explain(env: Environment, text: str, zones: list[str] | None = None) -> str:
    """One line: the class, GKE's message, the options."""
    kind = classify(text)
    head = {"capacity": "no TPU capacity", "quota": "not enough quota", "other": "the pool failed"}[kind]
    message = " ".join(text.split()).rstrip(".")
    if len(message) > 300:
        message = message[:297] + "..."
    return f"{head}: {message}. Options: {options(env, kind, zones)}"
