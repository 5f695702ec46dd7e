"""§4 TPU node pools: one multi-host slice per pool (Standard only), of the
environment's TPU generation (``config/tpu.py``); TPU7x's multi-host pools
first get their workload policy."""
from __future__ import annotations

from typing import Any

from playbooks.access.cli_clients import gcloud
from playbooks.cloud import capacity_options as cap
from playbooks.cloud import node_shutdown
from playbooks.cloud.capacity_plan import BROKEN, plan_fact
from playbooks.cloud.gke import (
    container_change,
    location,
    machine_types_fact,
    needs_workload_policy,
    network_name,
    nodepool_name,
    nodepools_fact,
    subnet_id,
    subnet_name,
    workload_policy_fact,
    workload_policy_name,
)
from playbooks.config import spot_grace
from playbooks.config import tutorial as T
from playbooks.config.choices import capacity_option, given
from playbooks.config.schema import Environment, capacities, capacity_text
from playbooks.config.tpu import chips, dcn_networks, generation
from playbooks.core.errors import PlaybookError
from playbooks.core.facts import ABSENT
from playbooks.core.step import Broken, Step, Verify, change, drift, fail, ok, skipped, wait

PLAY = "nodepools"
CREATE_TIMEOUT = 60 * 60
AUTOPILOT_SKIP = ("Autopilot has no node pools to create: it provisions the TPU slices from the "
                  "RayCluster's TPU requests and node selectors")


def create_command(env: Environment, name: str, option: str, shutdown: bool = True):
    """The tutorial's command, every flag kept, with our capacity label next
    to its DRANET label and the option's flags (capacity_options.pool_flags;
    flex-start starts with 0 nodes and autoscales to one slice), and, with
    ``shutdown``, the option's node system configuration where the
    environment gives it one (a Spot pool's lengthened graceful
    termination: cloud/node_shutdown.py, fed on stdin). A
    single-host slice (one VM has all its chips) is created without
    --tpu-topology: GKE refuses a topology for a single-host TPU slice pool
    ("TPU topology can't be specified with single-host TPU slice pool", as
    xpk met it in its PR #825). TPU7x's multi-host pools name their workload
    policy instead (--placement-policy); a machine type without the two DCN
    NICs gets no additional networks (tpu.dcn_networks)."""
    gen = generation(env)
    # --threads-per-core=1 is the tutorial's own flag (its node-pools create on
    # ct6e-standard-4t: docs/tpu-generations.md [S29]); the record says where
    # else it is passed and that there it is unverified.
    threads = [f"--threads-per-core={gen.threads_per_core}"] if gen.threads_per_core else []
    if needs_workload_policy(env):
        topology = [f"--placement-policy={workload_policy_name(env)}"]
    else:
        topology = [f"--tpu-topology={env.topology}"] if env.hosts_per_slice > 1 else []
    command = container_change(
        env, "node-pools", "create", name,
        f"--location={env.zone}", f"--cluster={env.cluster_name}", f"--machine-type={env.machine_type}",
        *threads, *topology, f"--num-nodes={cap.initial_nodes(env, option)}", *_networks(env),
        f"--node-labels={cap.node_labels(env, option)}", "--enable-gvnic", f"--scopes={T.TPU_SCOPES}",
        *cap.pool_flags(env, option))
    return node_shutdown.fed(command, given(env, capacity_option(option))) if shutdown else command


def _networks(env: Environment) -> list[str]:
    if not dcn_networks(env):
        return []
    return [f"--additional-node-network=network={network_name(env, i)},subnetwork={subnet_name(env, i)}"
            for i in (0, 1)]


def delete_command(env: Environment, name: str):
    return container_change(env, "node-pools", "delete", name, f"--location={location(env)}",
                            f"--cluster={env.cluster_name}", quiet=True)


def _last(v: Any) -> str:
    return str(v or "").rsplit("/", 1)[-1]


