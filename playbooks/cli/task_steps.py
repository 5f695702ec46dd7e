"""Which steps each task runs, for an environment: the plays composed (pure
functions, no I/O). Plays never import one another; what several tasks
share (kubectl credentials, the capacity checks first, the local twin in
place of the cloud) is put together here, as are ``status`` and ``doctor``
beside it."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from playbooks.access import connectors
from playbooks.cloud import node_shutdown
from playbooks.cloud.gke import nodepool_name
from playbooks.config.choices import preemption_grace_s
from playbooks.config.schema import Environment, capacities
from playbooks.core.command import Command
from playbooks.core.runner import Mode
from playbooks.core.step import Step, skipped
from playbooks.job import save_plan
from playbooks.job.spec import MODELS, Job, remove_checkpoints
from playbooks.plays import (
    capacity,
    chaos,
    cluster,
    dashboard,
    local_cluster,
    network,
    nodepools,
    preflight,
    prereqs,
    quarantine,
    raycluster,
    slice_notice,
    stop_tpus,
    storage,
    teardown,
    train,
    watch,
)
from playbooks.runs import cluster_watch, maintenance_watch, placement, restart, save_times
from playbooks.twin.nodes import hosts_of

GKE_ONLY = ("capacity", "prereqs", "network", "cluster", "nodepools", "storage")
UP = ("prereqs", "network", "cluster", "nodepools", "storage", "raycluster", "dashboard")
# The plays whose steps run kubectl: the cluster's credentials come first.
KUBECTL = ("storage", "raycluster", "dashboard")

_GKE: dict[str, Callable[[Environment], list[Step]]] = {
    "capacity": lambda env: capacity.steps(env, priced=True),
    "prereqs": prereqs.steps,
    "network": network.steps,
    "cluster": cluster.steps,
    "nodepools": nodepools.steps,
    "storage": storage.steps,
    "raycluster": raycluster.steps,
    "dashboard": dashboard.steps,
}


def _not_local(play: str) -> list[Step]:
    return [skipped(play, play, "a local environment has no cloud resources of this kind (its twin: the local Ray "
                                "cluster)", id=f"{play}:local")]


def gke_play(env: Environment, play: str) -> list[Step]:
    """One play's steps on GKE, with what it needs of another play: kubectl
    credentials for the plays that run kubectl, the total of chips said
    before the RayCluster makes them on Autopilot."""
    steps = _GKE[play](env)
    if play in KUBECTL:
        steps = [cluster.credentials_step(env, play)] + steps
    if play == "raycluster" and not env.cluster_mode.our_node_pools:
        at = next(i for i, s in enumerate(steps) if s.id == "raycluster:apply")
        steps = steps[:at] + nodepools.chips_step(env, play) + steps[at:]
    return steps


def play_steps(env: Environment, play: str) -> list[Step]:
    if env.platform.simulated:
        if play in GKE_ONLY:
            return _not_local(play)
        if play == "raycluster":
            return local_cluster.steps(env)
        if play == "dashboard":
            return dashboard.steps(env)
        raise KeyError(play)
    if play == "nodepools" and env.cluster_mode.our_node_pools:
        # The read-only capacity checks come first: a shortage stops the
        # play before any pool is made.
        return _then(capacity.steps(env), gke_play(env, play))
    return gke_play(env, play)


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
    if env.platform.simulated:
        return _then(local_cluster.steps(env), dashboard.steps(env))
    # The capacity checks first, and everything after them: a proven
    # shortage stops `up` before it creates anything.
    rest = dedupe([s for p in UP for s in gke_play(env, p)])
    return _then(capacity.steps(env), rest)


def checks_capacity(env: Environment, task: str) -> bool:
    """Whether a task's own steps start with the capacity checks (it makes
    TPUs: node pools, or `up`)."""
    return env.platform.cloud and (task == "up" or (task == "nodepools" and env.cluster_mode.our_node_pools))


# The tasks that make things (a chain of them may end with node pools).
MAKERS = ("prereqs", "network", "cluster", "nodepools", "storage", "raycluster", "dashboard", "up")


def chained(env: Environment, task: str, steps: list[Step], chain: tuple[str, ...]) -> list[Step]:
    """``task``'s steps as a part of the command line's ``chain``: any chain
    that will make node pools (`invoke network cluster nodepools`) checks
    capacity before its first change, so its first task runs the capacity
    checks first (a proven shortage stops it before the networks are
    made). A chain where something else comes first (a teardown) is left
    as it is."""
    if not chain or chain[0] != task or task not in MAKERS or checks_capacity(env, task):
        return steps
    later = next((i for i, t in enumerate(chain) if checks_capacity(env, t)), None)
    if later is None or any(t not in MAKERS for t in chain[:later]):
        return steps
    return _then(capacity.steps(env), steps)


def cluster_ready_steps(env: Environment) -> list[Step]:
    """What a job needs before it is submitted: a reachable Ray dashboard."""
    if env.platform.simulated:
        return local_cluster.steps(env)
    return [cluster.credentials_step(env, "train"), dashboard.forward_step(env)]


def _then(first: list[Step], then: list[Step]) -> list[Step]:
    """``then`` runs after every step of ``first`` (for parallel runs)."""
    ids = tuple(s.id for s in first)
    for s in then:
        s.after = tuple(dict.fromkeys(s.after + ids))
    return first + then


def train_steps(env: Environment, job: Job, log_file: Path | None = None, preflight_first: bool = True,
                detach: bool = False) -> list[Step]:
    """Preflight first (nothing is started for a job that cannot fit), then
    the cluster, the run's checkpoints, GKE maintenance held off (GKE), the
    job (which releases the hold when it ends). A job whose period was not
    chosen yet (``choose_period``) gets the estimated one."""
    if job.save_plan is None:
        save_plan.apply(env, job, None)
    if preflight_first:
        checks = preflight.steps(env, job, search=False)
    else:
        checks = [skipped("preflight", "preflight", "--skip-preflight: no static checks (mesh, hosts, manifest) and no "
                                                   "AOT fit check against the TPU HBM", id="preflight:skipped")]
    hold = [train.hold_step(job)] if env.platform.cloud else []
    # How long each slice has left (its maintenance, a flex-start end), said before the submit.
    ends = [slice_notice.ends_step(env, "train", "train:slice-ends")] \
        if env.platform.cloud and env.cluster_mode.our_node_pools else []
    return _then(checks + train.preemption_note(env, job) + cluster_ready_steps(env)
                 + [train.slices_step(env, job)] + ends + [train.checkpoint_step(job)] + hold
                 + [train.estimate_step(job), train.save_step(job)],
                 [train.job_step(job, log_file, follow_quarantine(env, job.elastic, cluster_watch.in_head_pod(env)),
                                 detach)])


def watch_steps(env: Environment, run: str, sid: str, elastic: bool, log_file: Path | None = None) -> list[Step]:
    """`invoke watch`: the job followed by the watch that acts. From this
    machine on GKE, the dashboard reached first (the port-forward); in the
    head pod, the head's own dashboard answers."""
    first = [] if env.platform.simulated or connectors.in_a_head_pod() else cluster_ready_steps(env)
    return _then(first, [watch.watch_step(env, run, sid, follow_quarantine(env, elastic), log_file)])


