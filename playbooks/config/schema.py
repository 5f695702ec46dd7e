"""The inventory schema: which keys an environment has, and the rules GCP,
Kubernetes and TPU hardware impose on their values (the TPU arithmetic in
``tpu.py``, versions in ``versions.py``, a local cluster's ports in
``local_ports.py``)."""
from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from playbooks.config import maxtext_settings
from playbooks.config import tutorial as T
from playbooks.config.choices import (
    MODES,
    OPTIONS,
    PLATFORMS,
    CapacityOption,
    ClusterMode,
    Platform,
    cluster_mode,
    platform,
)
from playbooks.config.choices import options as capacity_records
from playbooks.config.local_ports import local_port_span, ports
from playbooks.config.project import DEFAULT_INVENTORY
from playbooks.config.tpu import (
    GENERATIONS,
    chips,
    dcn_networks,
    default_chips_per_host,
    generation,
    hosts_per_slice,
    local_chips_per_host,
    machine_topology_problem,
    machine_type_list,
    of_machine_type,
    ray_hosts_problem,
    ray_topology_problem,
    topology_problem,
)
from playbooks.config.versions import default_ray_image
from playbooks.core.inventory import Entry, Env, Inventory, Key, Schema, did_you_mean, load

# -- rules ------------------------------------------------------------------
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_PROJECT = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_ZONE = re.compile(r"^([a-z]+-[a-z]+[0-9]+)-[a-z]$")
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)-gke\.(\d+)$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def one_of(v: str, allowed: tuple[str, ...]) -> str | None:
    """A value of a closed set, or why not: the allowed values, and the one
    meant when it is another's case or a near spelling (Spot: spot)."""
    if v in allowed:
        return None
    return f"is not allowed (allowed: {', '.join(allowed)}){did_you_mean(v, allowed)}"


def project_id(v: str, env: Mapping) -> str | None:
    if not _PROJECT.match(v):
        return ("is not a valid project ID (6-30 characters: lowercase letters, digits, hyphens; starts with a letter, "
                "does not end with a hyphen)")
    return None


def region(v: str, env: Mapping) -> str | None:
    return None if _REGION.match(v) else "is not a region name like us-central1"


def zone(v: str, env: Mapping) -> str | None:
    m = _ZONE.match(v)
    if not m:
        return "is not a zone name like us-central1-b"
    if m.group(1) != env.get("region"):
        return f"is outside region {env.get('region')!r} (a zone is <region>-<letter>)"
    return None


def gke_cluster_name(v: str, env: Mapping) -> str | None:
    if len(v) > 40 or not _GCE_NAME.match(v):
        return ("is not a valid GKE cluster name (1-40 characters: lowercase letters, digits, hyphens; "
                "starts with a letter, ends with a letter or digit)")
    return None


def version_tuple(v: str) -> tuple[int, ...]:
    m = _VERSION.match(v)
    assert m, v
    return tuple(int(x) for x in m.groups())


def cluster_version(v: str, env: Mapping) -> str | None:
    if not _VERSION.match(v):
        return "is not a GKE version like 1.35.2-gke.1842000"
    mode = env.get("mode")
    need = T.DRANET_MIN_VERSION.get(str(mode))
    if need and version_tuple(v) < version_tuple(need):
        return f"is older than {need}, the first {mode} version with managed DRANET"
    return None


def mode(v: str, env: Mapping) -> str | None:
    return one_of(v, tuple(MODES))


def bucket(v: str, env: Mapping) -> str | None:
    rule = ("is not a valid Cloud Storage bucket name (3-63 characters: lowercase letters, digits, '-', '_', '.'; "
            "starts and ends with a letter or digit; not an IP address; no 'goog' prefix)")
    if v.startswith("gs://"):
        return "must be the bucket name alone, without gs://"
    parts = v.split(".")
    if not (3 <= len(v) <= (222 if len(parts) > 1 else 63)):
        return rule
    if not re.match(r"^[a-z0-9][-a-z0-9_.]*[a-z0-9]$", v) or ".." in v:
        return rule
    if any(len(p) > 63 or not p for p in parts):
        return rule
    if v.startswith("goog") or "google" in v or "g00gle" in v:
        return rule
    try:
        ipaddress.ip_address(v)
        return rule
    except ValueError:
        return None


def dns_label(what: str):
    def rule(v: str, env: Mapping) -> str | None:
        if len(v) > 63 or not _DNS_LABEL.match(v):
            return (f"is not a valid {what} (a DNS-1123 label: at most 63 characters, lowercase letters, "
                    "digits and '-', starting and ending with a letter or digit)")
        return None
    return rule


def dns_subdomain(what: str):
    def rule(v: str, env: Mapping) -> str | None:
        if len(v) > 253 or not _DNS_SUBDOMAIN.match(v):
            return (f"is not a valid {what} (a DNS-1123 subdomain: at most 253 characters, lowercase letters, "
                    "digits, '-' and '.', starting and ending with a letter or digit)")
        return None
    return rule


def email(v: str, env: Mapping) -> str | None:
    return None if _EMAIL.match(v) else "is not an email address (the user or service account to grant roles to)"


def at_least(n: int):
    def rule(v: int, env: Mapping) -> str | None:
        return None if v >= n else f"must be at least {n}"
    return rule


def between(lo: int, hi: int, why: str):
    """A count with a bound that has a reason."""
    def rule(v: int, env: Mapping) -> str | None:
        if v < lo:
            return f"must be at least {lo}"
        if v > hi:
            return f"must be at most {hi} ({why})"
        return None
    return rule


# Multislice: GKE's guide documents near-linear scaling "up to tens of
# thousands of TPU chips"; 256 slices of the largest v6e slice (16x16, 256
# chips) is 65,536 chips. One node pool per slice is made.
MAX_SLICES = 256
SLICES_WHY = ("GKE's multislice guide: near-linear scaling up to tens of thousands of TPU chips; "
              "256 slices of a 16x16 v6e slice are 65,536 chips")