def shape_diffs(env: Environment, p: Any) -> list[str]:
    diffs = []
    cfg = p.get("config") or {}
    if cfg.get("machineType") != env.machine_type:
        diffs.append(f"machine type is {cfg.get('machineType')}, want {env.machine_type}")
    policy = p.get("placementPolicy") or {}
    top = policy.get("tpuTopology")
    if needs_workload_policy(env):
        if _last(policy.get("policyName")) != workload_policy_name(env):
            diffs.append(f"placement policy is {policy.get('policyName')}, want {workload_policy_name(env)}")
    elif top != env.topology and (top or env.hosts_per_slice > 1):
        diffs.append(f"TPU topology is {top}, want {env.topology}")
    option = cap.pool_option(p)
    nodes = p.get("initialNodeCount")
    if nodes is not None and nodes != cap.initial_nodes(env, option):
        diffs.append(f"{nodes} nodes, want {cap.initial_nodes(env, option)}")
    if not cap.as_asked(env, p):
        want = " or ".join(cap.words(env, o) for o in capacities(env))
        diffs.append(f"capacity is {cap.pool_capacity(p)}, want {want}")
    want_nets = {(network_name(env, i), subnet_name(env, i)) for i in (0, 1)} if dcn_networks(env) else set()
    have_nets = {(_last(n.get("network")), _last(n.get("subnetwork")))
                 for n in (p.get("networkConfig") or {}).get("additionalNodeNetworkConfigs") or []}
    if have_nets != want_nets:
        diffs.append(f"additional networks are {sorted(have_nets) or 'none'}, want {sorted(want_nets)}")
    labels = cfg.get("labels") or {}
    key, val = T.TPU_NODE_LABEL.split("=")
    if dcn_networks(env) and labels.get(key) != val:
        diffs.append(f"node label {T.TPU_NODE_LABEL} is missing")
    ours = labels.get(cap.LABEL)
    if ours is None:
        diffs.append(f"node label {cap.LABEL} is missing (the TPU workers select it)")
    elif ours != option:
        diffs.append(f"node label {cap.LABEL}={ours}, but the pool is {option}")
    return diffs


def pool_step(env: Environment, i: int) -> Step:
    """Slice i's pool, of the option the capacity plan chose for it (one
    option: that one). A create that fails for capacity or quota is replaced
    by a pool of the next option of the list (``Pool.instead``); any other
    failure (a flag GKE refuses, a 403) stands."""
    pool = Pool(env, i)
    after = ("cluster:cluster", *((subnet_id(0), subnet_id(1)) if dcn_networks(env) else ()),
             *((POLICY_ID,) if needs_workload_policy(env) else ()))
    return Step(PLAY, f"TPU node pool {pool.name}", pool.decide, id=f"nodepools:{pool.name}", after=after,
                verify=Verify(pool.probe, pool.running, timeout=CREATE_TIMEOUT, interval=15), explain=pool.explain)


