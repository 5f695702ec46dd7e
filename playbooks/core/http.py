"""Read-only HTTP looks (a Ray dashboard's REST API), with the same rule as
every probe: only a proven "nothing there" counts as absent."""
from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

from .errors import ProbeFailed
from .facts import ABSENT


def get_json(url: str, timeout: float = 10.0, absent_if_refused: bool = True) -> Any:
    """GET a JSON document. Connection refused on a loopback address proves
    nothing listens there (ABSENT); anything else that fails is an error."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read().decode() or "null")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return ABSENT
        raise ProbeFailed("http", f"curl -fsS {url}", None, "", f"HTTP {e.code}: {e.reason}",
                          why=f"could not look: HTTP {e.code}") from None
    except urllib.error.URLError as e:
        if absent_if_refused and isinstance(e.reason, ConnectionRefusedError):
            return ABSENT
        raise ProbeFailed("http", f"curl -fsS {url}", None, "", str(e.reason),
                          why=f"could not look: {e.reason}") from None
    except TimeoutError:
        raise ProbeFailed("http", f"curl -fsS {url}", None, "", "timed out", why="could not look: timed out") from None
    except json.JSONDecodeError:
        raise ProbeFailed("http", f"curl -fsS {url}", None, "", "not JSON",
                          why="could not look: the answer is not JSON") from None


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
