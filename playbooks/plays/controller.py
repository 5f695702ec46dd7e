"""The controller host: the project files its commands read (the manifests
that envsubst renders, the trainer that `ray job submit` ships, the gcloud
parser that `invoke doctor` runs) are copied to its ``remote_dir`` before
anything else runs there, only what changed (compared by SHA-256)."""
from __future__ import annotations

import dataclasses
import hashlib

from playbooks.access import connectors
from playbooks.config.project import ROOT
from playbooks.config.schema import Environment
from playbooks.core.facts import Action, Fact
from playbooks.core.step import Step, Verify, change, ok

PLAY = "controller"
SYNCED = ("manifests", "trainer")
SYNCED_FILES = ("playbooks/access/gcloud_parse.py",)
SYNC_ID = "controller:sync"


def project_files() -> list[str]:
    """What is synced: every file under manifests/ and trainer/ (not caches),
    and the scripts the controller runs."""
    out = list(SYNCED_FILES)
    for top in SYNCED:
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
                out.append(str(p.relative_to(ROOT)))
    return out


def _digest(data: bytes | None) -> str | None:
    return hashlib.sha256(data).hexdigest() if data is not None else None


def stale(env: Environment) -> list[str]:
    """The project files whose copy on the controller is missing or differs."""
    via = connectors.connector(env)
    out = []
    for rel in project_files():
        here = _digest((ROOT / rel).read_bytes())
        if _digest(via.read(rel)) != here:
            out.append(rel)
    return out


def sync_step(env: Environment) -> Step:
    target = connectors.controller(env)
    files = project_files()
    fact = Fact(name="controller files", python=lambda: stale(env), assumed=files,
                display=f"sha256sum {' '.join(d + '/...' for d in SYNCED)}  # on {target}, in {env.remote_dir}",
                describe=lambda s: f"{len(s)} of {len(files)} file(s) to copy" if s
                else f"all {len(files)} file(s) current")

    def put(names: list[str]) -> None:
        via = connectors.connector(env)
        for rel in names:
            via.write(rel, (ROOT / rel).read_bytes())

    def decide(look):
        missing = look(fact)
        if not missing:
            return ok(f"{target}:{env.remote_dir} has the {len(files)} project files")
        return change(Action(f"sftp put {len(missing)} file(s) of {', '.join(SYNCED)}/ to {target}:{env.remote_dir}",
                             lambda: put(missing)), reason=f"copied {len(missing)} file(s)")

    return Step(PLAY, f"project files on {target}", decide, id=SYNC_ID, probes=(fact,),
                verify=Verify(fact, lambda s: None if not s else f"{len(s)} file(s) still differ"))


def on_controller(env: Environment, steps: list[Step]) -> list[Step]:
    """With a controller: the sync first, and every other step after it."""
    if not connectors.controller(env) or not steps:
        return steps
    rest = [dataclasses.replace(s, after=tuple(dict.fromkeys((SYNC_ID, *s.after)))) for s in steps]
    return [sync_step(env), *rest]
