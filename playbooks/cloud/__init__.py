"""What Google Cloud, GKE, Kubernetes and the RayCluster are, and how to
read and change them: names and list facts (``gke``), the kubeconfig's
contexts and whether one points at the cluster GKE has now
(``kube_context``), what a pod is (``pods``: its slice, ready,
its conditions and restarts), why the RayCluster's workers are not running,
from its pods and events (``kube_objects``), whole TPU slices as Kubernetes and Ray see them
(``slices``), the rendered manifests (``manifests``), a run's maintenance
exclusion (``maintenance``), the capacity options and the plan per slice
(``capacity_options``, ``capacity_plan``), a pool's node system
configuration: a Spot pool's graceful termination lengthened, how gcloud
is given it, what a pool read back lacks (``node_shutdown``), what a v6e chip-hour costs per
option (``prices``: the inventory's, else the Cloud Billing Catalog's),
what the cluster's CPU pool and fee cost by the hour and the plan's line of
every part (``cluster_prices``), what the environment costs while it
stands, its node pools and cluster fee (``env_cost``), what bills while
the TPUs are off and what a teardown keeps: the bucket's bytes, the parts
besides the TPUs (``still_billed``), where a Ray dashboard answers (``endpoints``), GKE's way to
act on a TPU host for the chaos play: a worker pod deleted, its trainer
stopped and resumed (``chaos_gke``), a pod's delete bounded, a pod still
Terminating after it force-deleted or left (``pod_delete``), what is coming for each slice: its
nodes' scheduled host maintenance, a flex-start pool's end
(``slice_ends``).

Facts and commands, no steps. May import ``playbooks.core``,
``playbooks.config`` and ``playbooks.access``.
"""
