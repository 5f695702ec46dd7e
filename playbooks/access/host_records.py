"""A record of hosts kept in one JSON file on this machine,
``{"hosts": {NAME: VALUE}}``: the hosts set aside
(``runs/quarantine_record.py``) and the twin's simulated maintenance
(``twin/maintenance_sim.py``) read theirs here. A file that cannot be read,
is not JSON or is not such a record raises ``Unreadable`` with what is
wrong; its owner says it as "could not look", never as "none"."""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from playbooks.access import connectors


class Unreadable(Exception):
    """What is wrong with the file, in words ("is not JSON")."""


def read(path: str, valid: Callable[[Any], bool], shape: str) -> dict[str, Any]:
    """The file's hosts ({} when it does not exist); ``valid``: each
    value's rule; ``shape``: the record's form, said when it is not one."""
    try:
        data = connectors.this_machine().read(path)
    except OSError as e:
        raise Unreadable(f"cannot be read ({e.strerror or e})") from None
    if not data:
        return {}
    try:
        doc = json.loads(data)
    except ValueError:
        raise Unreadable("is not JSON") from None
    hosts = doc.get("hosts") if isinstance(doc, dict) else None
    if not isinstance(hosts, dict) or not all(valid(v) for v in hosts.values()):
        raise Unreadable(f"is not a record of {shape}")
    return hosts


def write(path: str, hosts: dict[str, Any]) -> None:
    connectors.this_machine().write(path, (json.dumps({"hosts": hosts}, indent=1) + "\n").encode())