class Pool:
    """The parts of slice i's pool step: its decision, its create (and the
    next option's after a failed one), its verify, what a failure means."""

    def __init__(self, env: Environment, i: int):
        self.env, self.i = env, i
        self.name = nodepool_name(env, i)
        self.probe = nodepools_fact(env, self.name)
        self.planned = plan_fact(env)
        self.several = len(capacities(env)) > 1
        # gcloud's version, where a pool of the list gets a node system
        # configuration (an older gcloud refuses its keys: spot_grace).
        self.gcloud = node_shutdown.gcloud_version_fact() if any(o.kubelet_config for o in env.options) else None
        self.sent: str | None = None  # the option whose configuration the last create sent

    def decide(self, look):
        env, name = self.env, self.name
        p = look(self.probe)
        if p is ABSENT or p.get("status") in BROKEN:
            if p is not ABSENT and shape_diffs(env, p):
                return drift(f"node pool {name}: " + "; ".join(shape_diffs(env, p)))
            option = look(self.planned).option(self.i) if self.several else capacities(env)[0]
            if option is None:
                return fail(f"no option of capacity {capacity_text(env)} can take slice {name} (the capacity plan)")
            # A pool left in ERROR (e.g. GCE_STOCKOUT: no TPU capacity in the
            # zone) holds no usable slice: replace it rather than count it done.
            return self.create(look, option, p)
        diffs = shape_diffs(env, p)
        if diffs:
            return drift(f"node pool {name}: " + "; ".join(diffs))
        return self.shutdown_as_given(look, p) or self.as_it_is(p)

    def cannot_send(self, look, option: str) -> str | None:
        """Why the create or update of a pool of ``option`` cannot send its
        node system configuration (None: it can, or it has none)."""
        if not given(self.env, capacity_option(option)).kubelet_config or self.gcloud is None:
            return None
        return spot_grace.gcloud_blocker(look(self.gcloud))

    def shutdown_as_given(self, look, p: dict):
        """A pool of the right shape that lacks its option's node system
        configuration (a Spot pool made before it was set, or by a gcloud
        that could not send it): drift, with the update that gives it it;
        with that gcloud still, the pool as it is, said in a note."""
        option = cap.pool_option(p)
        o = given(self.env, capacity_option(option))
        why = node_shutdown.lacks(o, p) if o.kubelet_config else None
        if why is None:
            return None
        blocked = self.cannot_send(look, option)
        if blocked is not None:
            return self.as_it_is(p, notes=(f"{self.name}: {why}; {blocked}",))
        update = node_shutdown.update_command(self.env, self.name, o)
        return drift(f"node pool {self.name}: {why}",
                     notes=[f"to give it the {o.notice_s} s (GKE re-creates the pool's nodes: a running job loses "
                            f"the slice): {update.line()}"])

    def as_it_is(self, p: dict, notes: tuple[str, ...] = ()):
        """A pool of the right shape: done, being made, going, or broken."""
        name, status = self.name, p.get("status")
        if status == "RUNNING":
            return ok(f"node pool {name} is RUNNING ({self.env.topology}, {cap.pool_capacity(p)})", notes=notes)
        if status in ("PROVISIONING", "RECONCILING"):
            return wait(f"node pool {name} is {status} (another operation is making it)")
        if status == "STOPPING":
            return fail(f"node pool {name} is being deleted; wait for it to go, then re-run")
        return fail(f"node pool {name} is {status}: {p.get('statusMessage') or 'no message'}")

    def create(self, look, option: str, replacing: Any = ABSENT, notes: tuple[str, ...] = (), was: str = ""):
        env = self.env
        blocked = self.cannot_send(look, option)
        if blocked is not None:
            notes = (*notes, f"{self.name}: made without its node system configuration: {blocked}; its Spot VMs "
                             f"give the job's pods the default {spot_grace.DEFAULT_PODS_S} s of a preemption's notice")
        o = given(env, capacity_option(option))
        self.sent = option if o.kubelet_config and blocked is None else None
        nodes = (f"0 to {env.hosts_per_slice} nodes as capacity comes" if capacity_option(option).starts_empty
                 else f"{env.hosts_per_slice} nodes")
        grace = f", {o.notice_s} s of a preemption's notice for the job's pods" if self.sent else ""
        what = f"{env.topology}, {nodes}, {cap.words(env, option)}{grace}"
        if was:  # the next option, after the one before failed
            reason = f"created ({what}), in place of {was}"
        elif replacing is not ABSENT:
            reason = f"replaced a broken pool (was {replacing.get('status')}: {cap.pool_problem(replacing)}) ({what})"
        else:
            reason = f"created ({what})"
        cmds = ([delete_command(env, self.name)] if replacing is not ABSENT else []) + \
            [create_command(env, self.name, option, shutdown=blocked is None)]
        return change(*cmds, reason=reason, notes=notes, instead=lambda look, why: self.instead(look, why, option))

    def instead(self, look, why: str, option: str):
        """After a failed create: the pool replaced by the next option's when
        GKE says no capacity or no quota; None (the failure stands) else."""
        env = self.env
        try:
            p = look(self.probe)
            chosen = look(self.planned) if self.several else None
        except PlaybookError:
            return None
        broken = p is not ABSENT and p.get("status") in BROKEN
        text = cap.pool_problem(p) if broken else why
        kind = cap.classify(text)
        if kind not in ("capacity", "quota"):
            return None
        rest = cap.after(env, option)
        passed = [o for o in rest if chosen is not None and chosen.proven_empty(o)]
        nxt = next((o for o in rest if o not in passed), None)
        if nxt is None:
            return None
        head = "no TPU capacity" if kind == "capacity" else "not enough quota"
        message = " ".join(text.split())
        message = message if len(message) <= 200 else message[:197] + "..."
        skipped = f" ({', '.join(passed)}: the plan found room for none)" if passed else ""
        note = f"{cap.words(env, option)}: {head}: {message}; next: {cap.words(env, nxt)}{skipped}"
        return self.create(look, nxt, p, (note,), was=f"{cap.words(env, option)} ({head})")

    def running(self, p):
        if p is ABSENT:
            return "node pool not found"
        if p.get("status") in BROKEN:
            raise Broken(f"node pool {self.name} is {p.get('status')}: {cap.pool_problem(p)}")
        if p.get("status") != "RUNNING":
            return f"status {p.get('status')}"
        sent = given(self.env, capacity_option(self.sent)) if self.sent == cap.pool_option(p) else None
        if sent is not None and (why := node_shutdown.lacks(sent, p)):
            raise Broken(f"node pool {self.name} is RUNNING without the node system configuration sent: {why}")
        return None

    def explain(self, look, reason: str) -> str | None:
        """A create that failed, or a pool left broken: what GKE says, in one
        line with its class (no capacity, no quota, other) and the options."""
        try:
            p = look(self.probe)
        except PlaybookError:
            p = ABSENT
        broken = p is not ABSENT and p.get("status") in BROKEN
        text = cap.pool_problem(p) if broken else reason
        if not broken and cap.classify(text) == "other":
            return None
        try:
            zones = look(machine_types_fact(self.env))
        except PlaybookError:
            zones = None
        return cap.explain(self.env, text, zones)


