"""§9 Chaos: one play over the target's own way to act on a TPU host. On
GKE a host is a Ray TPU worker pod, acted on with kubectl
(``cloud/chaos_gke.py``); on the twin, a simulated host's Ray node on this
machine (``twin/chaos_twin.py``). Each task's steps are written here once:

- ``delete_steps`` (chaos.delete-worker): choose a host (the first, as the
  tutorial finds it; the running job's rank 0 or a peer; or one by name),
  kill it, and bring it back after --restore-after where the target does
  not itself (the twin; KubeRay recreates a deleted pod). With a grace
  (chaos.preempt-worker): the host is given its notice first, and goes
  when the grace ends (on GKE the pod deleted with that grace period: its
  preStop hook gives the notice; on the twin the same drain of its Ray node
  the hook runs, then the kill).
- ``hang_steps`` (chaos.hang-worker): freeze one host's training worker
  (SIGSTOP: its Ray node stays up, the job hangs), resume it after
  --restore-after (0: never).
- ``sicken_steps`` (chaos.sicken-worker): start a host again sick, with
  fewer JAX devices than its chips, as a host that comes back broken; and
  ``heal_steps`` (chaos.heal-worker): start it again whole. The twin only.

Every act is recorded in the running job's timeline (``record``)."""
from __future__ import annotations

import time
from typing import Any

from playbooks.cloud import node_shutdown
from playbooks.cloud.chaos_gke import GkeWorkers
from playbooks.config import paths, spot_grace
from playbooks.config.choices import preemption_grace_s
from playbooks.config.schema import Environment
from playbooks.core.command import placeholder, shown
from playbooks.core.errors import PlaybookError
from playbooks.core.facts import Action, Fact
from playbooks.core.step import CHANGE, Step, change, fail, ok
from playbooks.job import save_plan
from playbooks.job.save_period import Times
from playbooks.job.spec import MODELS, build_job
from playbooks.runs import chaos_target, placement, save_times, timeline
from playbooks.runs import events as E
from playbooks.runs import quarantine_record as quarantined
from playbooks.runs.cost import model_of
from playbooks.twin.chaos_twin import TwinHosts
from playbooks.twin.nodes import Host

# The target's own way to act on a host: its facts, commands and words.
Way = TwinHosts | GkeWorkers


def way(env: Environment) -> Way:
    return TwinHosts(env) if env.platform.simulated else GkeWorkers(env)


def twin(env: Environment) -> TwinHosts:
    """The twin's way: sicken and heal are the twin's alone (``sicken_problem``)."""
    w = way(env)
    if not isinstance(w, TwinHosts):
        raise ValueError(f"{env.name}: {GkeWorkers.cannot_sicken}")
    return w


def record(env: Environment, kind: str, **fields: Any) -> Action:
    """A chaos event, in the timeline of the running job's run (found
    through the Ray dashboard; no job running: not recorded)."""
    def go() -> None:
        timeline.record(env, kind, **fields)
    return Action(timeline.record_line(env, kind), go)


def target_problem(env: Environment, target: str) -> str | None:
    """What is wrong with a ``--target``, in one line (None: nothing)."""
    if target in placement.TARGETS:
        return None
    return way(env).target_problem(target, placement.TARGETS)


def _chooser(env: Environment, w: Way, target: str, pick: Any):
    """``choose(look)``: (verdict, host, why) of the host ``target`` names:
    the running job's rank 0 or peer (its timeline), one by name, or
    ``pick.first``."""
    aimed = chaos_target.fact(env, target, w.name_of, w.noun) if target in (placement.RANK0, placement.PEER) else None

    def choose(look):
        if aimed is not None:
            name, why = look(aimed)
            if name is None:
                return "fail", None, f"--target={target}: {why}"
            return pick.named(look, name, f" ({why})", target, aimed=True)
        if target != placement.FIRST:
            return pick.named(look, target, "", target, aimed=False)
        return pick.first(look)

    return choose


def _decided(verdict: str, why: str):
    return ok(why) if verdict == "ok" else fail(why)