# Locally, every simulated TPU host is a Ray node process on this machine.
MAX_LOCAL_HOSTS = 16
MAX_LOCAL_DEVICES = 64


def multislice_hosts(v: int, env: Mapping) -> str | None:
    """GKE runs multislice on multi-host slices only ("Multislice only
    supports multi-host TPU slice node pools", GKE's multislice guide)."""
    if env["slices"] > 1 and v == 1:
        return (f"is one host per slice ({env['topology']} on {env['machine_type']}), but {env['slices']} slices need "
                f"multi-host slices: GKE's multislice supports only multi-host TPU slice node pools (use slices: 1, "
                f"or a topology of several hosts such as 4x4)")
    return None


def min_slices(v: int, env: Mapping) -> str | None:
    """A job starts on whole slices: at least one, at most every slice."""
    if v < 1:
        return "must be at least 1 (a job needs a whole slice to start on)"
    if v > env["slices"]:
        return f"must be at most slices ({env['slices']}): the slices ready before `up` is done"
    return None


def every_slice(env: Mapping) -> int:
    return env["slices"]


REHEARSE_MAX = 3600


def late_slice(v: int | None, env: Mapping) -> str | None:
    """Rehearsal: the last slice's hosts join this many seconds late."""
    if v is None:
        return None
    if not 1 <= v <= REHEARSE_MAX:
        return f"must be between 1 and {REHEARSE_MAX} seconds"
    if env["min_slices"] >= env["slices"]:
        return (f"holds back the last of {env['slices']} slices, but min_slices is {env['min_slices']} (every "
                f"slice): nothing would start without it; set min_slices below slices")
    return None


def local_hosts(v: int, env: Mapping) -> str | None:
    total = env["slices"] * v
    if total > MAX_LOCAL_HOSTS:
        return (f"makes {env['slices']} slices x {v} hosts = {total} simulated TPU hosts; at most "
                f"{MAX_LOCAL_HOSTS} (each is a Ray node process on this machine)")
    return None


def replace_pool(v: bool, env: Mapping) -> str | None:
    if v and (m := cluster_mode(env)) is not None and not m.our_node_pools:
        return f"is true, but mode is {env['mode']}: GKE makes Autopilot's nodes; there is no node pool of ours to " \
               f"make again"
    return None


# A pod delete that does not end: a pod whose node's kubelet is dead (a
# NotReady node, the sick host a quarantine moves off) stays Terminating,
# since only its kubelet confirms its end (kubectl delete's help: "If the
# node hosting a pod is down or cannot reach the API server, termination may
# take significantly longer than the grace period";
# https://kubernetes.io/docs/reference/kubectl/generated/kubectl_delete/).
# After stuck_pod_after it is force-deleted or left (cloud/pod_delete.py).
STUCK_POD = ("force", "leave")
# 90 s: the worker pods' 30 s grace (Kubernetes' default
# terminationGracePeriodSeconds, which their preStop hook may use whole:
# config/host_notice.py), then a minute for the kubelet to end the
# containers and the API server to hear of it.
STUCK_POD_AFTER = 90
STUCK_POD_AFTER_MAX = 3600


def stuck_pod(v: str, env: Mapping) -> str | None:
    return one_of(v, STUCK_POD)


def port(v: int, env: Mapping) -> str | None:
    return None if 1024 <= v <= 65535 else "must be a port between 1024 and 65535"


def machine_type(v: str, env: Mapping) -> str | None:
    """A TPU machine type of a known generation (which decides the generation)."""
    gen = of_machine_type(v)
    if gen is None:
        return f"is not a GKE TPU machine type (allowed, by generation: {machine_type_list()})"
    if (m := cluster_mode(env)) is not None and m.compute_class and not gen.autopilot:
        return (f"is a {gen.title} machine type; this project's Autopilot path (DRANET through a ComputeClass "
                f"with the accelerator network profile auto) is v6e's only: use mode: standard")
    return None


def gke_tpu(v: str, env: Mapping) -> str | None:
    """On GKE the machine type decides the generation; `tpu:` may only agree."""
    gen = of_machine_type(env["machine_type"])
    if gen is not None and v != gen.name:
        return f"does not match machine type {env['machine_type']!r}, a {gen.title} machine type (tpu: {gen.name})"
    return None


def gke_topology(v: str, env: Mapping) -> str | None:
    """A slice shape GKE allows for the machine type (tpu.py's record) and
    that Ray can take: a shape GKE allows and Ray cannot is refused naming
    Ray's limit."""
    gen, mt = generation(env), env["machine_type"]
    vm = gen.machine_types.get(mt)
    return (topology_problem(v, gen) or machine_topology_problem(v, gen, mt) or ray_topology_problem(v, gen)
            or (vm and ray_hosts_problem(v, gen, vm.chips, f"on machine type {mt!r} is")) or None)


def offered_capacity(v: str | list, env: Mapping) -> str | None:
    """Each option of the list is one GKE offers this generation."""
    gen = generation(env)
    for o in capacities(env):
        if o not in gen.capacity_options:
            return (f"holds {o}, which {gen.title} is not offered as (it is: {', '.join(gen.capacity_options)})")
    return None


def subnet_range(v: str, env: Mapping) -> str | None:
    try:
        net = ipaddress.ip_network(v, strict=True)
    except ValueError:
        return "is not a CIDR range like 10.50.0.0/16 (with no host bits set)"
    if net.version != 4 or not net.is_private:
        return "must be a private IPv4 range (RFC 1918)"
    if not (8 <= net.prefixlen <= 29):
        return "must have a prefix length between /8 and /29"
    return None


def apart_from_subnet_1(v: str, env: Mapping) -> str | None:
    try:
        a = ipaddress.ip_network(env["subnet_1_range"], strict=False)
        b = ipaddress.ip_network(v, strict=False)
    except ValueError:
        return None
    if a.overlaps(b):
        return f"overlaps subnet_1_range {env['subnet_1_range']!r} (the two subnets must not overlap)"
    return None


