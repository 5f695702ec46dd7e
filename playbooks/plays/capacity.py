"""The capacity preflight: read-only checks, before anything is created,
that the zone offers the machine type, that the GKE version is offered, that
the TPU quota permits the chips, and that the reservation has the hosts. A
check that cannot look is "not checked", never a shortage. What the options
are is ``playbooks/capacity_options.py``."""
from __future__ import annotations

from typing import Any

from ..clients import compute_describe, fact, gcloud, json_object
from ..core.errors import ProbeFailed
from ..core.facts import ABSENT, Fact
from ..core.step import Step, fail, ok, skipped, unchecked
from ..gke import clusters_fact, location, machine_types_fact
from ..schema import Environment, reservation_parts
from ..tpu import chips

PLAY = "capacity"

# -- the preflight: read-only, before anything is created --------------------------------
def machine_type_step(env: Environment) -> Step:
    probe = machine_types_fact(env)

    def decide(look):
        try:
            zones = look(probe)
        except ProbeFailed as e:
            return unchecked(e.why)
        here = [z for z in zones if z.startswith(env.region + "-")]
        if env.zone in zones:
            return ok(f"zone {env.zone} offers {env.machine_type}")
        if env.mode == "autopilot" and here:
            # Autopilot picks the zone of its TPU nodes within the region.
            return ok(f"zones of {env.region} that offer {env.machine_type}: {', '.join(here)}")
        if here:
            return fail(f"zone {env.zone} does not offer {env.machine_type}; the zones of {env.region} that do: "
                        f"{', '.join(here)} (set zone:)")
        regions = sorted({z.rsplit("-", 1)[0] for z in zones})
        return fail(f"no zone of {env.region} offers {env.machine_type}; regions that do: "
                    f"{', '.join(regions) or 'none visible to this project'} (set region: and zone:)")

    where = env.region if env.mode == "autopilot" else env.zone
    return Step(PLAY, f"{env.machine_type} in {where}", decide, id="capacity:machine-type", probes=(probe,))


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

    def decide(look):
        try:
            if look(clusters) is not ABSENT:
                return ok(f"cluster {env.cluster_name} exists: its version is not created again")
            versions = offered(look(probe))
        except ProbeFailed as e:
            return unchecked(e.why)
        if env.cluster_version in versions:
            return ok(f"GKE {env.cluster_version} is offered in {location(env)}")
        newest = ", ".join(versions[:5]) or "none"
        return fail(f"GKE {env.cluster_version} is not offered in {location(env)} (offered: {newest}"
                    f"{', ...' if len(versions) > 5 else ''}): set cluster_version:")

    return Step(PLAY, f"GKE {env.cluster_version} in {location(env)}", decide,
                id="capacity:version", probes=(clusters,))  # the versions only when there is no cluster


# Cloud Quotas ids of the Compute Engine quotas GKE's TPU nodes consume (not
# the Cloud TPU API's): on-demand v6e chips are TPUS_PER_TPU_FAMILY with
# tpu_family CT6E (named in Google's v6e guide); Spot, and flex-start first,
# the preemptible v6e quota. The ids follow Cloud Quotas' naming; an id the
# API does not know is "not checked", never a shortage.
ON_DEMAND_QUOTA: tuple[str, dict[str, str]] = ("TPUS-PER-TPU-FAMILY-per-project-region", {"tpu_family": "CT6E"})
PREEMPTIBLE_QUOTA: tuple[str, dict[str, str]] = ("PREEMPTIBLE-TPU-V6E-per-project-region", {})


def quota_fact(env: Environment, quota: tuple[str, dict]) -> Fact:
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


def quota_step(env: Environment) -> Step:
    need = env.slices * chips(env.topology)
    if env.capacity == "reservation":
        return skipped(PLAY, "TPU quota", "a pool consuming a reservation needs no TPU quota (GKE's TPU docs): the "
                                         "reservation is checked", id="capacity:quota")
    quotas = [PREEMPTIBLE_QUOTA, ON_DEMAND_QUOTA] if env.capacity == "flex-start" else \
        [PREEMPTIBLE_QUOTA] if env.capacity == "spot" else [ON_DEMAND_QUOTA]
    facts = [quota_fact(env, q) for q in quotas]

    def decide(look):
        seen: list[str] = []
        for (qid, dims), probe in zip(quotas, facts):
            try:
                info = look(probe)
            except ProbeFailed as e:
                return unchecked(e.why)
            label = qid.split("-per-")[0] + (f" ({', '.join(dims.values())})" if dims else "")
            value = quota_value(info, env.region, dims)
            if value is None:
                return unchecked(f"quota {label} has no value for {env.region}")
            if value < 0 or value >= need:
                permits = "no limit" if value < 0 else f"{value} chips"
                return ok(f"quota {label} in {env.region} permits {permits}; this inventory needs {need} (quota is "
                          f"not capacity)")
            seen.append(f"quota {label} in {env.region} is {value} chips")
        alt = "capacity: spot or reservation" if env.capacity == "on-demand" else \
            "capacity: on-demand or reservation" if env.capacity == "spot" else "capacity: reservation"
        return fail(f"{' and '.join(seen)}, this inventory needs {need} ({env.slices} slices x "
                    f"{chips(env.topology)} chips): request it, or use {alt}")

    return Step(PLAY, f"TPU quota for {need} chips", decide, id="capacity:quota", probes=tuple(facts))


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


def reservation_step(env: Environment) -> Step:
    owner, name = reservation_parts(env) if env.capacity == "reservation" else ("", "")
    need = env.slices * env.hosts_per_slice
    probe = reservation_fact(env)

    def decide(look):
        try:
            r = look(probe)
        except ProbeFailed as e:
            return unchecked(e.why)
        where = f"zone {env.zone} of project {owner}"
        if r is ABSENT:
            return fail(f"no reservation {name} in {where}: check its name, zone and project (a shared one is "
                        f"projects/OWNER/reservations/NAME)")
        if r.get("status") != "READY":
            return fail(f"reservation {name} is {r.get('status')}, not READY")
        spec = r.get("specificReservation") or {}
        mt = str((spec.get("instanceProperties") or {}).get("machineType", "")).rsplit("/", 1)[-1]
        if mt != env.machine_type:
            return fail(f"reservation {name} holds {mt or 'no'} machines, this inventory needs {env.machine_type}")
        free = free_hosts(r)
        if free < need:
            return fail(f"reservation {name} has {free} free {env.machine_type} hosts (count {spec.get('count')}, "
                        f"in use {spec.get('inUseCount')}); this inventory needs {need} ({env.slices} slices x "
                        f"{env.hosts_per_slice} hosts)")
        return ok(f"reservation {name} is READY with {free} free {env.machine_type} hosts; {need} needed")

    return Step(PLAY, f"reservation {name}", decide, id="capacity:reservation", probes=(probe,))


def steps(env: Environment) -> list[Step]:
    """The capacity preflight: read-only, so it runs first, before any
    create. Autopilot has no node pools of ours, but the same chips."""
    if env.kind == "local":
        return [skipped(PLAY, "capacity", "a local environment needs no TPU capacity", id="capacity:local")]
    out = [machine_type_step(env), version_step(env), quota_step(env)]
    if env.capacity == "reservation":
        out.append(reservation_step(env))
    return out
