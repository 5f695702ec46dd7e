"""One changing run at a time on an environment, across machines: its lease
(``playbooks/cloud/kube_lease.py``: a Kubernetes Lease in its GKE cluster),
taken by the changing tasks (session.CHANGING) in apply mode, after the
environment's lock on this machine, for the rest of their chain; renewed
every playbook.heartbeat seconds; released when the chain ends.

It lives in the cluster, so it is taken only once the cluster exists
(RUNNING, or RECONCILING, DEGRADED) and a kubectl context for it exists
where kubectl runs: at the chain's first changing task, and again at the
first changing task after a `cluster` task of the chain (`invoke network
cluster nodepools` takes it at nodepools). Before, one line says that it
is not taken yet, and why. A dry run shows the same looks (the cluster
assumed absent, as every dry run assumes); check mode takes none.

A renewal refused because another run took it (it lapsed: this machine
could not renew it for its duration) stops this run: this module keeps the
one line and interrupts the main thread; ``session.clean_errors`` prints it.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from playbooks.cloud.gke import clusters_fact, kube_context
from playbooks.cloud.kube_context import has_context, kubeconfig_fact
from playbooks.cloud.kube_lease import DURATION, KubeLease, where
from playbooks.config.schema import Environment
from playbooks.core.errors import PlaybookError
from playbooks.core.facts import ABSENT
from playbooks.core.lease import Keeper, Wait, identity, take
from playbooks.core.lock import Busy
from playbooks.core.recap import Reporter, banner
from playbooks.core.runner import Mode, Runner, StepLog

USABLE = ("RUNNING", "RECONCILING", "DEGRADED")  # a cluster whose API answers
NOT_YET = ("until then, only a create answered \"already exists\" looking again keeps two machines' runs "
           "from failing (docs/modes.md)")
MAX_POLL = 5.0  # seconds between looks at a lease another machine holds


@dataclass
class _Chain:
    """What this chain did about an environment's lease."""

    keeper: Keeper | None = None
    store: KubeLease | None = None
    tried_at: int = -1   # how many `cluster` tasks had started when it last looked (-1: never)
    clusters: int = 0    # `cluster` tasks of the chain started so far


_CHAINS: dict[str, _Chain] = {}
_LOST: list[str] = []


def lost() -> str | None:
    """The line that says this run lost its lease (None: it did not)."""
    return _LOST[0] if _LOST else None


def hold(env: Environment, task: str, doing: str, settings: dict[str, Any], runner: Runner,
         reporter: Reporter) -> None:
    """Take the environment's lease for the rest of the chain, where it
    can be taken yet (apply mode; a dry run shows its looks)."""
    from playbooks.cli import chain

    if not env.platform.cloud or runner.mode is Mode.CHECK:
        return
    state = _CHAINS.get(env.name)
    if state is None:
        state = _CHAINS[env.name] = _Chain()
        chain.at_end(lambda: release(env.name, reporter))
    try:
        if state.keeper is None and state.tried_at < state.clusters:
            state.tried_at = state.clusters
            _look_and_take(env, task, doing, settings, _own_runner(runner), reporter, state)
    finally:
        state.clusters += task == "cluster"


def _own_runner(runner: Runner) -> Runner:
    """A runner of the lease's own, for the whole chain (its answers are
    not the plays' cache)."""
    if runner.mode is Mode.DRY:
        return Runner(Mode.DRY, retry=runner.retry)
    return Runner(runner.mode, runner.connector, runner.retry, here=runner.here, log=runner.log)


def _why_not_yet(env: Environment, runner: Runner, log: StepLog) -> str | None:
    """Why the lease cannot be taken yet (None: it can)."""
    cluster = runner.look(clusters_fact(env), log, "lease")
    if cluster is ABSENT:
        assumed = " (a dry run assumes it absent)" if runner.mode is Mode.DRY else ""
        return f"cluster {env.cluster_name} does not exist yet{assumed}"
    status = cluster.get("status")
    if status not in USABLE:
        return f"cluster {env.cluster_name} is {status}"
    if not has_context(runner.look(kubeconfig_fact(env), log, "lease"), kube_context(env)):
        return f"no kubectl context {kube_context(env)} here yet (`invoke cluster` writes it)"
    return None


def _look_and_take(env: Environment, task: str, doing: str, settings: dict[str, Any], runner: Runner,
                   reporter: Reporter, state: _Chain) -> None:
    what = f"one changing run at a time on environment {env.name}, across machines"
    reporter.line(banner("LEASE", f"{where(env)}, across machines"))
    log = StepLog(reporter.line, buffered=False)
    try:
        why = _why_not_yet(env, runner, log)
        if why is not None:
            log.emit("note", f"not taken yet: {why}; {NOT_YET}")
            return
        store = KubeLease(env, runner, log)
        me = identity(doing)
        beat = float(settings["heartbeat"])
        rec, how = take(store, me, Wait(what, reporter.line, every=beat, poll=min(MAX_POLL, beat),
                                        limit=settings["lock_wait"]))
    except Busy as e:
        hint = "run again when it ends" + (f" (waited playbook.lock_wait = {settings['lock_wait']:g}s)"
                                           if settings["lock_wait"] else " (playbook.lock_wait is 0: not waited for)")
        raise Busy(e.what, e.holder, e.path, 0.0, hint) from None
    except PlaybookError as e:
        if task != "teardown":
            raise
        log.emit("note", f"not taken: {str(e).splitlines()[0]}; teardown goes on (the cluster's "
                         f"delete deletes the lease with it)")
        return
    log.emit("note", f"taken ({how}), held by this run until its chain ends: renewed every "
                     f"{beat:g}s, it lapses {DURATION}s after its last renewal")
    state.store = KubeLease(env, runner, StepLog(None, buffered=True))
    state.keeper = Keeper(state.store, me, rec, every=beat, on_lost=_stop).start()


def _stop(line: str) -> None:
    """Another run took the lease: stop this one (the main thread gets
    KeyboardInterrupt; session.clean_errors says this line instead)."""
    _LOST.append(line)
    os.kill(os.getpid(), signal.SIGINT)


def release(name: str, reporter: Reporter) -> None:
    """At the chain's end: the lease written released (no holder), unless
    another took it or it went with its cluster."""
    state = _CHAINS.pop(name, None)
    if state is None or state.keeper is None or state.store is None:
        return
    store = state.store

    def let_go(rec: Any) -> None:
        store.replace("", None, time.time(), rec.version)

    try:
        state.keeper.release(let_go)
    except PlaybookError as e:
        reporter.line(f"note: {store.where} was not released ({str(e).splitlines()[0]}): it lapses {DURATION}s "
                      f"after its last renewal")