# Above this many chips, say how many before any is created.
CHIPS_TO_SAY = 64


def chips_step(env: Environment, play: str) -> list[Step]:
    """A line with the total, before more than CHIPS_TO_SAY chips are made."""
    per_slice = chips(env.topology)
    total = env.slices * per_slice
    if total <= CHIPS_TO_SAY:
        return []
    what = (f"{total} {generation(env).short} chips: {env.slices} slices of {env.topology} ({per_slice} chips, "
            f"{env.hosts_per_slice} {env.machine_type} hosts each), more than {CHIPS_TO_SAY}")
    return [Step(play, "TPU chips", lambda look: ok(f"this environment asks for {what}", data=total),
                 id=f"{play}:chips")]


POLICY_ID = "nodepools:workload-policy"


def policy_create(env: Environment):
    """`gcloud compute resource-policies create workload-policy`, as GKE's
    TPU7x page and xpk make it (--type=HIGH_THROUGHPUT, the slice topology)."""
    return gcloud("compute", "resource-policies", "create", "workload-policy", workload_policy_name(env),
                  "--type=HIGH_THROUGHPUT", f"--accelerator-topology={env.topology}", f"--region={env.region}",
                  project=env.project_id)


def policy_step(env: Environment) -> Step:
    """The workload policy TPU7x multi-host pools are placed by."""
    name, probe = workload_policy_name(env), workload_policy_fact(env)

    def decide(look):
        p = look(probe)
        if p is ABSENT:
            return change(policy_create(env), reason=f"created (HIGH_THROUGHPUT, {env.topology})")
        wp = p.get("workloadPolicy") or {}
        if wp.get("acceleratorTopology") not in (None, env.topology) or wp.get("type") not in (None,
                                                                                               "HIGH_THROUGHPUT"):
            return drift(f"workload policy {name} is {wp.get('type')} {wp.get('acceleratorTopology')}, want "
                         f"HIGH_THROUGHPUT {env.topology}")
        return ok(f"workload policy {name} exists (HIGH_THROUGHPUT, {env.topology})")

    return Step(PLAY, f"workload policy {name}", decide, id=POLICY_ID,
                verify=Verify(probe, lambda p: "workload policy not found" if p is ABSENT else None))


def steps(env: Environment) -> list[Step]:
    if not env.cluster_mode.our_node_pools:
        return [skipped(PLAY, "TPU node pools", AUTOPILOT_SKIP, id="nodepools:all")]
    policy = [policy_step(env)] if needs_workload_policy(env) else []
    return chips_step(env, PLAY) + policy + [pool_step(env, i) for i in range(env.slices)]
