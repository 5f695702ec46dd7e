"""A pod's delete, bounded (``playbooks/cloud/pod_delete.py``): the
commands carry their bound (kubectl's --timeout, the connector's timeout
after it) and the kubernetes client answers them (the watch in a head pod
has no kubectl); after a failed delete, what the fresh looks find decides:
a stuck pod forced or left once, a pod not deleted yet deleted once more,
else the failure stands (never a loop)."""
from __future__ import annotations

from typing import Any

from playbooks.access.kube_api import parse_write
from playbooks.cloud import pod_delete as D
from playbooks.core.facts import ABSENT, Fact
from playbooks.core.step import CHANGE
from tests.conftest import env

POD, NODE = "maxtext-tpu-cluster-tpu-group-worker-ab12c", "gke-v6e-16-0-abcd1234-0001"


def pod(terminating: bool) -> dict:
    md: dict[str, Any] = {"name": POD, **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if terminating else {})}
    return {"metadata": md, "spec": {"nodeName": NODE}}


NOT_READY = {"metadata": {"name": NODE}, "status": {"conditions": [
    {"type": "Ready", "status": "Unknown", "message": "Kubelet stopped posting node status."}]}}


def looking(pods: dict[str, Any]):
    """A look that answers each pod from ``pods`` (ABSENT: gone) and the node NotReady."""
    def look(f: Fact) -> Any:
        return NOT_READY if f.name == f"node {NODE}" else pods[f.name.removeprefix("pod ")]
    return look


def argv(c) -> list[str]:
    return list(c.argv)


def test_each_delete_says_its_bound_and_the_client_answers_it():
    e = env("dev", stuck_pod_after=90)
    assert D.bound(e) == 90 and D.bound(e, 15) == 90 and D.bound(e, 120) == 180   # a longer grace adds its excess
    plain, graced, forced = D.delete(e, POD), D.delete(e, POD, 120), D.force(e, POD)
    assert "--timeout=90s" in argv(plain) and plain.timeout == 90 + D.BACKSTOP_S
    assert {"--grace-period=120", "--timeout=180s"} <= set(argv(graced)) and graced.timeout == 180 + D.BACKSTOP_S
    assert {"--grace-period=0", "--force", f"--timeout={D.FORCE_TIMEOUT_S}s"} <= set(argv(forced))
    for c, grace, force, wait in ((plain, None, False, 90), (graced, 120, False, 180),
                                  (forced, 0, True, D.FORCE_TIMEOUT_S)):
        w = parse_write(argv(c))
        assert w is not None, argv(c)
        assert (w.name, w.namespace, w.grace, w.force, w.wait_s) == (POD, e.namespace, grace, force, wait)


def test_a_stuck_pod_is_forced_once_then_the_failure_stands():
    e = env("dev", stuck_pod="force", stuck_pod_after=5)
    then = ("# recorded",)
    instead = D.when_stuck(e, [POD], None, "deleted it", then)
    nxt = instead(looking({POD: pod(True)}), "timed out")
    assert nxt is not None and nxt.kind == CHANGE
    assert [argv(c) if hasattr(c, "argv") else c for c in nxt.commands] == [argv(D.force(e, POD)), "# recorded"]
    said = (f"pod {POD} still Terminating after 5s: its node {NODE} is NotReady (Kubelet stopped posting node "
            f"status.); force-deleted (stuck_pod: force)")
    assert nxt.notes == (said,) and nxt.reason == f"deleted it; {said}"
    assert nxt.instead is not None and nxt.instead(looking({POD: pod(True)}), "x") is None   # a finalizer holds it


def test_a_stuck_pod_is_left_and_the_change_goes_on():
    e = env("dev", stuck_pod="leave", stuck_pod_after=5)
    left: set[str] = set()
    nxt = D.when_stuck(e, [POD], 20, "deleted it", (), left)(looking({POD: pod(True)}), "timed out")
    assert nxt is not None and nxt.commands == () and left == {POD}
    assert nxt.notes[0].endswith("; left (stuck_pod: leave)")


def test_a_pod_not_deleted_yet_is_deleted_once_more_and_a_failure_of_another_kind_stands():
    e = env("dev", stuck_pod_after=5)
    instead = D.when_stuck(e, [POD, "other"], None, "deleted them")
    # The change stopped at POD (refused): neither is Terminating; each deleted once more.
    nxt = instead(looking({POD: pod(False), "other": pod(False)}), "Forbidden")
    assert nxt is not None and [argv(c) for c in nxt.commands] == [argv(D.delete(e, POD)), argv(D.delete(e, "other"))]
    assert nxt.instead is not None and nxt.instead(looking({POD: pod(False), "other": ABSENT}), "Forbidden") is None
    # Nothing there to force or delete again (a pod that was never there): the failure stands.
    assert D.when_stuck(e, [POD], None, "deleted it")(looking({POD: ABSENT}), "NotFound") is None
