"""Read-only HTTP looks (a Ray dashboard's REST API, Google's catalog of
prices), with the same rule as every probe: only a proven "nothing there"
counts as absent."""
from __future__ import annotations

import json
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from .errors import ProbeFailed
from .facts import ABSENT

# What a failed answer's body may add to its status (a Google API's
# {"error": {"message": ...}}), at most this many characters.
MESSAGE_MAX = 300


def server_message(body: bytes | str) -> str:
    """The server's own words in an error answer: a Google API's
    ``error.message`` (and ``error.status``), else nothing."""
    try:
        doc = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError):
        return ""
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict):
        return ""
    msg, status = err.get("message"), err.get("status")
    parts = [str(p) for p in (status, msg) if isinstance(p, str) and p]
    return ": ".join(parts)[:MESSAGE_MAX]


def _context(ca_file: str | None) -> ssl.SSLContext | None:
    return ssl.create_default_context(cafile=ca_file) if ca_file else None


def get_json(url: str, timeout: float = 10.0, absent_if_refused: bool = True,
             headers: Mapping[str, str] | None = None, ca_file: str | None = None) -> Any:
    """GET a JSON document. Connection refused on a loopback address proves
    nothing listens there (ABSENT); a 404 proves nothing is at that path
    (ABSENT); anything else that fails is an error, with the server's own
    message when it gave one. ``headers`` are sent but never shown (a
    bearer token); ``ca_file`` is the CA bundle to trust (else the system's)."""
    shown = f"curl -fsS {url}"
    try:
        req = urllib.request.Request(url, headers=dict(headers or {}))
        with urllib.request.urlopen(req, timeout=timeout, context=_context(ca_file)) as r:
            return json.loads(r.read().decode() or "null")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return ABSENT
        try:
            said = server_message(e.read())
        except OSError:
            said = ""
        detail = f"HTTP {e.code}: {said or e.reason}"
        raise ProbeFailed("http", shown, None, "", detail, why=f"could not look: {detail}") from None
    except urllib.error.URLError as e:
        if absent_if_refused and isinstance(e.reason, ConnectionRefusedError):
            return ABSENT
        raise ProbeFailed("http", shown, None, "", str(e.reason),
                          why=f"could not look: {e.reason}") from None
    except TimeoutError:
        raise ProbeFailed("http", shown, None, "", "timed out", why="could not look: timed out") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ProbeFailed("http", shown, None, "", "not JSON",
                          why="could not look: the answer is not JSON") from None
    except OSError as e:  # a connection reset mid-answer, a CA file that cannot be read
        raise ProbeFailed("http", shown, None, "", str(e), why=f"could not look: {e}") from None


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
