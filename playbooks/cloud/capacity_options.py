"""Getting the TPUs: the capacity options (on-demand, Spot, a reservation,
flex-start) as node pool flags, our node label and the workers' affinity,
the quotas each consumes, and what a failed pool's conditions say (no
capacity, no quota, or something else). The plan per slice is
``capacity_plan.py``; the read-only preflight that shows it is
``plays/capacity.py``.

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

from playbooks.config import tutorial as T
from playbooks.config.choices import capacity_option
from playbooks.config.choices import options as options_of
from playbooks.config.schema import FLEX_WAIT_DEFAULT, Environment, capacities
from playbooks.config.tpu import dcn_networks, generation

# A node label of ours on every TPU pool we make, naming its capacity option:
# the workers select it (worker_affinity), and a re-run and `status` read a
# pool's option back from GKE (with the pool's own config: pool_capacity).
LABEL = "tpu-playbooks/capacity"


# -- the options -------------------------------------------------------------------
def pool_flags(env: Environment, option: str) -> list[str]:
    """What `gcloud container node-pools create` adds for the capacity."""
    return [f.format(reservation=env.get("reservation"), hosts=env.hosts_per_slice)
            for f in capacity_option(option).pool_flags]


def node_labels(env: Environment, option: str) -> str:
    """The pool's --node-labels: the tutorial's DRANET label (where its
    nodes get the two DCN networks: tpu.dcn_networks) and ours."""
    return (f"{T.TPU_NODE_LABEL}," if dcn_networks(env) else "") + f"{LABEL}={option}"


def initial_nodes(env: Environment, option: str) -> int:
    """A flex-start pool starts empty; the others with one slice's hosts."""
    return 0 if capacity_option(option).starts_empty else env.hosts_per_slice


def worker_affinity(env: Environment) -> dict[str, Any]:
    """What the TPU workers require of a node, on Standard, besides the
    tutorial's nodeSelector: our capacity label, In every option of the
    list, so each slice's workers land on its pool whichever option made it
    (the plan's, or the one a failed create moved to).

    One worker group for all the slices, not one per capacity: the GKE TPU
    webhook gives each pod MEGASCALE_SLICE_ID = its replica index within its
    worker group and MEGASCALE_COORDINATOR_ADDRESS = that group's replica 0
    (ai-on-gke/kuberay-tpu-webhook main.go, at ef658db: "Set
    MEGASCALE_SLICE_ID, the index of this replica within the worker group";
    the coordinator "<group>-0-0"), so two groups would both number their
    slices from 0 with two coordinators: not one multislice job. And one
    group keeps `replicas: slices` fixed however the slices were got, so a
    fallback at create time needs no new manifest. A nodeSelector cannot
    say "spot or on-demand" (GKE labels Spot nodes, not on-demand ones);
    a nodeAffinity `In` over our label can. (On Autopilot the ComputeClass's
    priorities carry the same list: manifests.priorities.)"""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": LABEL, "operator": "In", "values": list(capacities(env))}]}]}}}


def wait_seconds(env: Environment) -> float | None:
    """How long the slices' nodes may take to come: flex-start waits for
    capacity by design (capacity_wait); the others do not say."""
    if any(o.waits_for_capacity for o in options_of(env)):
        return float(env.capacity_wait or FLEX_WAIT_DEFAULT)
    return None


def words(env: Environment, option: str) -> str:
    """An option in the inventory's words: a reservation with its name."""
    return f"reservation {env.reservation}" if capacity_option(option).reserved else option


def pool_capacity(p: Any) -> str:
    """The capacity a node pool has, read from its own config, in the
    inventory's words."""
    cfg = (p or {}).get("config") or {}
    if cfg.get("flexStart"):
        return "flex-start"
    if cfg.get("spot") or cfg.get("preemptible"):
        return "spot"
    aff = cfg.get("reservationAffinity") or {}
    if aff.get("consumeReservationType") == "SPECIFIC_RESERVATION":
        return f"reservation {','.join(aff.get('values') or []) or '?'}"
    return "on-demand"


def pool_option(p: Any) -> str:
    """The option of a node pool (its config's, without a reservation's name)."""
    return pool_capacity(p).split(" ", 1)[0]


def as_asked(env: Environment, p: Any) -> bool:
    """A pool whose capacity is any member of the list is as asked (a
    reservation: the inventory's)."""
    return pool_capacity(p) in {words(env, o) for o in capacities(env)}


def after(env: Environment, option: str) -> list[str]:
    """The options of the list after ``option``: where a failed create goes."""
    opts = list(capacities(env))
    return opts[opts.index(option) + 1:] if option in opts else []


def preemptible(env: Environment) -> list[str]:
    """The options of the list whose slices can be taken back (Spot, flex-start)."""
    return [o.name for o in options_of(env) if o.preemptible]


# Cloud Quotas ids of the Compute Engine quotas GKE's TPU nodes consume (not
# the Cloud TPU API's), each generation's in its record (config/tpu.py): for
# v6e, on-demand chips are TPUS_PER_TPU_FAMILY with tpu_family CT6E (named
# in Google's v6e guide); Spot, and flex-start first, the preemptible quota
# ("When you create a Flex-start VM, preemptible quota is consumed. If your
# project lacks preemptible quota, then standard quota is consumed"). The
# ids follow Cloud Quotas' naming; an id the API does not know is "not
# checked", never a shortage. A reservation's pools consume none (GKE's TPU
# docs).
Quota = tuple[str, dict[str, str]]


def quotas(env: Environment, option: str) -> tuple[Quota, ...]:
    """The quotas a pool of ``option`` consumes, in the order it tries them."""
    gen = generation(env)
    return tuple((q[0], dict(q[1])) for q in (getattr(gen, kind) for kind in capacity_option(option).quotas))


def quota_label(quota: tuple[str, dict[str, str]]) -> str:
    qid, dims = quota
    return qid.split("-per-")[0] + (f" ({', '.join(dims.values())})" if dims else "")


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
    alt = [c for c in generation(env).capacity_options if c not in capacities(env)]
    if alt:
        out.append(f"or another capacity option: ({', '.join(alt)})")
    return "; ".join(out)


def explain(env: Environment, text: str, zones: list[str] | None = None) -> str:
    """One line: the class, GKE's message, the options."""
    kind = classify(text)
    head = {"capacity": "no TPU capacity", "quota": "not enough quota", "other": "the pool failed"}[kind]
    message = " ".join(text.split()).rstrip(".")
    if len(message) > 300:
        message = message[:297] + "..."
    return f"{head}: {message}. Options: {options(env, kind, zones)}"
