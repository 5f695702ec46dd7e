"""``stall_watch: cluster`` on a GKE environment, for the tests of the
watch's rights (tests/test_watch_rbac.py, tests/test_clients_quarantine.py)
until the inventory accepts it: playbooks/config/schema.py refuses it on GKE
today (the watch in the cluster is not yet built there), and the RBAC it
will need is built ahead of it. Here that one refusal is lifted, and nothing
else of the schema changes: in this process (``lifted``) or in an `invoke`
child (``invoke_script``: an `invoke` that lifts it first). To be removed
once schema.py accepts ``cluster`` on GKE."""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _key():
    from playbooks.config import schema
    return next(k for k in schema.STALL if k.name == "stall_watch")


def _either(v: str, env) -> str | None:
    """The rule without its refusal on GKE: one of cluster, follow."""
    from playbooks.config import schema
    return schema.one_of(v, schema.STALL_WATCHES)


def lift() -> None:
    object.__setattr__(_key(), "rules", (_either,))   # a frozen dataclass: Key


@contextlib.contextmanager
def lifted() -> Iterator[None]:
    key = _key()
    saved = key.rules
    lift()
    try:
        yield
    finally:
        object.__setattr__(key, "rules", saved)


def invoke_script(folder: Path) -> Path:
    """An `invoke` executable (what .venv/bin/invoke runs) that lifts the
    refusal before Invoke loads tasks.py."""
    path = folder / "invoke"
    path.write_text(f"#!{sys.executable}\n"
                    "import sys\n"
                    f"sys.path.insert(0, {str(ROOT)!r})\n"
                    "from tests.gke_cluster_watch import lift\n"
                    "lift()\n"
                    "from invoke.main import program\n"
                    "sys.exit(program.run())\n")
    path.chmod(0o755)
    return path