def follow_quarantine(env: Environment, elastic: bool, in_head: bool = False) -> restart.Quarantine:
    """How a followed job's watch sets a host aside (stall_action: restart):
    ``hosts.quarantine``'s steps, its pool never made again from the watch
    (that takes many minutes: `invoke hosts.quarantine NAME` does it); a
    record of the host no longer in force (given back where this record
    never heard of it, or its pool made again) written anew.
    ``in_head``: as the watch in a GKE head pod runs them (what `train`
    shows of its watch's steps; the head pod itself knows it is one)."""
    hosts = {h.name: h.tpu_name for h in hosts_of(env)} if env.platform.simulated else \
        {n: n for n in quarantine.known_hosts(env)}
    refused = None if env.platform.simulated or env.cluster_mode.our_node_pools else AUTOPILOT_QUARANTINE

    def steps(name: str, why: str, by: str) -> list[Step]:
        return quarantine_steps(env, name, why, by, replace=False, in_head=in_head, renew=True)

    # A slice's announced end (plays/slice_notice.py): on the twin, its
    # host's Ray node drained; on GKE, the slice set aside (its pods'
    # preStop hook gives the notice); its maintenance started after the save.
    def notice(name: str, at: float, why: str) -> list[Step]:
        if env.platform.simulated:
            return slice_notice.notice_steps(env, name, at, why)
        return steps(name, why, maintenance_watch.BY)

    can = elastic and refused is None
    return restart.Quarantine(elastic, hosts, steps, refused,
                              coming=(lambda: slice_notice.coming(env)) if can else None,
                              notice=notice if can else None,
                              start=None if env.platform.simulated else (lambda pool: slice_notice.start_steps(env,
                                                                                                               pool)),
                              renew=(lambda run: [train.renew_hold_step(env, run)])
                              if env.platform.cloud and env.hold_maintenance and not in_head else None,
                              release=None if env.platform.simulated else
                              (lambda pool: quarantine.release_gke_steps(env, pool)),
                              held=lambda: quarantine.held_now(env))


