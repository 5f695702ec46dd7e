"""The capacity preflight: read-only checks, before anything is created,
that the zone offers the machine type, that the GKE version is offered, what
the TPU quotas permit and the reservation holds, and the plan per slice
made from them (``playbooks/cloud/capacity_plan.py``): a shortfall stops the run
before any create. A check that cannot look is "not checked", never a
shortage. What the options are is ``playbooks/cloud/capacity_options.py``.
The `capacity` task also prices the plan and says what each option's
notice gives a save (``job/save_period.py``)."""
from __future__ import annotations

import dataclasses
from typing import Any

from playbooks.access.cli_clients import fact, gcloud, json_object
from playbooks.cloud import capacity_options as cap
from playbooks.cloud import capacity_plan, cluster_prices, node_shutdown, prices
from playbooks.cloud.gke import clusters_fact, location, machine_types_fact
from playbooks.config import paths
from playbooks.config.schema import Environment, capacities, reservation_parts
from playbooks.config.tpu import chips
from playbooks.core.errors import PlaybookError, ProbeFailed
from playbooks.core.facts import ABSENT, Fact
from playbooks.core.step import Step, fail, ok, skipped, unchecked
from playbooks.job import save_period, save_plan
from playbooks.job.save_period import Times
from playbooks.job.spec import MODELS, build_job
from playbooks.runs import save_times

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
        if env.cluster_mode.regional and here:
            # Autopilot picks the zone of its TPU nodes within the region.
            return ok(f"zones of {env.region} that offer {env.machine_type}: {', '.join(here)}")
        if here:
            return fail(f"zone {env.zone} does not offer {env.machine_type}; the zones of {env.region} that do: "
                        f"{', '.join(here)} (set zone:)")
        regions = sorted({z.rsplit("-", 1)[0] for z in zones})
        return fail(f"no zone of {env.region} offers {env.machine_type}; regions that do: "
                    f"{', '.join(regions) or 'none visible to this project'} (set region: and zone:)")

    where = env.region if env.cluster_mode.regional else env.zone
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


def quota_step(env: Environment) -> Step:
    """The quotas the options of the list consume, read (the plan step
    decides what they permit: a slice of each option, in order)."""
    need = env.slices * chips(env.topology)
    wanted = capacity_plan.quotas(env)
    if not wanted:
        return skipped(PLAY, "TPU quota", "a pool consuming a reservation needs no TPU quota (GKE's TPU docs): the "
                                         "reservation is checked", id="capacity:quota")
    facts = [capacity_plan.quota_fact(env, q) for q in wanted]
    several = len(capacities(env)) > 1

    def decide(look):
        seen: list[str] = []
        for q, probe in zip(wanted, facts):
            label = f"quota {cap.quota_label(q)} in {env.region}"
            users = f" ({', '.join(o for o in capacities(env) if q in cap.quotas(env, o))})" if several else ""
            try:
                value = capacity_plan.quota_value(look(probe), env.region, q[1])
            except ProbeFailed as e:
                return unchecked(f"{label}{users}: {e.why}")
            if value is None:
                return unchecked(f"{label} has no value for {env.region}")
            seen.append(f"{label} permits {'no limit' if value < 0 else f'{value} chips'}{users}")
        return ok(f"{'; '.join(seen)}; this inventory needs {need} (quota is not capacity)")

    return Step(PLAY, f"TPU quota for {need} chips", decide, id="capacity:quota", probes=tuple(facts))


def reservation_step(env: Environment) -> Step:
    """The inventory's reservation: it must exist and hold the machine type
    (else the inventory names the wrong one); its free hosts are what it
    can give (the plan step counts whole slices)."""
    name = reservation_parts(env)[1]
    probe = capacity_plan.reservation_fact(env)

    def decide(look):
        try:
            r = look(probe)
        except ProbeFailed as e:
            return unchecked(e.why)
        problem = capacity_plan.reservation_problem(env, r)
        if problem and (r is ABSENT or r.get("status") == "READY"):
            return fail(problem)
        if problem:
            return ok(f"{problem}: it takes no slice now")
        spec = r.get("specificReservation") or {}
        free = capacity_plan.free_hosts(r)
        return ok(f"reservation {name} is READY with {free} free {env.machine_type} hosts (count {spec.get('count')}, "
                  f"in use {spec.get('inUseCount')}): {free // env.hosts_per_slice} whole slice(s) of "
                  f"{env.hosts_per_slice} hosts")

    return Step(PLAY, f"reservation {name}", decide, id="capacity:reservation", probes=(probe,))


