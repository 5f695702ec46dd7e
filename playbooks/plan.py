"""Which steps each task runs, for an environment: pure functions, no I/O."""
from __future__ import annotations

from typing import Callable

from .core.step import Step, ok
from .plays import (
    capacity,
    chaos,
    cluster,
    dashboard,
    local,
    network,
    nodepools,
    prereqs,
    raycluster,
    storage,
    teardown,
    train,
)
from .schema import Environment

GKE_ONLY = ("capacity", "prereqs", "network", "cluster", "nodepools", "storage")
UP = ("prereqs", "network", "cluster", "nodepools", "storage", "raycluster", "dashboard")

_GKE: dict[str, Callable[[Environment], list[Step]]] = {
    "capacity": capacity.steps,
    "prereqs": prereqs.steps,
    "network": network.steps,
    "cluster": cluster.steps,
    "nodepools": nodepools.steps,
    "storage": storage.steps,
    "raycluster": raycluster.steps,
    "dashboard": dashboard.steps,
}


def _not_local(play: str) -> list[Step]:
    return [Step(play, play, lambda look: ok(), id=f"{play}:local",
                 skip="a local environment has no cloud resources of this kind (its twin: the local Ray cluster)")]


def play_steps(env: Environment, play: str) -> list[Step]:
    if env.kind == "local":
        if play in GKE_ONLY:
            return _not_local(play)
        if play == "raycluster":
            return local.steps(env)
        if play == "dashboard":
            return dashboard.steps(env)
        raise KeyError(play)
    if play == "nodepools" and env.mode == "standard":
        # The read-only capacity checks come first: a shortage stops the
        # play before any pool is made.
        return _then(capacity.steps(env), nodepools.steps(env))
    return _GKE[play](env)


def dedupe(steps: list[Step]) -> list[Step]:
    """Steps shared by several plays (kubectl credentials) run once."""
    seen, out = set(), []
    for s in steps:
        if s.id in seen:
            continue
        seen.add(s.id)
        out.append(s)
    return out


def up_steps(env: Environment) -> list[Step]:
    if env.kind == "local":
        return _then(local.steps(env), dashboard.steps(env))
    # The capacity checks first, and everything after them: a proven
    # shortage stops `up` before it creates anything.
    rest = dedupe([s for p in UP for s in _GKE[p](env)])
    return _then(capacity.steps(env), rest)


def cluster_ready_steps(env: Environment) -> list[Step]:
    """What a job needs before it is submitted: a reachable Ray dashboard."""
    if env.kind == "local":
        return local.steps(env)
    return [cluster.credentials_step(env, "train"), dashboard.forward_step(env)]


def _then(first: list[Step], then: list[Step]) -> list[Step]:
    """``then`` runs after every step of ``first`` (for parallel runs)."""
    ids = tuple(s.id for s in first)
    for s in then:
        s.after = tuple(dict.fromkeys(s.after + ids))
    return first + then


def train_steps(env: Environment, job: train.Job, state: dict, log_file=None, preflight: bool = True) -> list[Step]:
    """Preflight first (nothing is started for a job that cannot fit), then
    the cluster, the run's checkpoints, the job."""
    from .plays import preflight as pf
    if preflight:
        checks = pf.steps(env, job, search=False)
    else:
        checks = [Step("preflight", "preflight", lambda look: ok(), id="preflight:skipped",
                       skip="--skip-preflight: no static checks (mesh, hosts, manifest) and no AOT fit check "
                            "against the TPU HBM")]
    return _then(checks + train.preemption_note(env, job) + cluster_ready_steps(env) +
                 [train.checkpoint_step(job, state)], [train.job_step(job, state, log_file)])


def preflight_steps(env: Environment, job: train.Job) -> list[Step]:
    from .plays import preflight as pf
    return pf.steps(env, job, search=True)


def chaos_steps(env: Environment, restore_after: float) -> list[Step]:
    return chaos.steps(env, restore_after)


def teardown_steps(env: Environment) -> list[Step]:
    return teardown.steps(env)


def all_commands(env: Environment) -> list:
    """Every command the tasks can run for this environment: each task's dry
    run (nothing starts), plus the commands only a particular state brings
    out (a broken node pool replaced, a run's checkpoints removed)."""
    from .core.command import Command
    from .core.play import Playbook
    from .core.recap import Reporter
    from .core.runner import Mode, Runner
    runner = Runner(Mode.DRY)
    book = Playbook(runner, Reporter(lambda line: None))
    book.run("up", up_steps(env))
    for model in train.MODELS:
        for elastic in (False, True):
            sets = ["dcn_fsdp_parallelism=-1"] if elastic and model == "llama3-70b" else []
            book.run("train", train_steps(env, train.build_job(env, model, elastic, sets=sets), {}))
    book.run("chaos", chaos_steps(env, 0))
    book.run("teardown", teardown_steps(env))
    out = list(runner.recorded)
    if env.kind != "local":
        for i in range(env.slices if env.mode == "standard" else 0):
            out.append(nodepools.delete_command(env, nodepools.nodepool_name(env, i)))
        remove = train.remove_checkpoints(train.build_job(env, "llama3-8b", fresh=True))
        assert isinstance(remove, Command)  # gs://: a command, not an in-process delete
        out.append(remove)
    seen, unique = set(), []
    for c in out:
        if c.line() not in seen:
            seen.add(c.line())
            unique.append(c)
    return unique
