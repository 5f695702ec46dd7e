"""A fake Ray dashboard (plain HTTP on 127.0.0.1), standing in for the
port-forwarded head service: /api/version, the state API's node list
built from the fake cluster's running Ray pods (head + TPU workers: a pod
that is Pending has no Ray node), and the Jobs API's list (no jobs unless
a test adds some)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .server import Fake, FakeServer, Request, Response

RAY_VERSION = "2.60.0"


class FakeDashboard(Fake):
    def __init__(self, pods: Callable[[], list[dict]]):
        self.pods = pods            # the Ray pods the dashboard would see
        self.jobs: list[dict] = []  # JobDetails, as GET /api/jobs/ lists them
        self.server = FakeServer("dashboard", None, self.handle)
        self.port = self.server.port

    def handle(self, req: Request) -> Response:
        return Response(*self.answer(req.path))

    def nodes(self) -> list[dict]:
        out = []
        for i, pod in enumerate(self.pods()):
            labels = pod["metadata"].get("labels") or {}
            head = labels.get("ray.io/node-type") == "head"
            res = {"CPU": 8.0, "memory": 17179869184.0}
            node_labels = {"ray.io/node-id": f"{i:056x}"}
            if not head:
                res.update({"TPU": 4.0, "accelerator_type:TPU-V6E": 1.0})
                # Ray labels a TPU host from the TPU_NAME and TPU_WORKER_ID
                # GKE's TPU webhook sets on the pod: its replica and host.
                node_labels.update({"ray.io/tpu-slice-name": f"{labels.get('ray.io/group')}-{pod.get('_replica', 0)}",
                                    "ray.io/tpu-worker-id": str(pod.get("_host", 0))})
            out.append({"node_id": f"{i:056x}", "node_ip": f"10.0.0.{i + 2}", "is_head_node": head,
                        "state": "ALIVE", "state_message": None, "node_name": pod["metadata"]["name"],
                        "resources_total": res, "labels": node_labels,
                        "start_time_ms": 1700000000000, "end_time_ms": 0})
        return out

    def answer(self, path: str) -> tuple[int, Any]:
        if path == "/api/version":
            return 200, {"version": "4", "ray_version": RAY_VERSION, "ray_commit": "0" * 40,
                         "session_name": "session_fake"}
        if path == "/api/v0/nodes":
            nodes = self.nodes()
            return 200, {"result": True, "msg": "", "data": {"result": {
                "total": len(nodes), "num_after_truncation": len(nodes), "num_filtered": len(nodes),
                "result": nodes, "partial_failure_warning": "", "warnings": None}}}
        if path == "/api/jobs/":
            return 200, self.jobs
        return 404, {"result": False, "msg": f"fake dashboard: no route {path}"}
