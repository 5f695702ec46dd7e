"""A fake Ray dashboard (plain HTTP on 127.0.0.1), standing in for the
port-forwarded head service: /api/version, the state API's node list
built from the fake cluster's running Ray pods (head + TPU workers: a pod
that is Pending has no Ray node), and the Jobs API: its list (no jobs
unless a test adds some), a job's details, its log whole and its log's
tail (the WebSocket `ray job logs --follow` and the Jobs SDK read: each
line as a text message, the connection closed normally at the job's end),
as Ray 2.60's dashboard answers them (ray/dashboard/modules/job/); the
State API's actors (filtered as Ray filters them) and a worker's Python
stack, ``/worker/traceback`` (ray/dashboard/modules/reporter/
reporter_head.py: 403 while profiling is off, py-spy's text, or its
failure as a 500; an answer a test holds back, as a dump that never
returns)."""
from __future__ import annotations

import base64
import hashlib
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from .server import Fake, FakeServer, Request, Response

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455
ACTIVE = ("PENDING", "RUNNING")


def ws_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    """One unmasked server frame (RFC 6455 5.2), FIN set."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + struct.pack("!H", n)
    else:
        head += bytes([127]) + struct.pack("!Q", n)
    return head + payload

RAY_VERSION = "2.60.0"


class FakeDashboard(Fake):
    def __init__(self, pods: Callable[[], list[dict]]):
        self.pods = pods            # the Ray pods the dashboard would see
        self.jobs: list[dict] = []  # JobDetails, as GET /api/jobs/ lists them
        self.logs: dict[str, list[str]] = {}  # submission id -> its log's lines so far
        self.changed = threading.Condition()
        # The State API's actors (ActorState, detail=false) and what each
        # worker's /worker/traceback answers: (status, text), or a number:
        # seconds before its answer (a py-spy dump that does not return).
        self.actors: list[dict] = []
        self.stacks: dict[tuple[str, int], tuple[int, str] | float] = {}
        self.profiling = True  # RAY_DASHBOARD_ENABLE_PROFILING=1 on the head
        self.server = FakeServer("dashboard", None, self.handle)
        self.port = self.server.port

    # -- a job a test drives --------------------------------------------------
    def add_job(self, sid: str, entrypoint: str, status: str = "RUNNING") -> dict:
        now = int(time.time() * 1000)
        job = {"type": "SUBMISSION", "job_id": None, "submission_id": sid, "driver_info": None, "status": status,
               "entrypoint": entrypoint, "message": f"Job is currently {status.lower()}.", "error_type": None,
               "start_time": now, "end_time": None, "metadata": {}, "runtime_env": {},
               "driver_agent_http_address": None, "driver_node_id": None, "driver_exit_code": None}
        with self.changed:
            assert self.job(sid) is None, f"job {sid} already exists (Ray refuses a submission id twice)"
            self.jobs.append(job)
            self.logs[sid] = []
        return job

    def add_worker(self, node_id: str, pid: int, stack: tuple[int, str] | float | str = "",
                   state: str = "ALIVE", class_name: str = "RayTrainWorker") -> dict:
        """A training worker's actor, and what its stack read answers (a
        text: py-spy's dump, 200)."""
        actor = {"actor_id": f"{len(self.actors):032x}", "class_name": class_name, "state": state,
                 "job_id": "02000000", "name": "", "node_id": node_id, "pid": pid, "ray_namespace": "_ray_train"}
        self.actors.append(actor)
        self.stacks[(node_id, pid)] = (200, stack) if isinstance(stack, str) else stack
        return actor

    def reset(self) -> None:
        """No jobs: what the next test's cluster starts with."""
        with self.changed:
            self.jobs.clear()
            self.logs.clear()
            self.actors.clear()
            self.stacks.clear()
            self.profiling = True
            self.changed.notify_all()

    def log(self, sid: str, *lines: str) -> None:
        with self.changed:
            self.logs[sid] += lines
            self.changed.notify_all()

    def end(self, sid: str, status: str = "SUCCEEDED") -> None:
        with self.changed:
            job = self.job(sid)
            assert job is not None
            job.update(status=status, end_time=int(time.time() * 1000), message=f"Job finished: {status}.",
                       driver_exit_code=0 if status == "SUCCEEDED" else 1)
            self.changed.notify_all()

    def job(self, sid: str) -> dict | None:
        return next((j for j in self.jobs if j["submission_id"] == sid), None)

    # -- serving ----------------------------------------------------------------
    def handle(self, req: Request) -> Response:
        parts = req.path.strip("/").split("/")
        if parts[:2] == ["api", "jobs"] and len(parts) >= 3 and parts[2]:
            return self.job_answer(req, parts[2], parts[3:])
        if req.path == "/api/v0/actors":
            return Response(200, self.state_answer(self.filtered(self.actors, req)))
        if req.path == "/worker/traceback":
            return self.traceback(req)
        return Response(*self.answer(req.path))

    def job_answer(self, req: Request, sid: str, rest: list[str]) -> Response:
        job = self.job(sid)
        if job is None:
            return Response(404, {"result": False, "msg": f"Job {sid} does not exist"})
        if rest == []:
            return Response(200, dict(job))
        if rest == ["logs"]:
            with self.changed:
                return Response(200, {"logs": "".join(line + "\n" for line in self.logs[sid])})
        if rest == ["logs", "tail"] and req.headers.get("upgrade", "").lower() == "websocket":
            accept = base64.b64encode(hashlib.sha1((req.headers["sec-websocket-key"] + WS_GUID).encode()).digest())
            return Response(101, headers={"Upgrade": "websocket", "Connection": "Upgrade",
                                          "Sec-WebSocket-Accept": accept.decode()},
                            takeover=lambda h: self.tail(h, sid))
        return Response(404, {"result": False, "msg": f"fake dashboard: no route {req.path}"})

    def tail(self, h: Any, sid: str) -> None:
        """The log's lines as they come, each a text message; at the job's
        end, a normal close (1000)."""
        sent = 0
        while True:
            with self.changed:
                lines = self.logs.get(sid, [])[sent:]
                done = (self.job(sid) or {}).get("status") not in ACTIVE
                if not lines and not done:
                    self.changed.wait(0.5)
                    continue
            for line in lines:
                h.wfile.write(ws_frame((line + "\n").encode()))
            h.wfile.flush()
            sent += len(lines)
            if done and not lines:
                h.wfile.write(ws_frame(struct.pack("!H", 1000), opcode=0x8))
                h.wfile.flush()
                return

    @staticmethod
    def filtered(rows: list[dict], req: Request) -> list[dict]:
        """The State API's filters (ray/dashboard/state_api_utils.py): each
        filter_keys/filter_predicates/filter_values triple, all of them."""
        q = req.query_all
        keys, preds, vals = q.get("filter_keys", []), q.get("filter_predicates", []), q.get("filter_values", [])
        assert len(keys) == len(preds) == len(vals), "Ray asserts as many filter keys as values"
        out = rows
        for k, p, v in zip(keys, preds, vals, strict=True):
            assert p in ("=", "!="), f"Ray supports = and != only, not {p!r}"
            out = [r for r in out if (str(r.get(k)) == v) == (p == "=")]
        return out

    @staticmethod
    def state_answer(rows: list[dict]) -> dict:
        return {"result": True, "msg": "", "data": {"result": {
            "total": len(rows), "num_after_truncation": len(rows), "num_filtered": len(rows),
            "result": rows, "partial_failure_warning": "", "warnings": None}}}

    def traceback(self, req: Request) -> Response:
        if not self.profiling:
            return self.text(403, "Profiling is disabled by default for security reasons. To enable profiling, set "
                                  "the environment variable RAY_DASHBOARD_ENABLE_PROFILING=1 on the Ray head node. "
                                  "See https://docs.ray.io/en/latest/ray-observability/user-guides/profiling.html "
                                  "for details.")
        node, pid = req.query.get("node_id"), req.query.get("pid")
        if not pid or not node:  # Ray raises ValueError: aiohttp's own 500
            return self.text(500, "500 Internal Server Error\n\nServer got itself in trouble")
        answer = self.stacks.get((node, int(pid)))
        if answer is None:
            if not any(a["node_id"] == node for a in self.actors):
                return self.text(500, f"Failed to get agent address for node at node_id {node}")
            answer = (500, f"Failed to execute `['/usr/bin/py-spy', 'dump', '-p', '{pid}']`.\n\n=== stderr ===\n"
                           f"Error: Failed to find python version from target process\n\n\n=== stdout ===\n\n")
        if isinstance(answer, (int, float)):
            time.sleep(answer)
            return self.text(200, "")
        return self.text(*answer)

    @staticmethod
    def text(status: int, body: str) -> Response:
        return Response(status, body.encode(), {"Content-Type": "text/plain; charset=utf-8"})

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
