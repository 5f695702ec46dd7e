"""Which answers a change may have made stale: the Runner's cache policy
(``Runner(stale=...)``).

Without it, every change clears every answer the run looked up (the
engine's safe default), and an answer prefetched for a later step (the
bucket, the project's IAM policy) is read again after a change that cannot
have touched it (a node pool). A change here clears what it can change, by
the family of its command:

- ``gcloud compute`` (networks, subnets, firewall rules): compute reads;
- ``gcloud storage`` / ``gsutil`` (a bucket, its IAM policy): storage reads;
- ``gcloud container`` (a cluster, a node pool, a maintenance exclusion,
  get-credentials): GKE reads, and what a cluster or its nodes change
  elsewhere: compute (instances, reservations in use), quotas (chips in
  use), kubectl (a new kubeconfig context, new nodes);
- ``kubectl`` (apply, delete, label): kubectl reads, and what pods change
  (Autopilot makes node pools and nodes for them): GKE, compute and quotas.

Anything else clears every answer: ``gcloud services enable`` (an API
turned on changes what can be read), a role granted with ``gcloud projects
add-iam-policy-binding`` (a read denied before may be allowed now),
``gcloud iam``, ray, the local twin's processes, in-process actions. An
in-process fact (the Kubernetes client, an HTTP read, a pid file) is always
cleared, whatever changed; so is a fact whose command is not one of the
families above.

A step's verify always looks afresh, whatever this says.
"""
from __future__ import annotations

import os

from playbooks.core.command import Command
from playbooks.core.facts import Action, Fact

COMPUTE, STORAGE, CONTAINER, QUOTAS, KUBECTL = (
    "gcloud compute", "gcloud storage", "gcloud container", "gcloud quotas", "kubectl")

# What a change of each family may change; a family not here changes everything.
CHANGES: dict[str, frozenset[str]] = {
    COMPUTE: frozenset({COMPUTE}),
    STORAGE: frozenset({STORAGE}),
    CONTAINER: frozenset({CONTAINER, COMPUTE, QUOTAS, KUBECTL}),
    KUBECTL: frozenset({KUBECTL, CONTAINER, COMPUTE, QUOTAS}),
}
# gcloud's release tracks: `gcloud beta quotas info` is a quotas read.
_TRACKS = ("alpha", "beta")


def family(command: Command) -> str | None:
    """The family of a command (the last of a pipe: the one that acts or
    answers), or None when it is none of the known ones."""
    argv = command.argv
    tool = os.path.basename(argv[0]) if argv else ""
    if tool == "kubectl":
        return KUBECTL
    if tool == "gsutil":
        return STORAGE
    if tool != "gcloud":
        return None
    words = [a for a in argv[1:] if not a.startswith("-")]
    while words and words[0] in _TRACKS:
        words = words[1:]
    return f"gcloud {words[0]}" if words else None


def stale(change: Command | Action, fact: Fact) -> bool:
    """May ``change`` have changed the answer of ``fact``?"""
    if fact.command is None or isinstance(change, Action):
        return True
    what = family(fact.command)
    touched = CHANGES.get(family(change) or "")
    return what is None or touched is None or what in touched
