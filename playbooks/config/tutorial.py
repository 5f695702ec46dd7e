"""The tutorial's constants, in one place, as it writes them.

"Train Llama 3 70B with MaxText, Ray Train and multislice Trillium (TPU v6e)
on GKE with KubeRay and DRANET". Every value here is quoted from it; the
plays build their commands from these and from the inventory.
"""
from __future__ import annotations

# §1 Project prerequisites
SERVICES = ("container.googleapis.com", "cloudbuild.googleapis.com")
USER_ROLES = ("roles/container.admin", "roles/iam.serviceAccountAdmin", "roles/cloudbuild.builds.editor")

# §2 Networking for multislice (DCN)
NETWORK_MTU = 8896
SUBNETS = (  # (network suffix, subnet name, default range)
    ("net-1", "tpu-subnet-1", "10.50.0.0/16"),
    ("net-2", "tpu-subnet-2", "10.60.0.0/16"),
)

# §3 GKE cluster
CLUSTER_MACHINE_TYPE = "n1-standard-16"
STANDARD_ADDONS = "RayOperator,GcsFuseCsiDriver"
# Managed DRANET needs at least these versions.
DRANET_MIN_VERSION = {"autopilot": "1.35.2-gke.1842000", "standard": "1.34.1-gke.1829001"}
CLUSTER_VERSION = "1.35.2-gke.1842000"

# §4 TPU node pools
TPU_NODE_LABEL = "cloud.google.com/gke-networking-dra-driver=true"
TPU_SCOPES = "https://www.googleapis.com/auth/cloud-platform"
# The tutorial's v6e values are its record in tpu.py, beside the other
# generations': --threads-per-core=1 is the tutorial's own, in its
# node-pools create on ct6e-standard-4t (its source,
# ../shared/seeds/000_be27905aeb5332c0.txt line 111: [S29] of
# docs/tpu-generations.md); the machine types and topologies, tpu-v6e-slice
# and TPU-V6E are the record's, each with its source.

# §5 Storage and identity
BUCKET_STORAGE_CLASS = "STANDARD"
BUCKET_ROLE = "roles/storage.objectUser"
# Where the Ray pods mount the bucket (GCS FUSE), the jobs' base_output_directory.
BUCKET_MOUNT = "/data/"

# §7 RayCluster
RAYCLUSTER_NAME = "maxtext-tpu-cluster"
RAYCLUSTER_MANIFEST = "manifests/ray-cluster.tpu-multi-slice.yaml"
HEAD_SERVICE = "maxtext-tpu-cluster-head-svc"
DASHBOARD_PORT = 8265
WORKER_SELECTOR = "ray.io/node-type=worker"
TPU_WORKER_GROUP = "tpu-group"
# The DRANET NIC claim of a TPU worker: the tutorial's on Standard; on
# Autopilot the one GKE's sample pairs with the accelerator network profile auto.
NETDEV_CLAIMS = {"standard": "two-netdev", "autopilot": "all-netdev"}

# §8 Training jobs: the MaxText arguments, in the tutorial's order, per model.
TRAIN_ARGS = {
    "llama3-8b": (
        ("base_output_directory", "/data/"),
        ("dataset_type", "synthetic"),
        ("per_device_batch_size", "4"),
        ("max_target_length", "4096"),
        ("model_name", "llama3-8b"),
        ("steps", "100"),
        ("ici_fsdp_parallelism", "4"),
        ("ici_tensor_parallelism", "4"),
        ("run_name", "rayjob-multi-slice"),
    ),
    "llama3-70b": (
        ("base_output_directory", "/data/"),
        ("dataset_type", "synthetic"),
        ("per_device_batch_size", "2"),
        ("max_target_length", "4096"),
        ("model_name", "llama3-70b"),
        ("steps", "100"),
        ("ici_tensor_parallelism", "4"),
        ("ici_fsdp_parallelism", "4"),
        ("dcn_fsdp_parallelism", "2"),
        ("dcn_data_parallelism", "1"),
        ("remat_policy", "full"),
        ("run_name", "rayjob-multi-slice-70b-fsdp"),
    ),
}
# §9 Elastic training: the same job through the elastic trainer, its own run_name.
ELASTIC_RUN_NAME = {"llama3-8b": "rayjob-elastic-8b", "llama3-70b": "rayjob-elastic-70b-fsdp"}
TRAINER = "maxtext_multi_slice_trainer.py"
ELASTIC_TRAINER = "maxtext_elastic_trainer.py"
BASE_CONFIG = "base.yml"
RUNTIME_EXCLUDES = ("ray-env", ".git")
