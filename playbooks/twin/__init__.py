"""The local twin: a Ray cluster on this machine standing in for the
RayCluster on GKE, a head and simulated TPU hosts (``nodes``: what each node
is, its command, pid file, temp folder and log, and what Ray says of it),
a node's start as a step's change and its verify (``node_start``), a
host's process, which runs `ray start` and starts it again when it fails to
start, after a late host's wait, having first set aside the logs of the
workers that died with the host (``host_process``), and the
twin's way to act on a host for the chaos play: kill, bring back, freeze,
resume, sicken (fewer JAX devices than its chips) and heal (``chaos_twin``),
and its simulated host maintenance, the schedule the watch reads as GKE's
node labels (``maintenance_sim``).
The play that starts and stops them is ``playbooks/plays/local_cluster.py``;
the chaos play is ``playbooks/plays/chaos.py``.

May import ``playbooks.core``, ``playbooks.config``, ``playbooks.access`` and
``playbooks.cloud``.
"""