def delete_steps(env: Environment, restore_after: float, target: str = placement.FIRST,
                 grace: int | None = None, pools_decide: bool = False) -> list[Step]:
    """Kill one host (``target``: checked by ``target_problem`` first), as
    a preempted VM dies; with a ``grace``, give it its notice first and
    kill it when the grace ends (chaos.preempt-worker); bring it back after
    ``restore_after`` seconds (0: leave it down) where the target does not
    itself. ``pools_decide``: the grace is the default, what a preemption
    gives the job's pods here, which the Spot node pools as made decide
    where they can lengthen it (``node_shutdown.pools_grace``)."""
    w = way(env)
    killed: dict[str, Any] = {}  # the host this run kills: the one it brings back
    choose = _chooser(env, w, target, w.picker())
    nodes = w.ray_nodes() if grace is not None else None
    measured = save_seconds(env) if grace is not None else None
    task = "chaos.delete-worker" if grace is None else "chaos.preempt-worker"
    as_made = node_shutdown.pools_grace(env, grace) if pools_decide and grace is not None else None

    def decide_kill(look):
        verdict, h, why = choose(look)
        if h is None:
            return _decided(verdict, why)
        killed["victim"] = h
        if grace is not None and as_made is not None:
            return preempt(look, h, why, *as_made(look))
        if grace is None:
            reason, would = w.kill_words(h, why)
            lost = record(env, E.WORKER_LOST, **w.fields(h), by="chaos", target=target, cause=w.kill_cause)
            return change(*w.kill(h), lost, reason=reason, would=would, found=f"{w.label(h)} running",
                          instead=w.stuck(h, None, reason, (lost,)))
        return preempt(look, h, why, grace, "")

    def preempt(look, h, why: str, g: int, pools_said: str):
        listed = look(nodes) if nodes is not None else None
        if problem := w.preempt_problem(h, listed):
            return fail(problem)
        reason, would = w.preempt_words(h, g, why)
        given = record(env, E.NOTICE_GIVEN, **w.fields(h), grace_s=g, by="chaos", target=target,
                       cause=f"a notice of {g} s (chaos.preempt-worker)")
        lost = record(env, E.WORKER_LOST, **w.fields(h), by="chaos", target=target, cause=w.preempt_cause(g))
        notes = [grace_words(g, look(measured)), real_words(env, g)] if measured is not None else []
        return change(*w.preempt(h, g, listed, given, lost),
                      reason=reason, would=would, found=f"{w.label(h)} running",
                      notes=[pools_said] * bool(pools_said) + notes,
                      instead=w.stuck(h, g, reason, (lost,)))

    title, sid = (w.kill_title, w.kill_id) if grace is None else (w.preempt_title(grace), "chaos:preempt")
    out = [Step("chaos", title, decide_kill, id=sid, after=w.after)]
    back = w.restorer() if restore_after > 0 else None
    if back is not None:
        out.append(_restore_step(env, w, back, killed, restore_after, sid, task))
    return out


def _restore_step(env: Environment, w: Any, back: Any, killed: dict[str, Any], restore_after: float, sid: str,
                  task: str) -> Step:
    """Bring back the host the kill step of ``sid`` killed, after ``restore_after`` s."""
    held = quarantined.fact(env)  # a host set aside is not brought back

    def decide_restore(look):
        # The host this run killed (another chaos run may have killed
        # another host meanwhile: that run brings back its own).
        h = killed.get("victim")
        if h is None:
            return ok(f"every {w.noun} runs: nothing to bring back")
        return back.decide(look, h, restore_after,
                           record(env, E.HOST_BACK, **w.fields(h), by="chaos",
                                  cause=f"started again after {restore_after:g}s ({task})"),
                           held_out=lambda: quarantined.held_out(h.name, look(held)))

    return Step("chaos", f"bring the {w.noun} back", decide_restore, id="chaos:restore",
                after=(sid,), verify=back.verify(killed))