def network_names(v: str, env: Mapping) -> str | None:
    longest = f"{v}-net-2"
    if len(longest) > 63:
        return f"makes the network name {longest!r} longer than 63 characters"
    return None


def gce_name(what: str):
    def rule(v: str, env: Mapping) -> str | None:
        if len(v) > 63 or not _GCE_NAME.match(v):
            return (f"is not a valid {what} (1-63 characters: lowercase letters, digits, hyphens; starts with a "
                    "letter, ends with a letter or digit)")
        return None
    return rule


def standard_only(env: Mapping) -> str | None:
    """The DCN networks are the tutorial's on Standard; on Autopilot GKE makes
    them itself (the ComputeClass's accelerator network profile)."""
    if (m := cluster_mode(env)) is not None and not m.our_networks:
        return "on Autopilot GKE makes and manages the TPU nodes' extra networks itself"
    return None


def apart_from_subnet_1_name(v: str, env: Mapping) -> str | None:
    return "must differ from subnet_1_name" if v == env["subnet_1_name"] else None


CAPACITIES = tuple(OPTIONS)
_RESERVATION = re.compile(r"^(projects/(?P<project>[a-z][-a-z0-9]{4,28}[a-z0-9])/reservations/)?"
                          r"(?P<name>[a-z]([-a-z0-9]{0,61}[a-z0-9])?)$")
FLEX_WAIT_DEFAULT = 3600
FLEX_WAIT_MAX = 7 * 24 * 3600  # flex-start VMs run at most 7 days


WORKER_PACKAGES = ("requirements", "image")


def worker_packages(v: str, env: Mapping) -> str | None:
    return one_of(v, WORKER_PACKAGES)


def capacities(env: Mapping) -> tuple[str, ...]:
    """The capacity options the inventory accepts, best first: one option
    is a list of one."""
    v = env["capacity"]
    return tuple(v) if isinstance(v, list) else (v,)


def capacity_text(env: Mapping) -> str:
    """``capacity:`` as the inventory gives it, for messages."""
    v = env["capacity"]
    return f"[{', '.join(str(x) for x in v)}]" if isinstance(v, list) else str(v)


def capacity(v: str | list, env: Mapping) -> str | Entry | None:
    """One option, or an ordered list of distinct options (best first)."""
    allowed = f"allowed: {', '.join(CAPACITIES)}"
    if isinstance(v, list):
        if not v:
            return (f"is an empty list: give one option or an ordered list of distinct options, best first "
                    f"({allowed})")
        for i, x in enumerate(v):
            if not isinstance(x, str):
                return Entry(str(i), x, f"must be a string, one option of the list ({allowed})")
            if x not in CAPACITIES:
                return Entry(str(i), x, f"is not allowed ({allowed}){did_you_mean(x, CAPACITIES)}")
        seen: set[str] = set()
        for x in v:
            if x in seen:
                return f"names {x} twice: each option once, best first"
            seen.add(x)
    elif v not in CAPACITIES:
        return f"is not allowed ({allowed}; or an ordered list of them, best first){did_you_mean(v, CAPACITIES)}"
    if "reservation" in capacities(env) and env.get("reservation") is None:
        return "needs reservation: (the reservation's name, or projects/P/reservations/NAME for a shared one)"
    return None


def reservation(v: str | None, env: Mapping) -> str | None:
    if v is None:
        return None
    if "reservation" not in capacities(env):
        return (f"is set, but capacity is {capacity_text(env)}: a reservation is used only when capacity holds "
                f"reservation")
    if not _RESERVATION.match(v):
        return "is not a reservation name (1-63 lowercase letters, digits, '-') or projects/P/reservations/NAME"
    return None


def capacity_wait(v: int | None, env: Mapping) -> str | None:
    if v is None:
        return None
    if "flex-start" not in capacities(env):
        return f"is set, but capacity is {capacity_text(env)}: only flex-start waits for its capacity"
    if not 60 <= v <= FLEX_WAIT_MAX:
        return f"must be between 60 and {FLEX_WAIT_MAX} seconds (flex-start VMs run at most 7 days)"
    return None


# USD per chip-hour: v6e lists at $2.70-3.24 on demand; a price past this is a typo.
MAX_PRICE = 100.0


# The environment's parts that no capacity option prices (cloud/env_cost.py):
# USD per node-hour of the cluster's default-pool, USD per hour of the GKE
# cluster management fee.
DEFAULT_POOL = "default-pool"
CLUSTER_FEE = "cluster-fee"
PRICE_UNITS = {**dict.fromkeys(CAPACITIES, "chip-hour"), DEFAULT_POOL: "node-hour", CLUSTER_FEE: "hour"}


def prices(v: Mapping, env: Mapping) -> str | Entry | None:
    """USD per chip-hour per capacity option (per node-hour of the
    default-pool, per hour of the cluster fee): a number from 0 (a prepaid
    reservation, a free-tier cluster) to MAX_PRICE; they win over the Cloud
    Billing Catalog."""
    allowed = f"allowed: {', '.join(PRICE_UNITS)}"
    for k, val in v.items():
        if k not in PRICE_UNITS:
            return Entry(str(k), val, f"is not a capacity option, {DEFAULT_POOL} or {CLUSTER_FEE} ({allowed})"
                                      f"{did_you_mean(k, tuple(PRICE_UNITS))}")
        unit = PRICE_UNITS[k]
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            return Entry(k, val, f"must be a number: USD per {unit} (e.g. 2.7)")
        if not 0 <= val <= MAX_PRICE:  # NaN fails both
            return Entry(k, val, f"must be between 0 and {MAX_PRICE:g} USD per {unit} (v6e lists at $2.70-3.24 "
                                 f"a chip-hour on demand; 0: a prepaid reservation, a free-tier cluster)")
    return None


def reservation_parts(env: Mapping) -> tuple[str, str]:
    """(project, name) of the inventory's reservation: a shared one names
    its owner's project, else it is the environment's own."""
    m = _RESERVATION.match(env["reservation"])
    assert m, env["reservation"]
    return (m.group("project") or env["project_id"]), m.group("name")