def preflight_steps(env: Environment, job: Job) -> list[Step]:
    """The fit, and what a notice gives a save of this job."""
    if job.save_plan is None:
        save_plan.apply(env, job, None)
    return preflight.steps(env, job, search=True) + [preflight.save_step(env, job)]


def choose_period(env: Environment, job: Job, mode: Mode) -> None:
    """The job's checkpoint period (``job/save_plan.py``), from the times
    this environment's runs of its model measured: not read in a dry run
    (its transcript stays the same on any machine), which estimates them."""
    measured = None if mode == Mode.DRY else save_times.read(env, job.model)
    save_plan.apply(env, job, measured)


def chaos_steps(env: Environment, restore_after: float, target: str = placement.FIRST) -> list[Step]:
    """chaos.delete-worker: one worker lost (``target``: checked by
    ``chaos_target_problem`` first)."""
    return _kubectl_first(env, chaos.delete_steps(env, restore_after, target))


def preempt_steps(env: Environment, grace: int | None, restore_after: float,
                  target: str = placement.FIRST) -> list[Step]:
    """chaos.preempt-worker: one worker given a notice of ``grace`` seconds
    (None: what a preemption gives the job's pods on the environment's
    capacity, ``choices.preemption_grace_s``), then lost (``target``:
    checked by ``chaos_target_problem`` first)."""
    given = grace if grace is not None else preemption_grace_s(env)
    return _kubectl_first(env, chaos.delete_steps(env, restore_after, target, grace=given,
                                                  pools_decide=grace is None))


def start_maintenance_steps(env: Environment, pool: str) -> list[Step]:
    """hosts.maintenance: a GKE slice's maintenance started now."""
    return _kubectl_first(env, slice_notice.start_steps(env, pool), "maintenance")


def maintenance_steps(env: Environment, in_s: float, restore_after: float, target: str = placement.FIRST
                      ) -> list[Step]:
    """chaos.maintenance: one slice's host maintenance scheduled in ``in_s`` seconds."""
    return _kubectl_first(env, chaos.maintenance_steps(env, in_s, restore_after, target))


def chaos_target_problem(env: Environment, target: str) -> str | None:
    """What is wrong with a ``--target``, in one line (None: nothing)."""
    return chaos.target_problem(env, target)


def hang_steps(env: Environment, restore_after: float) -> list[Step]:
    """chaos.hang-worker: one worker's trainer frozen, resumed after
    ``restore_after`` seconds (0: never)."""
    return _kubectl_first(env, chaos.hang_steps(env, restore_after))


def _kubectl_first(env: Environment, steps: list[Step], play: str = "chaos") -> list[Step]:
    """A play's steps (the chaos play's), after the cluster's kubectl credentials on GKE."""
    return steps if env.platform.simulated else [cluster.credentials_step(env, play)] + steps


# -- hosts set aside (`invoke hosts`, hosts.quarantine, hosts.release) ------------------
def host_names(env: Environment) -> list[str]:
    """What a host is called: a simulated host's name, a GKE slice's node pool."""
    return [h.name for h in hosts_of(env)] if env.platform.simulated else quarantine.known_hosts(env)


def host_problem(env: Environment, name: str) -> str | None:
    """What is wrong with a host's NAME, in one line (None: nothing)."""
    names = host_names(env)
    if name in names:
        return None
    what = "a simulated TPU host" if env.platform.simulated else "a TPU slice's node pool"
    return f"host {name!r}: not {what} of {env.name} (its hosts: {', '.join(names)})"


AUTOPILOT_QUARANTINE = ("Autopilot makes and replaces its own nodes: this project cordons and taints only the "
                        "nodes of its own node pools (Standard)")


def quarantine_steps(env: Environment, name: str, why: str, by: str, replace: bool = True,
                     in_head: bool = False, renew: bool = False) -> list[Step]:
    """A host set aside (``host_problem`` checked first): recorded, then on
    the twin its Ray node stopped; on GKE its slice's nodes cordoned and
    tainted, its worker pods moved off, and, with quarantine_replace_pool,
    its pool deleted and made again by the nodepools play's own step
    (unless ``replace`` is false). ``renew`` (a watch's): a GKE record no
    longer in force is written anew (``quarantine.record_step``)."""
    if env.platform.simulated:
        host = next(h for h in hosts_of(env) if h.name == name)
        return _then([quarantine.record_step(env, name, host.tpu_name, why, by)],
                     [local_cluster.stop_step(env, name, quarantine.PLAY)])
    if not env.cluster_mode.our_node_pools:
        return [skipped(quarantine.PLAY, f"quarantine {name}", AUTOPILOT_QUARANTINE, id="quarantine:autopilot")]
    i = host_names(env).index(name)
    delete = nodepools.delete_command(env, name) if env.quarantine_replace_pool and replace else None
    # In the head pod (the watch in the cluster) the pod's service account is the credential: no gcloud there.
    creds = [] if in_head or connectors.in_a_head_pod() else [cluster.credentials_step(env, quarantine.PLAY)]
    out = creds + quarantine.gke_steps(env, name, why, by, delete, renew=renew)
    if delete is not None:
        out = _then(out, [nodepools.pool_step(env, i)])
    return out