def maintenance_steps(env: Environment, in_s: float, restore_after: float,
                      target: str = placement.FIRST) -> list[Step]:
    """A host maintenance scheduled for one slice (``target``'s) in
    ``in_s`` seconds, as GKE announces one: on GKE its nodes labelled
    ``cloud.google.com/scheduled-maintenance-time`` (GKE's own maintenance
    is not simulated: the label is what the watch reads); on the twin the
    record the watch reads (twin/maintenance_sim.py), then at that time the
    slice's hosts killed, their maintenance over, and each brought back after
    ``restore_after`` seconds (0: left down)."""
    w = way(env)
    choose = _chooser(env, w, target, w.picker())
    hit: list[Any] = []
    first: dict[str, Any] = {}  # the slice's first host: the one the restore's verify waits for

    def decide(look):
        verdict, h, why = choose(look)
        if h is None:
            return _decided(verdict, why)
        at = time.time() + in_s
        hosts: list[Any] = w.slice_of(h)
        hit[:] = hosts
        first["victim"] = hosts[0]
        scheduled = record(env, E.MAINTENANCE_SCHEDULED, **w.fields(h), hosts=[w.label(x) for x in hosts], at=at,
                           in_s=in_s, by="chaos", target=target, cause=f"a host maintenance in {in_s:g} s "
                                                                       "(chaos.maintenance)")
        lost = [record(env, E.WORKER_LOST, **w.fields(x), by="chaos", target=target,
                       cause="its host maintenance (chaos.maintenance)") for x in hosts]
        return change(*w.maintenance(h, hosts, in_s, at, scheduled, lost),
                      reason=f"scheduled the host maintenance of {w.label(h)}'s slice in {in_s:g} s{why}",
                      would=shown(f"schedule the host maintenance of {w.label(h)}'s slice in {in_s:g} s{why}"),
                      found=f"{w.label(h)} running")

    out = [Step("chaos", f"a host maintenance in {in_s:g} s for one slice", decide, id="chaos:maintenance",
                after=w.after)]
    back = w.restorer() if restore_after > 0 else None
    if back is None:
        return out
    held = quarantined.fact(env)

    def decide_restore(look):
        acts: list[Any] = []
        for h in hit:
            d = back.decide(look, h, restore_after,
                            record(env, E.HOST_BACK, **w.fields(h), by="chaos",
                                   cause=f"its maintenance over, started again after {restore_after:g}s "
                                         "(chaos.maintenance)"),
                            held_out=_held(h, look, held))
            if d.kind != CHANGE:
                return d
            acts.extend(d.commands)
        return change(*acts, reason=f"{', '.join(w.label(h) for h in hit)} back after {restore_after:g}s",
                      would=shown(f"bring the slice's hosts back after {restore_after:g}s")) if acts else \
            ok("nothing to bring back")

    out.append(Step("chaos", "bring the slice's hosts back", decide_restore, id="chaos:restore",
                    after=("chaos:maintenance",), verify=back.verify(first)))
    return out


def _held(h: Any, look: Any, held: Any):
    """Why host ``h`` is held out (the quarantine's), asked when needed."""
    return lambda: quarantined.held_out(h.name, look(held))


def estimated(env: Environment, model: str) -> Times | None:
    """The save and step seconds the preflight estimates for the tutorial's
    job of ``model`` here (job/save_plan.py); None where it makes none (the
    twin: a CPU has no TPU peak)."""
    try:
        t = save_plan.estimate(env, build_job(env, model))
    except PlaybookError:
        return None
    return t if isinstance(t, Times) else None


def running_model(env: Environment) -> str:
    """The model of the running job (its timeline's model check), else
    the tutorial's first, `invoke train`'s default."""
    for run, _ in reversed(timeline.running_runs(env)):
        if (model := model_of(timeline.read(env, run))) in MODELS:
            return model
    return MODELS[0]


def save_seconds(env: Environment) -> Fact:
    """A save's seconds: as the environment's newest run measured them
    (runs/save_times.py), else as the preflight estimates them for the
    running job's model (``estimated``); a dry run assumes the estimate for
    `invoke train`'s default model."""
    return Fact(name="a save's seconds", python=lambda: save_times.read(env) or estimated(env, running_model(env)),
                assumed=estimated(env, MODELS[0]),
                display=f"# a save's seconds, the newest run's ({paths.training(env.name)}/*/events.jsonl), else the "
                        f"preflight's estimate for the running job's model",
                describe=lambda t: t.basis if t is not None else "none measured, none estimated")