# -- a controller host (SSH) and the control plane's endpoint ---------------------
_SSH_TARGET = re.compile(r"^(?P<user>[a-z_][a-z0-9_.-]{0,31})@(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)"
                         r"(?::(?P<port>[0-9]{1,5}))?$")
_REMOTE_DIR = re.compile(r"^/?[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*/?$")
CONTROL_PLANES = ("public", "dns", "internal")


def ssh_target(v: str | None, env: Mapping) -> str | None:
    if v is None:
        return None
    m = _SSH_TARGET.match(v)
    if not m:
        return "is not user@host[:port] (a user name, a host name or IP address, an optional port)"
    if m.group("port") and not 1 <= int(m.group("port")) <= 65535:
        return "has a port outside 1-65535"
    return None


def needs_controller(v: Any, env: Mapping) -> str | None:
    if v is not None and env.get("controller") is None:
        return "is set, but there is no controller: (it applies to the SSH connection to a controller host)"
    return None


def local_file(what: str):
    def rule(v: str | None, env: Mapping) -> str | None:
        if v is None:
            return None
        if "\0" in v or "\n" in v or len(v) > 1024:
            return f"is not a path to {what}"
        p = Path(os.path.expanduser(v))
        if not p.is_file() or not os.access(p, os.R_OK):
            return f"is not a readable file ({what}, on this machine)"
        return None
    return rule


def remote_dir(v: str, env: Mapping) -> str | None:
    if len(v) > 200 or not _REMOTE_DIR.match(v) or ".." in v.split("/"):
        return ("is not a directory path for the controller (letters, digits, '.', '_', '-' and '/'; "
                "relative to the login directory or absolute; no '..')")
    return None


def control_plane(v: str, env: Mapping) -> str | None:
    if v not in CONTROL_PLANES:
        return one_of(v, CONTROL_PLANES)
    if v == "internal" and env.get("controller") is None:
        return ("needs a controller inside the VPC (controller: user@host): the internal endpoint is reachable "
                "only from there; or use control_plane: dns (no bastion needed)")
    return None


