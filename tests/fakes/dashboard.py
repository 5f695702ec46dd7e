"""A fake Ray dashboard (plain HTTP on 127.0.0.1), standing in for the
port-forwarded head service: /api/version, and the state API's node list
built from the fake cluster's Ray pods (head + TPU workers)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import urlsplit

RAY_VERSION = "2.60.0"


class FakeDashboard:
    def __init__(self, pods: Callable[[], list[dict]]):
        self.pods = pods            # the Ray pods the dashboard would see
        self.paths: list[str] = []
        me = self

        class _H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                path = urlsplit(self.path).path
                me.paths.append(path)
                status, body = me.answer(path)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="fake-dashboard", daemon=True)

    def start(self) -> "FakeDashboard":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def nodes(self) -> list[dict]:
        out = []
        for i, pod in enumerate(self.pods()):
            labels = pod["metadata"].get("labels") or {}
            head = labels.get("ray.io/node-type") == "head"
            res = {"CPU": 8.0, "memory": 17179869184.0}
            if not head:
                res.update({"TPU": 4.0, "accelerator_type:TPU-V6E": 1.0})
            out.append({"node_id": f"{i:056x}", "node_ip": f"10.0.0.{i + 2}", "is_head_node": head,
                        "state": "ALIVE", "state_message": None, "node_name": pod["metadata"]["name"],
                        "resources_total": res, "labels": {"ray.io/node-id": f"{i:056x}"},
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
        return 404, {"result": False, "msg": f"fake dashboard: no route {path}"}
