"""A small HTTPS (or plain HTTP) server for the fakes: every request
recorded, faults injectable, handlers written as plain functions of a
``Request``."""
from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from .tls import Pki

MUTATING = ("POST", "PUT", "PATCH", "DELETE")


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    raw: bytes
    at: float = field(default_factory=time.time)
    status: int = 0
    query_all: dict[str, list[str]] = field(default_factory=dict)  # each key's every value, in order

    @property
    def body(self) -> Any:
        if not self.raw:
            return None
        try:
            return json.loads(self.raw)
        except ValueError:
            return self.raw.decode(errors="replace")

    @property
    def mutating(self) -> bool:
        return self.method in MUTATING

    def __repr__(self) -> str:
        return f"{self.method} {self.path} -> {self.status}"


@dataclass
class Response:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    # An upgraded connection (a WebSocket): after the status and headers,
    # this writes to the socket itself until it is done.
    takeover: Callable[[BaseHTTPRequestHandler], None] | None = None

    def encode(self) -> tuple[bytes, str]:
        if self.body is None:
            return b"", "application/json"
        if isinstance(self.body, bytes):
            return self.body, self.headers.get("Content-Type", "application/octet-stream")
        return json.dumps(self.body).encode(), "application/json"


class HttpError(Exception):
    """Raised by a handler: answer with this status and body."""

    def __init__(self, status: int, body: Any = None):
        super().__init__(status)
        self.status, self.body = status, body


@dataclass
class Fault:
    """Answer ``status``/``body`` instead of the handler for requests whose
    method matches and whose path matches ``path`` (a regex, searched), for
    ``times`` matching requests after skipping the first ``skip``.
    ``after``: the handler runs first (the request is acted on), then the
    answer is the error anyway, as when a reply is lost on its way back."""

    method: str
    path: str
    status: int
    body: Any
    times: int = 1
    skip: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    after: bool = False
    hits: int = 0
    seen: int = 0
    # Instead of an error: run this first, then the handler as usual (what
    # another client did just before this request reached the API).
    first: Callable[[Request], None] | None = None

    def take(self, req: Request) -> bool:
        if self.method not in ("*", req.method) or not re.search(self.path, req.path):
            return False
        self.seen += 1
        if self.seen <= self.skip or self.hits >= self.times:
            return False
        self.hits += 1
        return True


Handler = Callable[[Request], Response]


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up before the answer (its timeout, a held
        answer) is no error of the fake's: not printed."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class FakeServer:
    """HTTPS on 127.0.0.1 (plain HTTP without ``pki``), an ephemeral port.
    ``handle`` answers requests; ``check_auth`` may raise HttpError before it."""

    def __init__(self, name: str, pki: Pki | None, handle: Handler,
                 check_auth: Callable[[Request], None] | None = None):
        self.name, self.pki, self._handle, self._check_auth = name, pki, handle, check_auth
        self.requests: list[Request] = []
        self.faults: list[Fault] = []
        self.lock = threading.RLock()
        server = self

        class _H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:  # quiet
                pass

            def _serve(self) -> None:
                server._serve(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve

        self.httpd = _Server(("127.0.0.1", 0), _H)
        self.httpd.daemon_threads = True
        if pki is not None:
            self.httpd.socket = pki.server_context().wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.url = f"{'https' if pki is not None else 'http'}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name=f"fake-{name}", daemon=True)

    # -- lifecycle --------------------------------------------------------
    def start(self) -> FakeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- faults and records -----------------------------------------------
    def fail(self, method: str, path: str, status: int, body: Any = None, times: int = 1, skip: int = 0,
             headers: dict[str, str] | None = None, after: bool = False) -> Fault:
        f = Fault(method, path, status, body, times, skip, headers or {}, after)
        with self.lock:
            self.faults.append(f)
        return f

    def meanwhile(self, method: str, path: str, act: Callable[[Request], None], times: int = 1) -> Fault:
        """Before the first ``times`` requests that match, ``act`` (another
        client's change, made between this client's look and its change),
        then the handler answers as usual."""
        f = Fault(method, path, 0, None, times, first=act)
        with self.lock:
            self.faults.append(f)
        return f

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()

    def mark(self) -> int:
        """An index into the request log; ``since(mark)`` is what came after."""
        with self.lock:
            return len(self.requests)

    def since(self, mark: int = 0) -> list[Request]:
        with self.lock:
            return list(self.requests[mark:])

    # -- serving ------------------------------------------------------------
    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        n = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(n) if n else b""
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        req = Request(h.command, parts.path, query, {k.lower(): v for k, v in h.headers.items()}, raw,
                      query_all=parse_qs(parts.query, keep_blank_values=True))
        with self.lock:
            self.requests.append(req)
            fault = next((f for f in self.faults if f.take(req)), None)
        if fault is not None and fault.first is not None:
            fault.first(req)
            fault = None
        if fault is not None and not fault.after:
            resp = Response(fault.status, fault.body, dict(fault.headers))
        else:
            try:
                if self._check_auth:
                    self._check_auth(req)
                resp = self._handle(req)
            except HttpError as e:
                resp = Response(e.status, e.body)
            except Exception as e:  # a bug in the fake: say so loudly
                import traceback
                traceback.print_exc()
                resp = Response(500, {"error": {"code": 500, "message": f"fake {self.name} crashed: {e!r}"}})
            if fault is not None:
                resp = Response(fault.status, fault.body, dict(fault.headers))
        req.status = resp.status
        if resp.takeover is not None:
            h.send_response(resp.status)
            for k, v in resp.headers.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.flush()
            h.close_connection = True
            with contextlib.suppress(OSError):  # the client went away: so did its stream
                resp.takeover(h)
            return
        data, ctype = resp.encode()
        h.send_response(resp.status)
        h.send_header("Content-Type", resp.headers.pop("Content-Type", ctype))
        for k, v in resp.headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)


class Fake:
    """A fake API: its state and handlers, served by ``self.server``."""

    server: FakeServer

    def start(self) -> Self:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