def plan_step(env: Environment) -> Step:
    """The plan per slice, before anything is created: printed one line per
    slice; a shortfall stops the run here, with what each option can take."""
    probe = capacity_plan.plan_fact(env)
    firsts = (clusters_fact(env), *[capacity_plan.quota_fact(env, q) for q in capacity_plan.quotas(env)],
              *([capacity_plan.reservation_fact(env)] if any(o.reserved for o in env.options) else []))
    where = (" (on Autopilot the ComputeClass's priorities, in this order, choose each node's capacity)"
             if env.cluster_mode.compute_class else "")

    def decide(look):
        p = look(probe)
        short = p.shortfall(env)
        if short:
            return fail(short, notes=p.lines())
        if p.unproven:
            return unchecked(f"{p.summary()}: {len(p.unproven)} slice(s) on an option whose check could not look"
                             f"{where}", data=p, notes=p.lines())
        return ok(p.summary() + where, data=p, notes=p.lines())

    # After the checks (read-only too), so its lines come last and it plans
    # only from what they did not refuse.
    checks = ("capacity:machine-type", "capacity:version", "capacity:quota", "capacity:reservation")
    return Step(PLAY, f"plan for {env.slices} slice(s)", decide, id="capacity:plan", probes=firsts, after=checks)


def prices_step(env: Environment) -> Step:
    """What the plan costs by the hour, every part that bills: each slice's
    option at its price per chip-hour (``playbooks/cloud/prices.py``: the
    inventory's, else the Cloud Billing Catalog's), the CPU pool and the
    cluster fee (``playbooks/cloud/cluster_prices.py``), and the total. A
    price that cannot be read is "no price", its reason said once with how
    to get one, never a stop."""
    plan = capacity_plan.plan_fact(env)
    catalog = prices.catalog_fact(env) if prices.needs_catalog(env, cpu=True) else None
    per = env.hosts_per_slice * env.chips_per_host

    def decide(look):
        p = look(plan)
        got = look(catalog) if catalog else None
        charges = [cluster_prices.Charge(
            s.pool, s.words, per, "chips",
            cluster_prices.tpu_rate(prices.price(env, s.option, got)) if s.option else
            cluster_prices.Rate(None, "chip-hour", why="no option can take it")) for s in p.slots]
        head, notes = cluster_prices.summary(charges + cluster_prices.cluster_charges(env, got),
                                             pods_by_request=env.cluster_mode.cpu_pool_nodes == 0)
        return ok(head, notes=notes)

    return Step(PLAY, "price of the plan", decide, id="capacity:prices",
                probes=(plan, *([catalog] if catalog else [])), after=("capacity:plan",))


NOT_READ = "the timelines are not read in a dry run (`invoke capacity` with playbook.mode=check reads them)"


def default_estimate(env: Environment) -> Times | str:
    """The save and step seconds the preflight estimates for `invoke
    train`'s default job (``job/save_plan.py``), or why there are none."""
    model = MODELS[0]
    try:
        t = save_plan.estimate(env, build_job(env, model))
    except PlaybookError as e:
        return f"no estimate for {model}: {e}"
    return dataclasses.replace(t, basis=f"{model}'s (the default job), estimated: {t.basis}") if isinstance(t, Times) \
        else t


def notice_step(env: Environment) -> Step:
    """What each option's notice gives a save (the option as this
    environment's cluster gives it: a Spot pool's graceful termination
    lengthened where it can be, ``config/choices.py``): the save the
    environment's newest run measured (``runs/save_times.py``); none
    measured, the preflight's estimate for the default job
    (`invoke preflight --model=M` estimates another model's)."""
    probe = Fact(name="save time", python=lambda: save_times.read(env) or "none measured here yet",
                 display=f"# the save times of {paths.training(env.name)}/*/events.jsonl", assumed=NOT_READ,
                 describe=lambda t: t.basis if isinstance(t, Times) else str(t))

    sent = node_shutdown.sender(env)

    def decide(look):
        t = look(probe)
        times = t if isinstance(t, Times) else default_estimate(env)
        why = (f" (no save measured: {t}; the save held is {times.basis}; `invoke preflight --model=M` "
               f"estimates another model's)" if isinstance(times, Times) and not isinstance(t, Times) else
               f" (no save to hold: {t}; {times})" if not isinstance(times, Times) else "")
        loss = "the steps since its last checkpoint (up to the checkpoint period: `invoke train` says it)"
        held = times if isinstance(times, Times) else None
        return ok("notice: " + "; ".join(save_period.notice_text(o, held, loss) for o in sent(look)) + why)

    return Step(PLAY, "notice before a slice goes", decide, id="capacity:notice", probes=(probe,))


def steps(env: Environment, priced: bool = False) -> list[Step]:
    """The capacity preflight: read-only, so it runs first, before any
    create. Autopilot has no node pools of ours, but the same chips.
    ``priced`` (the `capacity` task): the plan's price by the hour too."""
    if env.platform.simulated:
        return [skipped(PLAY, "capacity", "a local environment needs no TPU capacity", id="capacity:local")]
    out = [machine_type_step(env), version_step(env), quota_step(env)]
    if any(o.reserved for o in env.options):
        out.append(reservation_step(env))
    return out + [plan_step(env)] + ([prices_step(env), notice_step(env)] if priced else [])
