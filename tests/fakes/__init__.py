"""Loopback fakes of the cloud the playbooks drive: GCP REST APIs
(``gcp``), a GKE cluster's Kubernetes API (``kube``), a Ray dashboard
(``dashboard``), and the harness that points the real gcloud, gsutil,
kubectl and ray clients at them (``cloud``)."""