def ray_image(v: str, env: Mapping) -> str | None:
    if not re.match(r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?$", v):
        return "is not a container image reference like rayproject/ray:2.60.0-py312-tpu"
    return None


def loopback(v: str, env: Mapping) -> str | None:
    try:
        ip = ipaddress.ip_address(v)
    except ValueError:
        return "is not an IP address"
    if not ip.is_loopback:
        return "must be a loopback address (127.x.x.x); 127.0.0.2 keeps Ray off eth0"
    return None


def local_ports(v: int, env: Mapping) -> str | None:
    """A local cluster takes gcs_port .. gcs_port + local_port_span."""
    try:
        top = local_port_span(env["slices"], hosts_per_slice(env))
    except (KeyError, ValueError, ZeroDivisionError):
        return None
    if v + top > 65535:
        return f"leaves no room for the {top} ports after it that the local nodes use"
    if v <= env.get("dashboard_port", 0) <= v + top:
        return f"makes the node ports {v}..{v + top} overlap dashboard_port {env['dashboard_port']}"
    return None


def local_topology(v: str, env: Mapping) -> str | None:
    # Ray's TPU support knows the real slice shapes of each generation only.
    gen = generation(env)
    return topology_problem(v, gen) or ray_topology_problem(v, gen)


def local_tpu(v: str, env: Mapping) -> str | None:
    return None if v in GENERATIONS else f"is not a TPU generation (allowed: {', '.join(GENERATIONS)})"


def chips_per_host(v: int, env: Mapping) -> str | None:
    top, gen = env["topology"], generation(env)
    allowed = local_chips_per_host(gen)
    if v not in allowed:
        said = ", ".join(map(str, allowed[:-1])) + (" or " if len(allowed) > 1 else "") + str(allowed[-1])
        return (f"must be {said} (the chips of a {gen.title} VM: "
                f"{', '.join(gen.machine_types)})")
    if chips(top) % v:
        return f"does not divide the {chips(top)} chips of {gen.name} topology {top!r}"
    return ray_hosts_problem(top, gen, v, f"makes {gen.name} topology {top!r}")


def overrides(v: Mapping, env: Mapping) -> str | Entry | None:
    """MaxText settings for every job: each must be one MaxText accepts."""
    for k, val in v.items():
        if not isinstance(k, str) or not re.match(r"^[a-z_][a-z0-9_]*$", k):
            return f"has key {k!r}, which is not a MaxText config key"
        if isinstance(val, (dict, list)):
            return Entry(k, val, "must be a scalar (it goes on the job's command line as key=value)")
        if k == "model_name":
            return Entry(k, val, "is chosen per job with `invoke train --model`")
        why = maxtext_settings.problem(k, maxtext_settings.as_text(val))
        if why:
            return Entry(k, val, why)
    return None


# -- a running job: stalls ---------------------------------------------------
STALL_ACTIONS = ("report", "stop", "restart")
STALL_AFTER_MIN, STALL_AFTER_MAX = 5, 7 * 24 * 3600


def stall_after(v: int | None, env: Mapping) -> str | None:
    if v is None:
        return None
    if not STALL_AFTER_MIN <= v <= STALL_AFTER_MAX:
        return (f"must be between {STALL_AFTER_MIN} and {STALL_AFTER_MAX} seconds (the watch looks every fifth of it; "
                f"7 days is longer than any step); unset, it is the larger of 10 x the run's p90 step time and "
                f"600 s")
    return None


def stall_action(v: str, env: Mapping) -> str | None:
    return one_of(v, STALL_ACTIONS)


STALL_WATCHES = ("cluster", "follow")


def default_stall_watch(env: Mapping) -> str:
    # GKE keeps the follow until the watch in a head pod has run on a real
    # cluster (it needs PyPI from the head and the raycluster play's RBAC;
    # docs/quarantine.md): a first day on GKE must not depend on it.
    return "follow" if env.get("kind", "gke") == "gke" else "cluster"


def stall_watch(v: str, env: Mapping) -> str | None:
    return one_of(v, STALL_WATCHES)


STALL = (
    Key("stall_after", int, rules=(stall_after,),
        doc="seconds without a new step that make a RUNNING job stalled (default: the larger of 10 x the run's p90 "
            "step time and 600; the compile is allowed for before a worker group's first step)"),
    Key("stall_action", default="report", rules=(stall_action,),
        doc="report (a line, an event of the run's timeline), stop (also `ray job stop`: no chips burn on a hung "
            "job; a later `invoke train` resumes it from its checkpoint) or restart (an elastic job: the host the "
            "hang diagnosis or the health gate names quarantined, the job goes on on the slices left; else "
            "stopped; docs/quarantine.md)"),
    Key("stall_watch", derive=default_stall_watch, rules=(stall_watch,),
        doc="where the stall watch and its actions run: cluster (a Ray job of its own on the Ray head beside each "
            "job, `invoke watch`: nobody needs to follow; the local twin's default; on GKE in the head pod, with "
            "the project shipped as its working_dir and RBAC from the raycluster play) or follow (inside `invoke "
            "train` / `logs --follow` on this machine: GKE's default)"),
)

# -- an elastic job: how soon it takes in a slice that came ----------------------
RESIZE_INTERVAL_MAX = 3600

def resize_interval(v: int | None, env: Mapping) -> str | None:
    if v is None:
        return None
    return between(1, RESIZE_INTERVAL_MAX, "an hour: a slice that came would stay idle longer than that")(v, env)


START_RETRIES_MAX = 100
FAILURE_WINDOW_MIN, FAILURE_WINDOW_MAX = 60, 7 * 24 * 3600


def failure_window(v: int, env: Mapping) -> str | None:
    if v == 0 or FAILURE_WINDOW_MIN <= v <= FAILURE_WINDOW_MAX:
        return None
    return (f"must be 0 (the job's whole life) or between {FAILURE_WINDOW_MIN} and {FAILURE_WINDOW_MAX} seconds "
            f"(a minute to 7 days: a restart itself takes about a minute)")
RESIZE_SAVE_TIMEOUT_MAX = 6 * 3600
MAX_FAILURES_MAX = 1000

ELASTIC = (
    Key("resize_interval", int, rules=(resize_interval,),
        doc="seconds between an elastic job's looks for slices that came (Ray Train's "
            "elastic_resize_monitor_interval_s; default: Ray's 60 on GKE, 10 locally)"),
    Key("start_retries", int, default=3,
        rules=(between(0, START_RETRIES_MAX, "a worker that cannot load the trainer that often will not"),),
        doc="how many times an elastic job retries a worker group whose start failed on a worker's system error "
            "(it could not load the trainer); Ray Train otherwise takes that as fatal"),
    Key("resize_save_timeout", int, default=600,
        rules=(between(1, RESIZE_SAVE_TIMEOUT_MAX, "6 hours: no checkpoint save takes that long"),),
        doc="seconds an elastic job's resize waits for the checkpoint it saves first (a grow then replays no "
            "step); past it the resize goes on from the last checkpoint"),
    Key("max_failures", int, default=3,
        rules=(between(-1, MAX_FAILURES_MAX, "-1 is no limit: say that instead"),),
        doc="how many worker-group failures (a lost host, a crashed worker, a failed health gate) an elastic job "
            "recovers from within any failure_window seconds before it fails (-1: no limit, 0: none); node "
            "preemptions Ray recognizes are counted apart, without a limit"),
    Key("failure_window", int, default=3600, rules=(failure_window,),
        doc="seconds over which max_failures counts an elastic job's failures: more than max_failures within "
            "any failure_window seconds ends the job, older ones no longer count (3600: at most max_failures an "
            "hour, so a days-long run is not ended by losses spread over days); 0: over the job's whole life "
            "(Ray Train's FailureConfig.max_failures)"),
)

# -- a slice's announced end: host maintenance, a flex-start end ------------------
# The watch gives a slice its notice maintenance_lead seconds before its
# scheduled host maintenance or flex-start end (runs/maintenance_watch.py):
# the job saves and shrinks at that save. At least 10 s (a save and the
# watch's look); at most a day (GKE labels a maintenance days ahead: a
# slice given up a day early is a day of chips unused).
MAINTENANCE_LEAD_MIN, MAINTENANCE_LEAD_MAX = 10, 24 * 3600
MAINTENANCE_STARTS = ("window", "after_save")


def maintenance_start(v: str, env: Mapping) -> str | None:
    return one_of(v, MAINTENANCE_STARTS)


MAINTENANCE = (
    Key("maintenance_lead", int, default=900,
        rules=(between(MAINTENANCE_LEAD_MIN, MAINTENANCE_LEAD_MAX, "a day: the slice would sit idle that long"),),
        doc="seconds before a slice's scheduled host maintenance (GKE's cloud.google.com/scheduled-maintenance-time "
            "node label; the twin's chaos.maintenance) or its flex-start end that the watch gives the slice its "
            "notice: the job saves at its next step and goes on without the slice from that save (default 900)"),
    Key("maintenance_start", default="window", rules=(maintenance_start,),
        doc="window (GKE starts the maintenance at its scheduled time) or after_save (the watch starts the slice's "
            "maintenance as soon as the notice's save is finalized: `kubectl label nodes -l "
            "cloud.google.com/gke-nodepool=POOL cloud.google.com/perform-maintenance=true --overwrite`, GKE's "
            "documented way; GKE only)"),
)

# -- the health gate: every host checks itself before MaxText starts ------------
# trainer/health_check.py: each check's own limit (opening a TPU chip alone
# takes 7-9 s, measured on a v5e), and the share of each device's HBM the
# memory check writes (0.89 was measured writing and reading back; 0.95 the
# most: the runtime keeps some for itself).
HEALTH_CHECK_TIMEOUT_MIN, HEALTH_CHECK_TIMEOUT_MAX = 10, 3600
HBM_FRACTION_MAX = 0.95


def hbm_fraction(v: float, env: Mapping) -> str | None:
    if isinstance(v, bool) or not 0 < v <= HBM_FRACTION_MAX:
        return f"must be a number above 0 and at most {HBM_FRACTION_MAX} (of each device's memory; the runtime keeps " \
               "some for itself)"
    return None


HEALTH = (
    Key("health_check", bool, default=True,
        doc="true: every training worker checks its TPU host (devices, a matmul, its memory, a collective over "
            "every host) before MaxText starts, and a sick host fails the worker group at once, named; false: none"),
    Key("health_check_timeout", int, default=120,
        rules=(between(HEALTH_CHECK_TIMEOUT_MIN, HEALTH_CHECK_TIMEOUT_MAX,
                       "an hour: a check that has not answered by then is a sick host"),),
        doc="seconds each check of the health gate may take before it counts as failed (did not answer)"),
    Key("health_check_hbm_fraction", (int, float), default=0.85, rules=(hbm_fraction,),
        doc="the share of each TPU device's memory (bytes_limit) the health gate writes and reads back"),
)

# -- the checkpoint period: chosen, not inherited (job/save_period.py) ----------------
AUTO = "auto"
MTBI_MAX_HOURS = 10 * 8760


def checkpoint_period(v: str | int, env: Mapping) -> str | None:
    """auto (chosen from the save and step times and the interruptions
    expected) or a whole number of steps; never beside train_overrides'."""
    if isinstance(v, bool) or (isinstance(v, int) and v < 1) or (isinstance(v, str) and v != AUTO):
        return (f"must be {AUTO} (chosen from the measured save and step times and the interruptions expected) or "
                f"a whole number of steps >= 1 (MaxText saves when step % checkpoint_period == 0)")
    if isinstance(v, int) and "checkpoint_period" in (env.get("train_overrides") or {}):
        return (f"and train_overrides.checkpoint_period = {env['train_overrides']['checkpoint_period']} say two "
                f"things: give one (train_overrides' wins over {AUTO})")
    return None


def mtbi_hours(v: float | None, env: Mapping) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool) or not 0 < v <= MTBI_MAX_HOURS:  # NaN fails too
        return (f"must be a number of hours above 0 and at most {MTBI_MAX_HOURS} (ten years): the mean time "
                f"between interruptions a run expects")
    return None


