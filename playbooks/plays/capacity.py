"""Getting the TPUs: the capacity options (on-demand, Spot, a reservation,
flex-start) as node pool flags and pod node selectors, a read-only capacity
preflight before anything is created, and what a failed pool's conditions
say (no capacity, no quota, or something else).

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

import dataclasses
import json
import re
from typing import Any

from ..clients import fact, gcloud, json_list, json_object
from ..core.errors import ProbeFailed
from ..core.facts import ABSENT, Completed, Fact
from ..core.play import Outcome, StepContext
from ..core.recap import FAILED, OK, SKIPPED
from ..core.step import Step, ok
from ..gke import STRICT_COMPUTE_LISTS, clusters_fact, location
from ..schema import FLEX_WAIT_DEFAULT, Environment, reservation_parts
from ..tpu import chips

PLAY = "capacity"

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


# -- the preflight: read-only, before anything is created --------------------------------
def machine_types_fact(env: Environment) -> Fact:
    """Every zone that offers the machine type (an aggregated list: all of
    them, so the others can be named)."""
    c = gcloud("compute", "machine-types", "list", f"--filter=name={env.machine_type}", "--format=json",
               project=env.project_id)
    c = dataclasses.replace(c, env=STRICT_COMPUTE_LISTS + c.env)

    def zones(items: list) -> list[str]:
        return sorted({str(i.get("zone", "")).rsplit("/", 1)[-1] for i in items if i.get("name") == env.machine_type})

    return fact(f"zones offering {env.machine_type}", c, json_list(zones), assumed=[env.zone],
                describe=lambda zs: ", ".join(zs) or "none")


def machine_type_step(env: Environment) -> Step:
    probe = machine_types_fact(env)

    def run(ctx: StepContext) -> Outcome:
        try:
            zones = ctx.look(probe)
        except ProbeFailed as e:
            return not_checked(e)
        if not ctx.runner.probing:
            return Outcome(OK, f"would check that zone {env.zone} offers {env.machine_type}")
        here = [z for z in zones if z.startswith(env.region + "-")]
        if env.zone in zones:
            return Outcome(OK, f"zone {env.zone} offers {env.machine_type}")
        if env.mode == "autopilot" and here:
            # Autopilot picks the zone of its TPU nodes within the region.
            return Outcome(OK, f"zones of {env.region} that offer {env.machine_type}: {', '.join(here)}")
        if here:
            return Outcome(FAILED, f"zone {env.zone} does not offer {env.machine_type}; the zones of {env.region} "
                                   f"that do: {', '.join(here)} (set zone:)")
        regions = sorted({z.rsplit("-", 1)[0] for z in zones})
        return Outcome(FAILED, f"no zone of {env.region} offers {env.machine_type}; regions that do: "
                               f"{', '.join(regions) or 'none visible to this project'} (set region: and zone:)")

    where = env.region if env.mode == "autopilot" else env.zone
    return Step(PLAY, f"{env.machine_type} in {where}", run=run, id="capacity:machine-type",
                probes=(probe,))


def not_checked(e: ProbeFailed) -> Outcome:
    """A check that cannot look does not stop the run: only a proven
    shortage does."""
    return Outcome(SKIPPED, f"not checked: {e.why}")


def server_config_fact(env: Environment) -> Fact:
    return fact(f"GKE versions in {location(env)}",
                gcloud("container", "get-server-config", f"--location={location(env)}", "--format=json",
                       project=env.project_id),
                json_object(), assumed={"validMasterVersions": [env.cluster_version]},
                describe=lambda c: f"{len(offered(c))} version(s) offered")


def offered(cfg: Any) -> list[str]:
    out = list((cfg or {}).get("validMasterVersions") or [])
    for ch in (cfg or {}).get("channels") or []:
        out += [v for v in ch.get("validVersions") or [] if v not in out]
    return out


def version_step(env: Environment) -> Step:
    clusters, probe = clusters_fact(env), server_config_fact(env)

    def run(ctx: StepContext) -> Outcome:
        try:
            if ctx.look(clusters) is not ABSENT:
                return Outcome(OK, f"cluster {env.cluster_name} exists: its version is not created again")
            versions = offered(ctx.look(probe))
        except ProbeFailed as e:
            return not_checked(e)
        if not ctx.runner.probing:
            return Outcome(OK, f"would check that GKE {env.cluster_version} is offered in {location(env)}")
        if env.cluster_version in versions:
            return Outcome(OK, f"GKE {env.cluster_version} is offered in {location(env)}")
        newest = ", ".join(versions[:5]) or "none"
        return Outcome(FAILED, f"GKE {env.cluster_version} is not offered in {location(env)} (offered: {newest}"
                               f"{', ...' if len(versions) > 5 else ''}): set cluster_version:")

    return Step(PLAY, f"GKE {env.cluster_version} in {location(env)}", run=run,
                id="capacity:version", probes=(clusters,))  # the versions only when there is no cluster


# Cloud Quotas ids of the Compute Engine quotas GKE's TPU nodes consume (not
# the Cloud TPU API's): on-demand v6e chips are TPUS_PER_TPU_FAMILY with
# tpu_family CT6E (named in Google's v6e guide); Spot, and flex-start first,
# the preemptible v6e quota. The ids follow Cloud Quotas' naming; an id the
# API does not know is "not checked", never a shortage.
ON_DEMAND_QUOTA: tuple[str, dict[str, str]] = ("TPUS-PER-TPU-FAMILY-per-project-region", {"tpu_family": "CT6E"})
PREEMPTIBLE_QUOTA: tuple[str, dict[str, str]] = ("PREEMPTIBLE-TPU-V6E-per-project-region", {})


def quota_fact(env: Environment, quota: tuple[str, dict]) -> Fact:
    qid, dims = quota
    return fact(f"quota {qid}",
                gcloud("beta", "quotas", "info", "describe", qid, "--service=compute.googleapis.com",
                       f"--project={env.project_id}", "--format=json"),
                json_object(), assumed={"quotaId": qid, "dimensionsInfos": []},
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


def quota_step(env: Environment) -> Step:
    need = env.slices * chips(env.topology)
    if env.capacity == "reservation":
        return Step(PLAY, "TPU quota", lambda look: ok(
            "a pool consuming a reservation needs no TPU quota (GKE's TPU docs): the reservation is checked"),
                    id="capacity:quota")
    quotas = [PREEMPTIBLE_QUOTA, ON_DEMAND_QUOTA] if env.capacity == "flex-start" else \
        [PREEMPTIBLE_QUOTA] if env.capacity == "spot" else [ON_DEMAND_QUOTA]

    def run(ctx: StepContext) -> Outcome:
        seen: list[str] = []
        for qid, dims in quotas:
            try:
                info = ctx.look(quota_fact(env, (qid, dims)))
            except ProbeFailed as e:
                return not_checked(e)
            label = qid.split("-per-")[0] + (f" ({', '.join(dims.values())})" if dims else "")
            if not ctx.runner.probing:
                seen.append(label)
                continue
            value = quota_value(info, env.region, dims)
            if value is None:
                return Outcome(SKIPPED, f"not checked: quota {label} has no value for {env.region}")
            if value < 0 or value >= need:
                permits = "no limit" if value < 0 else f"{value} chips"
                return Outcome(OK, f"quota {label} in {env.region} permits {permits}; this inventory needs {need} "
                                   f"(quota is not capacity)")
            seen.append(f"quota {label} in {env.region} is {value} chips")
        if not ctx.runner.probing:
            return Outcome(OK, f"would check that quota {' or '.join(seen)} in {env.region} permits {need} chips")
        alt = "capacity: spot or reservation" if env.capacity == "on-demand" else \
            "capacity: on-demand or reservation" if env.capacity == "spot" else "capacity: reservation"
        return Outcome(FAILED, f"{' and '.join(seen)}, this inventory needs {need} ({env.slices} slices x "
                               f"{chips(env.topology)} chips): request it, or use {alt}")

    return Step(PLAY, f"TPU quota for {need} chips", run=run, id="capacity:quota",
                probes=tuple(quota_fact(env, q) for q in quotas))


def reservation_fact(env: Environment) -> Fact:
    owner, name = reservation_parts(env)
    return fact(f"reservation {name}",
                gcloud("compute", "reservations", "describe", name, f"--zone={env.zone}", "--format=json",
                       project=owner),
                reservation_parse, assumed={"name": name, "status": "READY", "specificReservation": {
                    "count": str(env.slices * env.hosts_per_slice), "inUseCount": "0",
                    "instanceProperties": {"machineType": env.machine_type}}},
                describe=lambda r: f"{r.get('status')}, {free_hosts(r)} of "
                                   f"{(r.get('specificReservation') or {}).get('count', '?')} free")


def reservation_parse(c: Completed) -> Any:
    if c.ok:
        try:
            return json.loads(c.stdout)
        except json.JSONDecodeError:
            raise ProbeFailed("reservation", c.line, c.rc, c.stdout, c.stderr, why="output is not JSON") from None
    # gcloud compute prints only the server's message; its debug log has the status.
    from ..clients import http_status
    if http_status(c) == 404:
        return ABSENT
    raise ProbeFailed("reservation", c.line, c.rc, c.stdout, c.stderr,
                      why=f"could not look (exit code {c.rc}): {c.first_error_line()}")


def free_hosts(r: Any) -> int:
    spec = (r or {}).get("specificReservation") or {}
    try:
        return int(spec.get("count") or 0) - int(spec.get("inUseCount") or 0)
    except (TypeError, ValueError):
        return 0


def reservation_step(env: Environment) -> Step:
    owner, name = reservation_parts(env) if env.capacity == "reservation" else ("", "")
    need = env.slices * env.hosts_per_slice

    def run(ctx: StepContext) -> Outcome:
        try:
            r = ctx.look(reservation_fact(env))
        except ProbeFailed as e:
            return not_checked(e)
        if not ctx.runner.probing:
            return Outcome(OK, f"would check that reservation {name} is READY with {need} free {env.machine_type} "
                               f"hosts")
        where = f"zone {env.zone} of project {owner}"
        if r is ABSENT:
            return Outcome(FAILED, f"no reservation {name} in {where}: check its name, zone and project "
                                   f"(a shared one is projects/OWNER/reservations/NAME)")
        if r.get("status") != "READY":
            return Outcome(FAILED, f"reservation {name} is {r.get('status')}, not READY")
        spec = r.get("specificReservation") or {}
        mt = str((spec.get("instanceProperties") or {}).get("machineType", "")).rsplit("/", 1)[-1]
        if mt != env.machine_type:
            return Outcome(FAILED, f"reservation {name} holds {mt or 'no'} machines, this inventory needs "
                                   f"{env.machine_type}")
        free = free_hosts(r)
        if free < need:
            return Outcome(FAILED, f"reservation {name} has {free} free {env.machine_type} hosts (count "
                                   f"{spec.get('count')}, in use {spec.get('inUseCount')}); this inventory needs "
                                   f"{need} ({env.slices} slices x {env.hosts_per_slice} hosts)")
        return Outcome(OK, f"reservation {name} is READY with {free} free {env.machine_type} hosts; {need} needed")

    return Step(PLAY, f"reservation {name}", run=run, id="capacity:reservation",
                probes=(reservation_fact(env),))


def steps(env: Environment) -> list[Step]:
    """The capacity preflight: read-only, so it runs first, before any
    create. Autopilot has no node pools of ours, but the same chips."""
    if env.kind == "local":
        return [Step(PLAY, "capacity", lambda look: ok(), id="capacity:local",
                     skip="a local environment needs no TPU capacity")]
    out = [machine_type_step(env), version_step(env), quota_step(env)]
    if env.capacity == "reservation":
        out.append(reservation_step(env))
    return out
