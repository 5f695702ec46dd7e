"""The local twin: a Ray cluster on this machine standing in for the
RayCluster on GKE, a head and simulated TPU hosts (``nodes``: what each node
is, its command, pid file, temp folder and log, and what Ray says of it).
The play that starts, stops and kills them is ``playbooks/plays/local_cluster.py``.

May import ``playbooks.core``, ``playbooks.config``, ``playbooks.access`` and
``playbooks.cloud``.
"""