SAVES = (
    Key("checkpoint_period", (str, int), default=AUTO, rules=(checkpoint_period,),
        doc="auto (the default: sqrt(2 x save time x mean time between interruptions) / step time, in steps; "
            "Young 1974, Daly 2006, at most half the job's steps on Spot, flex-start and the twin) or a whole number "
            "of steps; train_overrides' checkpoint_period wins over auto, "
            "--set over both"),
    Key("interruption_mtbi_hours", (int, float), rules=(mtbi_hours,),
        doc="the mean time between interruptions a run expects, in hours (default: the capacity option's, an "
            "assumption where Google publishes no rate: spot 24, on-demand and reservation 720, flex-start 168)"),
)

# -- schema -----------------------------------------------------------------
KIND = Key("kind", str, rules=(lambda v, e: one_of(v, tuple(PLATFORMS)),),
           doc="gke (default) or local")

GKE = (
    KIND,
    Key("slices", int, default=2, rules=(between(1, MAX_SLICES, SLICES_WHY),), doc="TPU slices (one node pool each)"),
    Key("min_slices", int, derive=every_slice, rules=(min_slices,),
        doc="whole slices `up` waits for (default: every slice); the rest are named as waiting"),
    Key("project_id", required=True, rules=(project_id,), doc="the Google Cloud project ID"),
    Key("region", required=True, rules=(region,), doc="a region with TPU v6e capacity"),
    Key("zone", required=True, rules=(zone,), doc="a zone of that region with TPU v6e capacity"),
    Key("cluster_name", required=True, rules=(gke_cluster_name, network_names), doc="the GKE cluster name"),
    Key("cluster_version", required=True, rules=(cluster_version,), doc="the GKE version, e.g. 1.35.2-gke.1842000"),
    Key("mode", required=True, rules=(mode,), doc="standard or autopilot"),
    Key("gs_bucket", required=True, rules=(bucket,), doc="the checkpoint bucket name"),
    Key("ksa_name", required=True, rules=(dns_subdomain("Kubernetes service account name"),),
        doc="the Kubernetes service account name"),
    Key("namespace", required=True, rules=(dns_label("Kubernetes namespace"),), doc="the Kubernetes namespace"),
    Key("user_identifier", required=True, rules=(email,),
        doc="the account granted the tutorial's roles: yours (me@example.com), or a service account's email"),
    Key("machine_type", default="ct6e-standard-4t", rules=(machine_type,),
        doc="a GKE TPU machine type; it decides the TPU generation (tpu)"),
    Key("tpu", derive=lambda e: of_machine_type(e["machine_type"]).name, rules=(gke_tpu,),  # type: ignore[union-attr]
        doc="the TPU generation: derived from machine_type (v5e, v5p, v6e, tpu7x)"),
    Key("topology", default="4x4", rules=(gke_topology,)),
    Key("chips_per_host", int, derive=default_chips_per_host,
        rules=(lambda v, e: None if v == generation(e).machine_types[e["machine_type"]].chips
               else f"does not match machine type {e['machine_type']!r} "
                    f"({generation(e).machine_types[e['machine_type']].chips} chips per VM)",)),
    Key("hosts_per_slice", int, derive=hosts_per_slice,
        rules=(lambda v, e: None if v == hosts_per_slice(e) else
               f"does not match topology {e['topology']!r} with {e['chips_per_host']} chips per host",
               multislice_hosts)),
    Key("subnet_1_name", default=T.SUBNETS[0][1], rules=(gce_name("subnet name"),),
        doc="the first DCN subnet (the tutorial's tpu-subnet-1)", unused=standard_only),
    Key("subnet_2_name", default=T.SUBNETS[1][1], rules=(gce_name("subnet name"), apart_from_subnet_1_name),
        doc="the second DCN subnet (the tutorial's tpu-subnet-2)", unused=standard_only),
    Key("subnet_1_range", default=T.SUBNETS[0][2], rules=(subnet_range,), unused=standard_only),
    Key("subnet_2_range", default=T.SUBNETS[1][2], rules=(subnet_range, apart_from_subnet_1), unused=standard_only),
    Key("ray_image", derive=default_ray_image, rules=(ray_image,),
        doc="the Ray image for head and workers; defaults to the Ray version in requirements.lock"),
    Key("dashboard_port", int, default=T.DASHBOARD_PORT, rules=(port,)),
    Key("train_overrides", dict, default={}, rules=(overrides,)),
    Key("worker_packages", default="requirements", rules=(worker_packages,),
        doc="requirements (each job installs trainer/requirements.txt on the workers) or image (the Ray image "
            "already holds MaxText at the lock's pins)"),
    Key("capacity", (str, list), default="on-demand", rules=(capacity, offered_capacity),
        doc="on-demand (the tutorial's), spot, reservation or flex-start; or an ordered list of them, best first"),
    Key("reservation", rules=(reservation,),
        doc="when capacity holds reservation, its name or projects/P/reservations/NAME"),
    Key("capacity_wait", int, rules=(capacity_wait,),
        doc="when capacity holds flex-start, seconds to wait for the slices' nodes (default 3600)"),
    Key("prices", dict, default={}, rules=(prices,),
        doc="USD per chip-hour per capacity option (on-demand: 2.7, reservation: 0, ...): they win over the Cloud "
            "Billing Catalog's v6e prices; a reservation is priced only here; default-pool (USD per node-hour) and "
            "cluster-fee (USD per hour) price the environment's other parts"),
    Key("controller", rules=(ssh_target,),
        doc="user@host[:port]: run the commands on this host over SSH (Cloud Shell, a bastion in the VPC)"),
    Key("gateway", rules=(needs_controller, ssh_target), doc="user@host[:port]: a jump host to the controller"),
    Key("identity_file", rules=(needs_controller, local_file("an SSH private key")),
        doc="the SSH private key for the controller (and gateway)"),
    Key("known_hosts", rules=(needs_controller, local_file("an SSH known_hosts file")),
        doc="the known_hosts file that holds the controller's host key (default ~/.ssh/known_hosts)"),
    Key("remote_dir", default="tpu-playbooks", rules=(remote_dir,),
        doc="on the controller: where manifests/ and trainer/ are synced (relative to its login directory)"),
    Key("control_plane", default="public", rules=(control_plane,),
        doc="public (the tutorial's), dns (the DNS-based endpoint) or internal (needs a controller in the VPC)"),
    # On by default: an automatic node upgrade recreates TPU nodes, so a run
    # loses a slice (a restart, replayed steps), while the hold costs nothing
    # when no job runs (it is removed when the job ends), is bounded
    # (maintenance.HOLD) and lets control-plane patches through. false: the
    # cluster's maintenance policy is left as it is (one managed elsewhere).
    Key("hold_maintenance", bool, default=True,
        doc="true: `train` adds a GKE maintenance exclusion (no minor or node upgrades) for the run, removed when "
            "the job ends; false: the cluster's maintenance policy is left alone"),
    Key("quarantine_replace_pool", bool, default=False, rules=(replace_pool,),
        doc="true: `hosts.quarantine` of a slice also makes its node pool again (deleted, then created as "
            "`nodepools` does: a multi-host slice is replaced whole); false: its nodes stay cordoned and tainted "
            "until `hosts.release`"),
    Key("stuck_pod", default="force", rules=(stuck_pod,),
        doc="what a pod delete of the plays (a quarantine's worker pods, chaos.delete-worker's and "
            "chaos.preempt-worker's pod) does with a pod still Terminating after stuck_pod_after (its node's kubelet "
            "dead: a NotReady node): force (deleted again with --grace-period=0 --force, one line saying why) or "
            "leave (said, left Terminating; the step goes on)"),
    Key("stuck_pod_after", int, default=STUCK_POD_AFTER,
        rules=(between(1, STUCK_POD_AFTER_MAX, "an hour: a watch waits that long for one pod"),),
        doc="seconds a pod delete waits for the pod to go (kubectl delete --timeout) before it counts as stuck "
            "(default 90: the worker pods' 30 s grace and a minute for the kubelet; a longer grace, as "
            "chaos.preempt-worker's --grace, adds its excess over 30 s)"),
    Key("reconnect_timeout", int, default=300,
        rules=(between(10, 24 * 3600, "a day: a link down that long is not coming back by itself"),),
        doc="seconds `train` and `logs --follow` keep trying to reach a running job again after the port-forward "
            "to its Ray dashboard dropped (started again, the log followed on from where it was)"),
    *STALL,
    *ELASTIC,
    *MAINTENANCE,
    *HEALTH,
    *SAVES,
)

