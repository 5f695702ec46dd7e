"""How the project reaches what it drives: where commands run (``connectors``:
this machine, or a controller host over SSH), how the command-line clients
are called and their output read (``cli_clients``: a proven NotFound, a value,
or "could not look"; ``gcloud_parse``: gcloud's own parser, offline), gcloud's
credentials and properties read once per run (``gcloud_credentials``), the
gcloud reads the probes start most answered by Google's REST APIs
(``gcp_api``), kubectl answered by the kubernetes client (``kube_api``), Ray's HTTP APIs
(``ray_api``), the training workers' Python stacks read through Ray's
dashboard (``worker_stacks``), which cached answers a change may have made stale
(``staleness``), and a record of hosts in a JSON file of this machine's
(``host_records``).

Knows no GKE resource and no play. May import ``playbooks.core`` and
``playbooks.config``.
"""
