"""Read-only HTTP looks (a Ray dashboard's REST API, Google's catalog of
prices), with the same rule as every probe: only a proven "nothing there"
counts as absent."""
from __future__ import annotations

import json
import socket
import ssl
import urllib.error
import urllib.parse
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


# -- credentials (a bearer token in ``headers``) ----------------------------------------
# They go only to the URL asked for, and only over TLS: never over plain
# http:// (anyone on the path reads them), never on to where a redirect
# points (urllib copies a request's headers onto the redirected one; curl
# without -L does not follow). Both connectors hold to this.
def plain_http_refused(url: str) -> str | None:
    """Why a request with credentials may not go to ``url`` (None: it may)."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme != "https":
        return f"credentials are sent only over https://, not to {scheme or 'a scheme-less'}:// URL {url}"
    return None


def redirect_refused(status: int, location: str | None) -> str:
    """What a redirect answered to a request with credentials says: it is
    not followed (the credentials would go on to wherever it points)."""
    return (f"HTTP {status}: a redirect{f' to {location}' if location else ''}, not followed with credentials "
            f"(point the endpoint at where it redirects)")


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """A request with credentials: a redirect is answered as the error it
    is (an HTTPError with its 3xx status), not followed."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None


def _open(url: str, headers: Mapping[str, str], timeout: float, ca_file: str | None) -> Any:
    context = _context(ca_file)
    if not headers:
        return urllib.request.urlopen(urllib.request.Request(url), timeout=timeout, context=context)
    req = urllib.request.Request(url)
    for k, v in headers.items():
        req.add_unredirected_header(k, v)  # and, were a redirect followed, left off it
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), NoRedirect())
    return opener.open(req, timeout=timeout)


def get_json(url: str, timeout: float = 10.0, absent_if_refused: bool = True,
             headers: Mapping[str, str] | None = None, ca_file: str | None = None) -> Any:
    """GET a JSON document. Connection refused on a loopback address proves
    nothing listens there (ABSENT); a 404 proves nothing is at that path
    (ABSENT); anything else that fails is an error, with the server's own
    message when it gave one. ``headers`` are sent but never shown (a
    bearer token), only over https:// and never on a redirect (one is a
    failure); ``ca_file`` is the CA bundle to trust (else the system's)."""
    shown = f"curl -fsS {url}"
    if headers and (refused := plain_http_refused(url)):
        raise ProbeFailed("http", shown, None, "", refused, why=f"could not look: {refused}")
    try:
        with _open(url, dict(headers or {}), timeout, ca_file) as r:
            return json.loads(r.read().decode() or "null")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return ABSENT
        if headers and 300 <= e.code < 400:
            detail = redirect_refused(e.code, e.headers.get("Location") if e.headers else None)
            raise ProbeFailed("http", shown, None, "", detail, why=f"could not look: {detail}") from None
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


def get_text(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """GET a text answer (a Ray worker's stack): its HTTP status and body,
    whatever the status (an error's body is the server's own words). No
    answer at all (refused, timed out, reset) raises ``ProbeFailed``; one
    that timed out says "timed out"."""
    shown = f"curl -sS {url}"
    try:
        with _open(url, {}, timeout, None) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        try:
            body = e.read().decode("utf-8", "replace")
        except OSError:
            body = ""
        return e.code, body
    except urllib.error.URLError as e:
        timed_out = isinstance(e.reason, TimeoutError)
        why = "timed out" if timed_out else str(e.reason)
        raise ProbeFailed("http", shown, None, "", why, why=f"could not look: {why}") from None
    except TimeoutError:
        raise ProbeFailed("http", shown, None, "", "timed out", why="could not look: timed out") from None
    except OSError as e:
        raise ProbeFailed("http", shown, None, "", str(e), why=f"could not look: {e}") from None


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