LOCAL = (
    KIND,
    Key("slices", int, default=2, rules=(between(1, MAX_LOCAL_HOSTS, "each slice's hosts are Ray node processes "
                                                                     "on this machine"),),
        doc="simulated TPU slices"),
    Key("min_slices", int, derive=every_slice, rules=(min_slices,),
        doc="whole slices `up` waits for (default: every slice); the rest are named as waiting"),
    Key("rehearse_late_slice", int, rules=(late_slice,),
        doc="rehearsal: the last slice's hosts join this many seconds after they are started (1-3600; "
            "needs min_slices below slices)"),
    Key("tpu", default="v6e", rules=(local_tpu,),
        doc="the TPU generation the simulated hosts stand for (v5e, v5p, v6e, tpu7x): Ray's accelerator type, "
            "TPU_ACCELERATOR_TYPE and the valid topologies follow it"),
    Key("topology", default="2x2", rules=(local_topology,)),
    Key("chips_per_host", int, derive=default_chips_per_host, rules=(chips_per_host,)),
    Key("hosts_per_slice", int, derive=hosts_per_slice,
        rules=(lambda v, e: None if v == hosts_per_slice(e) else
               f"does not match topology {e['topology']!r} with {e['chips_per_host']} chips per host",
               local_hosts)),
    Key("devices_per_host", int, default=4,
        rules=(between(1, MAX_LOCAL_DEVICES, "CPU devices JAX makes per host process"),),
        doc="CPU devices each simulated TPU host gives JAX"),
    Key("ray_ip", default="127.0.0.2", rules=(loopback,)),
    Key("gcs_port", int, default=6390, rules=(port, local_ports)),
    Key("dashboard_port", int, default=8265,
        rules=(port, lambda v, e: "must differ from gcs_port" if v == e["gcs_port"] else None)),
    Key("train_overrides", dict, default={}, rules=(overrides,)),
    *STALL,
    *ELASTIC,
    *MAINTENANCE,
    *HEALTH,
    *SAVES,
)