def grace_words(grace: int, t: Any) -> str:
    """Whether a notice of ``grace`` s holds a save, said before it is given."""
    if t is None:
        return f"a notice of {grace} s: no save measured or estimated here, whether it holds one is not known"
    if grace >= t.whole_s:
        return f"a notice of {grace} s holds a save ({t.whole_s:.3g} s to finalized, {t.kind}): no step should be " \
               "replayed"
    return (f"a notice of {grace} s is shorter than a save ({t.whole_s:.3g} s to finalized, {t.kind}): the save it "
            f"asks for will be cut; the run goes back to its last finalized checkpoint (at most one checkpoint "
            f"period replayed)")


def real_words(env: Environment, grace: int) -> str:
    """How a notice of ``grace`` s stands to what a preemption gives the
    job's pods on the environment's capacity (choices.preemption_grace_s)."""
    if env.platform.simulated:
        return (f"the twin has no capacity option: on GKE a Spot preemption gives the job's pods "
                f"{spot_grace.DEFAULT_PODS_S} s ({spot_grace.PODS_S} s on this project's Standard Spot pools, GKE "
                f"{spot_grace.MIN_GKE} or later)")
    real = preemption_grace_s(env)
    spot = [o for o in env.options if o.preemptible and o.notice_s is not None]
    what = (f"a {spot[0].name} preemption here gives the job's pods {real} s" if spot else
            f"no preemption here gives a notice; a pod deleted or drained gets its grace, {real} s")
    if grace > real:
        return f"{what}: this notice is gentler than the real one (--grace={real} rehearses it)"
    return f"{what}: this notice is {'as long as' if grace == real else 'shorter than'} the real one"


def hang_steps(env: Environment, restore_after: float) -> list[Step]:
    """Freeze the training worker of one host (SIGSTOP: its Ray node stays
    up, so Ray does not declare it dead: the job hangs, as a worker stuck in
    a collective or in jax.distributed.initialize does); resume it after
    ``restore_after`` seconds (SIGCONT; 0: leave it frozen). A target that
    cannot see a frozen worker freezes and resumes in one change; one that
    can verifies the freeze and resumes in a step of its own."""
    w = way(env)
    freezer, resumer = w.freezer(), w.resumer()

    def resumed(v: Any) -> tuple[Any, ...]:
        return (Action(f"sleep {restore_after:g}", lambda: time.sleep(restore_after)), w.resume(v),
                record(env, E.WORKER_RESUMED, **w.hang_fields(v), by="chaos",
                       cause=f"SIGCONT after {restore_after:g}s (chaos.hang-worker)"))

    def decide_hang(look):
        verdict, v, why = freezer.first(look)
        if v is None:
            return _decided(verdict, why)
        reason, would, found = w.hang_words(v, restore_after)
        then = resumed(v) if restore_after > 0 and resumer is None else ()
        return change(w.freeze(v), record(env, E.WORKER_HUNG, **w.hang_fields(v), by="chaos",
                                          cause=f"{w.hang_cause(v)} (chaos.hang-worker)"), *then,
                      reason=reason, would=would, found=found)

    out = [Step("chaos", w.hang_title, decide_hang, id="chaos:hang", after=w.after, verify=w.frozen_verify())]
    if restore_after > 0 and resumer is not None:

        def decide_resume(look):
            v = resumer.frozen(look)
            if v is None:
                return ok("no training worker is frozen: nothing to resume")
            reason, would, found = resumer.words(v, restore_after)
            return change(*resumed(v), reason=reason, would=would, found=found)

        out.append(Step("chaos", "resume the training worker", decide_resume, id="chaos:resume",
                        after=("chaos:hang",), verify=resumer.verify()))
    return out


def sicken_problem(env: Environment) -> str | None:
    """Why the target cannot make a host sick (None: it can)."""
    return way(env).cannot_sicken


