"""How long a Spot preemption gives the job's pods, and how this project
lengthens it: pure facts and words (``choices.py`` gives an environment's
Spot option these seconds; ``cloud/node_shutdown.py`` sets them on a pool).

- The default. "By default, GKE clusters give Pods a 30-second graceful
  termination period after receiving a preemption notice", split in two:
  "the first 15 seconds to shut down your Pods, then 15 seconds for
  critical system Pods" (GKE's Spot VMs page, "Termination and graceful
  shutdown of Spot VMs", ``SPOT_VMS``).
- Up to 120 s. The same page: the period "can be extended to 120
  seconds"; on Standard node pools "the cluster's control plane must run
  GKE version 1.35.0-gke.1171000 or later", set per node pool by
  customizing its node system configuration; through a custom ComputeClass
  otherwise. The fields (GKE's API reference, ``NodeKubeletConfig``, as
  ``KUBELET_FIELDS`` lists it): ``shutdownGracePeriodSeconds``, "the total
  duration that the node should delay the shutdown", "only valid for Spot
  VMs. Allowed values: 0, 30, 120"; ``shutdownGracePeriodCriticalPodsSeconds``,
  the part of it for critical pods, "<= shutdown_grace_period_seconds",
  "Range: [0, 120]". The kubelet gives the other pods the total less the
  critical part (Kubernetes' graceful node shutdown, ``NODE_SHUTDOWN``).
  This project keeps the critical pods' 15 s of the default: the job's pods
  get 120 - 15 = 105 s.
- gcloud. `gcloud container node-pools create|update
  --system-config-from-file` reads both keys under ``kubeletConfig`` from
  gcloud 555.0.0 (2026-02-18; its api_lib/container/util.py
  ``NC_SHUTDOWN_GRACE_PERIOD_SECONDS``); gcloud 528.0.0 refuses them
  ("unknown fields ... in kubeletConfig": its LoadSystemConfigFromYAML).
- Autopilot has no node pool of ours to set it on. A custom ComputeClass
  may carry the node system configuration (the Spot VMs page's other
  route); this project does not take that route (not verified here for
  Autopilot's TPU ComputeClass): on Autopilot the job's pods keep the
  default 15 s.
"""
from __future__ import annotations

import re

SPOT_VMS = "https://docs.cloud.google.com/kubernetes-engine/docs/concepts/spot-vms"
KUBELET_FIELDS = "https://docs.cloud.google.com/kubernetes-engine/docs/reference/mcp/tools_list/list_node_pools"
NODE_SHUTDOWN = "https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/"

# What the job's pods get by default, and the lengthened period's parts.
DEFAULT_PODS_S = 15
SHUTDOWN_S = 120               # shutdownGracePeriodSeconds: one of ALLOWED_SHUTDOWN_S
ALLOWED_SHUTDOWN_S = (0, 30, 120)
CRITICAL_S = 15                # shutdownGracePeriodCriticalPodsSeconds: 0 to SHUTDOWN_S
PODS_S = SHUTDOWN_S - CRITICAL_S
KUBELET_CONFIG = {"shutdownGracePeriodSeconds": SHUTDOWN_S, "shutdownGracePeriodCriticalPodsSeconds": CRITICAL_S}
# The first Standard control plane that takes it, and the first gcloud that sends it.
MIN_GKE = "1.35.0-gke.1171000"
MIN_GCLOUD = "555.0.0"

DEFAULT_NOTICE = ("a Spot preemption notice: GKE gives pods 30 s of graceful termination, the first 15 s to the "
                  "job's pods")
LONG_NOTICE = (f"a Spot preemption notice: this project's Spot node pools give pods {SHUTDOWN_S} s of graceful "
               f"termination, the first {PODS_S} s to the job's pods (their node system configuration: kubeletConfig "
               f"shutdownGracePeriodSeconds={SHUTDOWN_S}, shutdownGracePeriodCriticalPodsSeconds={CRITICAL_S}; "
               f"GKE {MIN_GKE} or later, gcloud {MIN_GCLOUD} or later)")

_GKE = re.compile(r"^(\d+)\.(\d+)\.(\d+)-gke\.(\d+)$")


def _gke(v: str) -> tuple[int, ...] | None:
    m = _GKE.match(v or "")
    return tuple(int(x) for x in m.groups()) if m else None


def blocker(our_node_pools: bool, cluster_version: str) -> str | None:
    """Why a Spot slice of a cluster cannot give the job's pods ``PODS_S``
    (None: its pools can, and this project sets it)."""
    if not our_node_pools:
        return ("Autopilot: no node pool of ours to lengthen it on (120 s takes a Standard node pool's node system "
                "configuration, or a custom ComputeClass's, which this project does not set)")
    have, need = _gke(cluster_version), _gke(MIN_GKE)
    if have is None or need is None or have < need:
        return (f"cluster_version {cluster_version} is older than {MIN_GKE}, the first that lengthens it to "
                f"{SHUTDOWN_S} s on a Standard node pool: set cluster_version: to a later one")
    return None


def gcloud_blocker(version: str) -> str | None:
    """Why this gcloud cannot send the pool's kubeletConfig (None: it can)."""
    try:
        have = tuple(int(x) for x in str(version).split("."))
    except ValueError:
        return f"gcloud's version {version!r} is not read"
    if have < tuple(int(x) for x in MIN_GCLOUD.split(".")):
        return (f"gcloud {version} does not send kubeletConfig.shutdownGracePeriodSeconds (gcloud {MIN_GCLOUD} or "
                f"later does: `gcloud components update`)")
    return None