def owned(env: Mapping) -> list[tuple[str, str, str]]:
    """What an environment owns, as (what, identity, shown): two
    environments owning the same identity would fight over it."""
    if not platform(env).cloud:
        return []
    p, loc = env["project_id"], env["region"] if MODES[env["mode"]].regional else env["zone"]
    out = []
    if dcn_networks(env):  # Autopilot, and a machine type without the two NICs, make none of the tutorial's networks
        out += [("cluster_name", f"net:{p}/{env['cluster_name']}-{T.SUBNETS[i][0]}",
                 f"network {env['cluster_name']}-{T.SUBNETS[i][0]} of project {p}") for i in (0, 1)]
        out += [(f"subnet_{i}_name", f"subnet:{p}/{env['region']}/{env[f'subnet_{i}_name']}",
                 f"subnet {env[f'subnet_{i}_name']} of {p} in {env['region']}") for i in (1, 2)]
    out.append(("gs_bucket", f"bucket:{env['gs_bucket']}", f"bucket gs://{env['gs_bucket']}"))
    out.append(("cluster_name", f"cluster:{p}/{loc}/{env['cluster_name']}",
                f"cluster {env['cluster_name']} of {p} in {loc}"))
    return out


def one_owner(envs: Mapping[str, Mapping]) -> str | None:
    """No two environments own the same thing: a network or subnet name in
    one project (and region), a bucket, a cluster, a port on this machine."""
    seen: dict[str, str] = {}
    for name, env in envs.items():
        for key, ident, text in owned(env):
            if seen.get(ident, name) != name:
                return (f"environments {seen[ident]!r} and {name!r} would both own the {text}: give one of "
                        f"them another {key}")
            seen[ident] = name
    taken: dict[int, list[tuple[str, str, str]]] = {}  # port -> (address, env, key)
    for name, env in envs.items():
        for span, addr, key in ports(env):
            for port in span:
                for other_addr, other, other_key in taken.get(port, ()):
                    if other != name and (not addr or not other_addr or addr == other_addr):
                        return (f"environments {other!r} ({other_key}) and {name!r} ({key}) would both listen "
                                f"on port {port}: give one of them another {key}")
                taken.setdefault(port, []).append((addr, name, key))
    return None


class Environment(Env):
    """An environment of this inventory: one annotation per key of either
    kind (a key of the other kind is not set: reading it is an
    AttributeError). ``test_inventory`` proves these are the schema's keys."""

    kind: str
    tpu: str
    slices: int
    min_slices: int
    topology: str
    chips_per_host: int
    hosts_per_slice: int
    dashboard_port: int
    train_overrides: dict[str, Any]
    stall_after: int | None
    stall_action: str
    stall_watch: str
    resize_interval: int | None
    start_retries: int
    resize_save_timeout: int
    max_failures: int
    failure_window: int
    maintenance_lead: int
    maintenance_start: str
    health_check: bool
    health_check_timeout: int
    health_check_hbm_fraction: float
    checkpoint_period: str | int
    interruption_mtbi_hours: float | None
    # gke
    project_id: str
    region: str
    zone: str
    cluster_name: str
    cluster_version: str
    mode: str
    gs_bucket: str
    ksa_name: str
    namespace: str
    user_identifier: str
    machine_type: str
    subnet_1_name: str
    subnet_2_name: str
    subnet_1_range: str
    subnet_2_range: str
    ray_image: str
    worker_packages: str
    capacity: str | list[str]  # one option, or a list best first: capacities(env)
    reservation: str | None
    capacity_wait: int | None
    prices: dict[str, float]
    controller: str | None
    gateway: str | None
    identity_file: str | None
    known_hosts: str | None
    remote_dir: str
    control_plane: str
    hold_maintenance: bool
    quarantine_replace_pool: bool
    stuck_pod: str
    stuck_pod_after: int
    reconnect_timeout: int
    # local
    rehearse_late_slice: int | None
    devices_per_host: int
    ray_ip: str
    gcs_port: int

    # The inventory's choices, each its record (config/choices.py).
    @property
    def platform(self) -> Platform:
        """Its kind: where its cluster is (the twin on this machine, or GKE)."""
        return PLATFORMS[self.kind]

    @property
    def cluster_mode(self) -> ClusterMode:
        """A GKE environment's mode, Standard or Autopilot (a local one has none)."""
        return MODES[self.mode]

    @property
    def options(self) -> tuple[CapacityOption, ...]:
        """Its capacity options, best first (a local one has none)."""
        return capacity_records(self)


SCHEMA = Schema({"gke": GKE, "local": LOCAL}, default_kind="gke", across=one_owner, env_type=Environment)


def load_inventory(path: str | Path | None = None) -> Inventory:
    return load(path or DEFAULT_INVENTORY, SCHEMA)