def sicken_steps(env: Environment, target: str = placement.FIRST) -> list[Step]:
    """Start one host again sick: fewer JAX devices than its chips, so a
    health check's count of the devices JAX sees finds it. ``first``: the
    environment's first host (whatever its state, so a second run finds it
    sick and changes nothing); a running host is killed first (a worker
    lost), one that is down is started sick (a host that comes back
    broken). It stays sick until ``heal_steps``. The twin only
    (``sicken_problem``)."""
    w = twin(env)
    sick, whole = w.sick_devices, env.devices_per_host
    health = {h.name: w.health_fact(h) for h in w.hosts}
    nodes = w.nodes()
    started: list[Host] = []
    choose = _chooser(env, w, target, _AnyHost(w))

    def decide(look):
        verdict, h, why = choose(look)
        if h is None:
            return _decided(verdict, why)
        started[:] = [h]
        what = f"with {sick} of its {whole} JAX devices"
        sickened = record(env, E.HOST_SICKENED, **w.fields(h), devices=sick, of=whole, by="chaos", target=target,
                          cause=f"started again {what} (XLA_FLAGS; chaos.sicken-worker)")
        reason = f"TPU host {h.name} started again {what}{why}"
        would = shown(f"start TPU host {h.name} again {what}{why}")
        if not w.known(h):  # a dry run: the host the lookup finds
            return change(Action(shown(f"kill TPU host {h.name} if it runs, start it again {what}"), lambda: None),
                          sickened, reason=reason, would=would)
        s = look(health[h.name])
        if s["process"] and s["devices"] < whole:
            return ok(f"TPU host {h.name} already runs sick: {s['devices']} of its {whole} JAX devices")
        lost = record(env, E.WORKER_LOST, **w.fields(h), by="chaos", target=target,
                      cause="SIGKILL of its Ray node, to start it again sick (chaos.sicken-worker)")
        return change(*w.start_again(h, sick, s["process"], look(nodes), (lost,)), sickened, reason=reason,
                      would=would, found=f"TPU host {h.name} " + (
                          f"running with its {s['devices']} devices" if s["process"] else "not running"))

    return [Step("chaos", "make one TPU host sick", decide, id="chaos:sicken",
                 verify=w.health_verify(started, sick))]


class _AnyHost:
    """sicken's choice: a host whatever its state (down: it comes back sick)."""

    def __init__(self, w: TwinHosts):
        self.w = w

    def first(self, look):
        return "act", self.w.hosts[0], ""

    def named(self, look, name, why, target, aimed):
        w = self.w
        if aimed and name not in w.by_name and name != placeholder("TARGET"):
            return "fail", None, f"--target={target}: the running job's host {name} is not a TPU host of {w.env.name}"
        return "act", w.by_name.get(name) or Host(name, -1, -1), why


def heal_target_problem(env: Environment, target: str) -> str | None:
    """What is wrong with chaos.heal-worker's ``--target``: a host by name, or none (every sick host)."""
    w = way(env)
    names = w.by_name if isinstance(w, TwinHosts) else {}
    if target == "" or target in names:
        return None
    return f"--target {target!r}: not a TPU host of {env.name} ({', '.join(names)})"


def heal_steps(env: Environment, target: str = "") -> list[Step]:
    """Start every sick host (``target``: that one) again whole. A dry run
    assumes the first (or the named) host sick, so it shows the heal."""
    w = twin(env)
    whole = env.devices_per_host
    hosts = [w.by_name[target]] if target else w.hosts
    health = {h.name: w.health_fact(h, sick=h == hosts[0]) for h in hosts}
    nodes = w.nodes()
    healed: list[Host] = []

    def decide(look):
        sick = [(h, s) for h in hosts if (s := look(health[h.name]))["process"] and s["devices"] < whole]
        if not sick:
            return ok(f"TPU host {target} is not sick: nothing to heal" if target else
                      "no TPU host is sick: nothing to heal")
        healed[:] = [h for h, _ in sick]
        listed = look(nodes)
        acts = [a for h, s in sick for a in (
            *w.start_again(h, whole, True, listed),
            record(env, E.HOST_HEALED, **w.fields(h), devices=whole, by="chaos",
                   cause=f"started again with its {whole} JAX devices (chaos.heal-worker)"))]
        names = ", ".join(h.name for h, _ in sick)
        return change(*acts, reason=f"healed TPU host {names}: its {whole} JAX devices again",
                      would=f"start TPU host {names} again with its {whole} JAX devices",
                      found=", ".join(f"TPU host {h.name} with {s['devices']} of {whole} devices" for h, s in sick))

    return [Step("chaos", f"heal TPU host {target}" if target else "heal the sick TPU hosts", decide,
                 id="chaos:heal", verify=w.health_verify(healed, whole))]