def release_steps(env: Environment, name: str) -> list[Step]:
    """A host given back: out of the record, then on the twin started again
    (as `up` does); on GKE its nodes uncordoned and untainted first."""
    if env.platform.simulated:
        host = next(h for h in hosts_of(env) if h.name == name)
        return _then([quarantine.forget_step(env, name)],
                     [local_cluster.head_step(env), local_cluster.host_step(env, host)])
    if not env.cluster_mode.our_node_pools:
        return [skipped(quarantine.RELEASE, f"release {name}", AUTOPILOT_QUARANTINE, id="release:autopilot")]
    return [cluster.credentials_step(env, quarantine.RELEASE)] + quarantine.release_gke_steps(env, name)


def teardown_steps(env: Environment, delete_bucket: bool = False) -> list[Step]:
    if env.platform.simulated:
        return local_cluster.stop_steps(env, "teardown")
    return teardown.steps(env, delete_bucket)


def stop_tpus_steps(env: Environment) -> list[Step]:
    """`invoke stop-tpus` (``plays/stop_tpus.py``): on the twin its simulated
    TPU hosts stopped, its head kept; on GKE Standard each TPU node pool
    deleted by the nodepools play's own command (which `up` makes again);
    on Autopilot the RayCluster, after kubectl's credentials."""
    if env.platform.simulated:
        stops = [local_cluster.stop_step(env, h.name, stop_tpus.PLAY) for h in reversed(hosts_of(env))]
        return stops + [stop_tpus.next_step(env, tuple(s.id for s in stops))]
    steps = stop_tpus.steps(env, lambda name: nodepools.delete_command(env, name))
    return steps if env.cluster_mode.our_node_pools else [cluster.credentials_step(env, stop_tpus.PLAY)] + steps


def all_commands(env: Environment) -> list[Command]:
    """Every command the tasks can run for this environment: each task's dry
    run (nothing starts), plus the commands only a particular state brings
    out (a broken node pool replaced, a slice's pool made by any option of
    the capacity list, a run's checkpoints removed)."""
    from playbooks.core.play import Playbook
    from playbooks.core.recap import Reporter
    from playbooks.core.runner import Mode, Runner
    from playbooks.job.spec import build_job
    runner = Runner(Mode.DRY)
    book = Playbook(runner, Reporter(lambda line: None))
    book.run("up", up_steps(env))
    for model in MODELS:
        for elastic in (False, True):
            sets = ["dcn_fsdp_parallelism=-1"] if elastic and model == "llama3-70b" else []
            book.run("train", train_steps(env, build_job(env, model, elastic, sets=sets)))
    book.run("chaos", chaos_steps(env, 0))
    book.run("chaos", hang_steps(env, 60))
    if chaos.sicken_problem(env) is None:
        book.run("chaos", chaos.sicken_steps(env))
        book.run("chaos", chaos.heal_steps(env))
    book.run("teardown", teardown_steps(env, delete_bucket=True))
    book.run("teardown", teardown_steps(env))
    book.run("stop-tpus", stop_tpus_steps(env))
    first = host_names(env)[0]
    book.run("quarantine", quarantine_steps(env, first, "all_commands", "all_commands"))
    book.run("release", release_steps(env, first))
    out = list(runner.recorded)
    if env.platform.cloud:
        for i in range(env.slices if env.cluster_mode.our_node_pools else 0):
            out += [nodepools.create_command(env, nodepool_name(env, i), o) for o in capacities(env)]
            # The update a Spot pool made without its node system configuration is told to run (drift).
            out += [node_shutdown.update_command(env, nodepool_name(env, i), o) for o in env.options
                    if o.kubelet_config]
            out.append(nodepools.delete_command(env, nodepool_name(env, i)))
        remove = remove_checkpoints(build_job(env, "llama3-8b", fresh=True))
        assert isinstance(remove, Command)  # gs://: a command, not an in-process delete
        out.append(remove)
    seen, unique = set(), []
    for c in out:
        if c.line() not in seen:
            seen.add(c.line())
            unique.append(c)
    return unique
