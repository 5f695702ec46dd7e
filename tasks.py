"""Tasks: the tutorial "Train Llama 3 70B with MaxText, Ray Train and
multislice Trillium on GKE with KubeRay and DRANET", as idempotent, checked
playbooks. `invoke --list` for the tasks, `invoke --help TASK` for one.

Environment: --env NAME on any task (one for a whole chain), else config key
playbook.env (INVOKE_PLAYBOOK_ENV), else the inventory's `default:`.
Inventory: playbook.inventory (INVOKE_PLAYBOOK_INVENTORY). Every inventory key
and its rule: docs/inventory.md; the path to GKE, step by step: docs/gke.md.
Modes: apply (default), check (playbook.mode=check), dry run (invoke --dry).
"""
from invoke import Collection, task

# Only light modules here: `invoke --list` must stay instant.
from playbooks.cli.chain import chosen_env
from playbooks.cli.session import (
    bare_flag,
    clean_errors,
    install_last_resort,
    open_session,
    seconds,
    whole_number,
)

# An error Invoke raises reading its config files after this import (a
# `playbook:` that is not a mapping, a project invoke.yaml that is not YAML)
# is one line too, not a traceback; output piped into `head` ends quietly
# (session.stdout_gone: SIGPIPE stays ignored).
install_last_resort()


ENV = {"env": "the inventory's environment to act on (wins over INVOKE_PLAYBOOK_ENV); one --env for a whole chain"}


def _session(c, task: str, env: str, **kw):
    """The task's run, on the environment its --env (or its chain's) names."""
    return open_session(c.config, task, env_flag=chosen_env(env), **kw)


def _play(c, name, env):
    from playbooks.cli import chain, task_steps

    with clean_errors():
        s = _session(c, name, env)
        s.run(name, task_steps.chained(s.env, name, task_steps.play_steps(s.env, name), chain.current()))


@task(help=ENV)
def capacity(c, env=""):
    """Read-only, before anything is made: the machine type, the GKE version, the TPU quota, the reservation."""
    _play(c, "capacity", env)


@task(help=ENV)
def prereqs(c, env=""):
    """§1 Enable the APIs; grant your user its three IAM roles."""
    _play(c, "prereqs", env)


@task(help=ENV)
def network(c, env=""):
    """§2 The two DCN VPC networks (MTU 8896) and their subnets."""
    _play(c, "network", env)


@task(help=ENV)
def cluster(c, env=""):
    """§3 The GKE cluster (Standard or Autopilot, from the inventory) and kubectl credentials."""
    _play(c, "cluster", env)


@task(help=ENV)
def nodepools(c, env=""):
    """§4 One multi-host TPU node pool per slice (Standard; skipped on Autopilot)."""
    _play(c, "nodepools", env)


@task(help=ENV)
def storage(c, env=""):
    """§5 The checkpoint bucket, the Kubernetes service account, its workload-identity binding."""
    _play(c, "storage", env)


@task(help=ENV)
def raycluster(c, env=""):
    """§7 Apply the RayCluster (with DRANET NICs) and wait until every TPU worker is ready."""
    _play(c, "raycluster", env)


@task(help=ENV)
def dashboard(c, env=""):
    """Port-forward the Ray dashboard (8265) and check 1 head + every TPU worker."""
    _play(c, "dashboard", env)


@task(help=ENV)
def up(c, env=""):
    """Everything above, in the tutorial's order (local: start the local Ray cluster)."""
    from playbooks.cli import chain, task_steps

    with clean_errors():
        s = _session(c, "up", env)
        s.run("up", task_steps.chained(s.env, "up", task_steps.up_steps(s.env), chain.current()))


JOB_HELP = {
    "model": "llama3-8b (default) or llama3-70b: the tutorial's job for that model",
    "elastic": "the elastic trainer's job (goes on with fewer slices, grows back)",
    "steps": "training steps, a whole number >= 1 (default: the job's own, 100 in the tutorial)",
    "set": "key=value: a MaxText setting added to or replacing the job's (repeatable)",
    "preset": "a named set of changes made for one shape: --model=llama3-70b --preset=fits is made for 2 x v6e-16 "
              "(32 chips of 31.24 GiB); on another shape the preflight says whether it fits, and the smallest shape "
              "that does",
}


def _job(s, model, elastic, steps, sets, fresh, preset):
    """The job the flags ask for (a bad flag is one line, exit 2)."""
    from playbooks.job import spec

    # Invoke passes a bare `--set` (no key=value after it) as no --set at all.
    bare_flag("--set", "-t")
    from playbooks.cli import task_steps

    n = whole_number("--steps", steps, 1, spec.MAX_STEPS, "the tutorial's jobs run 100") if steps != "" else None
    job = spec.build_job(s.env, model, elastic, n, sets or [], fresh, preset)
    task_steps.choose_period(s.env, job, s.mode)
    return job


@task(
    iterable=["set_"],
    help={
        **JOB_HELP,
        "fresh": "delete the run's checkpoints first, so it starts from step 0 (on GKE: asks first, unless --yes)",
        "skip_preflight": "submit without the static checks and the AOT fit check (GKE runs them by default)",
        "yes": "do not ask before --fresh deletes the run's checkpoints in the bucket",
        "detach": "submit the job and return without following it (stall_watch: cluster watches it on the Ray head)",
        **ENV,
    },
)
def train(c, model="llama3-8b", env="", elastic=False, steps="", set_=None, fresh=False, preset="",
          skip_preflight=False, yes=False, detach=False):
    """§8-9 Submit the tutorial's training job with `ray job submit`, follow it, exit with its status."""
    from playbooks.cli import task_steps
    from playbooks.cli.confirm import confirm
    from playbooks.plays.train import fresh_summary

    with clean_errors():
        s = _session(c, "train", env, changing=fresh)  # --fresh: the lock held until the checkpoints are deleted
        job = _job(s, model, elastic, steps, set_, fresh, preset)
        log = (s.logdir / "job.log") if s.logdir else None
        steps_ = task_steps.train_steps(s.env, job, log, preflight_first=not skip_preflight, detach=detach)
        if fresh and s.env.platform.cloud:  # local checkpoints are this machine's own rehearsal's
            confirm("train --fresh", s.env.name, s.mode, fresh_summary(job), yes)
        s.run("train", steps_, parallel=False)


@task(iterable=["set_"], help={**JOB_HELP, **ENV})
def preflight(c, model="llama3-8b", env="", elastic=False, steps="", set_=None, preset=""):
    """Prove a job fits its TPUs: static checks, an AOT compile (if it does not fit, the smallest change that does)."""
    from playbooks.cli import task_steps

    with clean_errors():
        s = _session(c, "preflight", env)
        job = _job(s, model, elastic, steps, set_, False, preset)
        # The compile proves (or refutes) the estimate: it runs after an estimate's misfit too.
        s.run("preflight", task_steps.preflight_steps(s.env, job), parallel=False, keep_going=True)


def _run_flag(run: str) -> str | None:
    from playbooks.config.maxtext_settings import run_name_problem
    from playbooks.core.errors import InputError

    if run == "":
        return None
    why = run_name_problem(run)
    if why:
        raise InputError(f"--run {run!r}: a run name {why}")
    return run


@task(help={"run": "the run (its run_name) of the job", "job": "the job's submission id (<run>-<n>)",
            "elastic": "the job is elastic (a host can be set aside and the job go on)", **ENV})
def watch(c, run="", job="", env="", elastic=False):
    """Watch one job to its end and act (stall_action, the health gate): what `train` runs on the Ray head."""
    from playbooks.cli import task_steps
    from playbooks.core.errors import InputError

    with clean_errors():
        name = _run_flag(run)
        if name is None:
            raise InputError("watch: --run is required (the run of the job to watch)")
        if not job.startswith(f"{name}-") or not job[len(name) + 1:].isdigit():
            raise InputError(f"watch: --job {job!r} is not a job of run {name} (<run>-<n>, e.g. {name}-1)")
        s = _session(c, "watch", env)
        log = (s.logdir / "job.log") if s.logdir else None
        s.run("watch", task_steps.watch_steps(s.env, name, job, elastic, log), parallel=False)


@task(help={"run": "the run (its run_name); default: the newest job of this environment",
            "follow": "follow the log to the job's end (the exit code is then its outcome)", **ENV})
def logs(c, run="", follow=False, env=""):
    """The driver log of a run's newest job (Ray Jobs SDK); --follow to its end, exiting with its outcome."""
    from playbooks.cli import task_steps
    from playbooks.plays import logs as lg

    with clean_errors():
        s = _session(c, "logs", env)
        name = _run_flag(run)
        steps = [] if s.env.platform.simulated else task_steps.cluster_ready_steps(s.env)
        kept = (s.logdir / "job.log") if (follow and s.logdir) else None
        # keep_going: with no dashboard to reach, the log step shows the copy a follow kept.
        s.run("logs", steps + [lg.logs_step(s.env, name, follow, kept)], parallel=False, keep_going=True)


@task(help={"run": "the run (its run_name); default: the newest run with metrics", **ENV})
def metrics(c, run="", env=""):
    """Draw a run's step metrics (loss, tokens/s per device, step time) into its metrics.png."""
    from playbooks.plays import logs as lg

    with clean_errors():
        s = _session(c, "metrics", env)
        s.run("metrics", [lg.metrics_step(s.env, _run_flag(run))], parallel=False)


@task(help={"restore_after": "local only: seconds before the killed host comes back (default 60; 0: never)",
            "target": "which worker: first (default, the tutorial's), rank0 or peer (of the running job), or a "
                      "host's or pod's name", **ENV})
def delete_worker(c, restore_after="60", target="first", env=""):
    """§9 Delete one Ray TPU worker pod (local: kill one simulated TPU host), as a preemption would."""
    from playbooks.cli import task_steps
    from playbooks.core.errors import InputError

    with clean_errors():
        s = _session(c, "chaos", env)
        if problem := task_steps.chaos_target_problem(s.env, target):
            raise InputError(problem)
        s.run("chaos", task_steps.chaos_steps(s.env, seconds("--restore-after", restore_after), target),
              parallel=False)


@task(help={"grace": "seconds from the notice to the host's end (default: what a preemption gives the job's pods on "
                     "the environment's capacity: a Spot pool's 15 s, or 105 s where this project lengthens it; "
                     "else a pod's grace, 30 s; 1-3600)",
            "restore_after": "seconds before the killed host is started again (default 60; 0: never; local only: "
                             "KubeRay recreates a deleted pod)",
            "target": "which worker: first (default), rank0 or peer (of the running job), or a host's or pod's name",
            **ENV})
def preempt_worker(c, grace="", restore_after="60", target="first", env=""):
    """A notice, then the loss: one TPU host told it goes in --grace seconds (GKE: its pod deleted with that grace
    period; local: its Ray node drained as the pod's preStop hook does, then killed)."""
    from playbooks.cli import task_steps
    from playbooks.config import host_notice
    from playbooks.core.errors import InputError

    with clean_errors():
        s = _session(c, "chaos", env)
        notice_s = seconds("--grace", grace) if grace != "" else None  # "": the preemption's own (task_steps)
        problem = host_notice.grace_problem(notice_s) if notice_s is not None else None
        if problem := problem or task_steps.chaos_target_problem(s.env, target):
            raise InputError(problem)
        s.run("chaos", task_steps.preempt_steps(s.env, None if notice_s is None else int(notice_s),
                                                seconds("--restore-after", restore_after), target), parallel=False)


@task(help={"in": "seconds from now to the slice's host maintenance (default 120; 1-86400)",
            "restore_after": "local: seconds before the slice's hosts are started again after it (default 60; 0: "
                             "never)",
            "target": "which worker's slice: first (default), rank0 or peer (of the running job), or a host's or "
                      "pod's name", **ENV},
      name="maintenance")
def maintenance_notice(c, in_="120", restore_after="60", target="first", env=""):
    """A host maintenance scheduled for one slice in --in seconds, as GKE announces one (a node label; local: the
    twin's record, then the slice's hosts killed at that time): the watch gives the slice its notice before it."""
    from playbooks.cli import task_steps
    from playbooks.core.errors import InputError

    with clean_errors():
        s = _session(c, "chaos", env)
        when = seconds("--in", in_, maximum=86400)
        if when < 1:
            raise InputError(f"--in {in_}: must be at least 1 second")
        if problem := task_steps.chaos_target_problem(s.env, target):
            raise InputError(problem)
        s.run("chaos", task_steps.maintenance_steps(s.env, when, seconds("--restore-after", restore_after), target),
              parallel=False)


@task(help={"restore_after": "seconds before the frozen worker is resumed (default 60; 0: never)", **ENV})
def hang_worker(c, restore_after="60", env=""):
    """Freeze one worker's trainer (SIGSTOP; local: one simulated host's), resume it after --restore-after: a stall."""
    from playbooks.cli import task_steps

    with clean_errors():
        s = _session(c, "chaos", env)
        s.run("chaos", task_steps.hang_steps(s.env, seconds("--restore-after", restore_after)), parallel=False)


@task(help={"target": "which host: first (default: the environment's first), rank0 or peer (of the running job), or a "
                      "host's name", **ENV})
def sicken_worker(c, target="first", env=""):
    """Local only: start one simulated TPU host again with fewer JAX devices than its chips (a host back broken)."""
    _host_health(c, env, "chaos.sicken-worker", target, sick=True)


@task(help={"target": "the sick host to heal, by name (default: every sick host)", **ENV})
def heal_worker(c, target="", env=""):
    """Local only: start every sick simulated TPU host (chaos.sicken-worker) again whole."""
    _host_health(c, env, "chaos.heal-worker", target, sick=False)


def _host_health(c, env: str, task: str, target: str, sick: bool) -> None:
    """chaos.sicken-worker and chaos.heal-worker: the target checked, then
    the chaos play's steps that start a host again sick or whole."""
    from playbooks.core.errors import InputError
    from playbooks.plays import chaos as ch

    with clean_errors():
        s = _session(c, "chaos", env)
        aimed = ch.target_problem(s.env, target) if sick else ch.heal_target_problem(s.env, target)
        if problem := ch.sicken_problem(s.env) or aimed:
            raise InputError(f"{task}: {problem}")
        s.run("chaos", ch.sicken_steps(s.env, target) if sick else ch.heal_steps(s.env, target), parallel=False)


def _report(c, task: str, env: str, make_step, step_id: str, as_json: bool, lines_of) -> None:
    """A read-only report task (goodput, runs): its one step run quietly,
    then its data printed as JSON or as lines (a dry run prints the step)."""
    import json

    from playbooks.cli.session import Failed
    from playbooks.core.recap import Reporter
    from playbooks.core.runner import Mode

    with clean_errors():
        s = _session(c, task, env, reporter=Reporter(lambda line: None), read_only=True)
        step = make_step(s.env)
        if s.mode is Mode.DRY:
            s.book.reporter = Reporter()
            s.run(task, [step])
            return
        recap = s.book.run(f"{task} {s.env.name}", [step])
        data = recap.data(step_id)
        if data is None:
            raise Failed(f"{task}: {recap.results[0].reason if recap.results else 'not run'}")
        if as_json:
            print(json.dumps(data))
        else:
            Reporter().block(lines_of(s.env, data))


@task(help={"run": "the run (its run_name); default: the newest run with a timeline",
            "json": "print it as one JSON object (run, wall_s, productive_s, goodput_pct, badput_s, incidents, cost)",
            **ENV})
def goodput(c, run="", json_=False, env=""):
    """What each second of a run went to: productive steps, badput by cause, each incident, its cost (read-only)."""
    from playbooks.plays import logs as lg
    from playbooks.runs import goodput as gp

    _report(c, "goodput", env, lambda env: lg.goodput_step(env, _run_flag(run)), "goodput:report", json_,
            lambda env, report: gp.lines(report) if report.get("run") else [report["none"]])


@task(help={"json": "print one JSON object: runs (run, state, jobs, steps, wall_s, goodput_pct, chip_hours, cost, ...) "
                    "and environment_cost",
            **ENV})
def runs(c, json_=False, env=""):
    """Every run this environment knows (its timelines), newest first, and what the environment costs (read-only)."""
    from playbooks.plays import logs as lg
    from playbooks.runs import run_list

    _report(c, "runs", env, lg.runs_step, "runs:list", json_,
            lambda env, doc: run_list.table(doc["runs"], env.name) + doc["environment_cost"]["lines"])


@task(help={"yes": "do not ask for confirmation",
            "delete-bucket": "delete the bucket too, with every run's checkpoints (kept without it)", **ENV})
def teardown(c, yes=False, delete_bucket=False, env=""):
    """§10 Delete the RayCluster, the cluster, the subnets and networks; keep the bucket unless --delete-bucket."""
    from playbooks.cli import task_steps
    from playbooks.cli.confirm import confirm
    from playbooks.core.errors import InputError
    from playbooks.plays import teardown as td

    with clean_errors():
        s = _session(c, "teardown", env)
        if delete_bucket and s.env.platform.simulated:
            raise InputError(f"teardown --delete-bucket: environment {s.env.name!r} is local: it has no bucket "
                             "(its runs' checkpoints are on this machine; `invoke train --fresh` deletes a run's)")
        confirm("teardown", s.env.name, s.mode, td.summary(s.env, delete_bucket), yes)
        s.run("teardown", task_steps.teardown_steps(s.env, delete_bucket))


@task(name="stop-tpus", help=ENV)
def stop_tpus(c, env=""):
    """Stop the TPUs' bill, keep the rest: the TPU node pools deleted (`up` makes them again); cluster, bucket kept.

    Named for what it stops (not `pause`: a job on the TPUs ends with them; `invoke up`, then `invoke train`,
    resumes its run from the last finalized checkpoint). Autopilot: the RayCluster is deleted, and with its TPU
    workers the TPU nodes. Local: the simulated TPU hosts stop; the Ray head stays.
    """
    from playbooks.cli import task_steps

    with clean_errors():
        s = _session(c, "stop-tpus", env)
        s.run("stop-tpus", task_steps.stop_tpus_steps(s.env))


@task(help={"json": "print it as one JSON document (the exit code: 0 when everything is as the inventory asks)",
            **ENV})
def status(c, json_=False, env=""):
    """Everything the environment owns, as it is, and the first thing not as the inventory asks, and why (read-only)."""
    from playbooks.cli import status as st
    from playbooks.cli.session import Failed
    from playbooks.core.recap import Reporter
    from playbooks.core.runner import Mode

    with clean_errors():
        lines: list[str] = []
        s = _session(c, "status", env, reporter=Reporter(lines.append), read_only=True)
        if s.mode is Mode.DRY:
            s.book.reporter = Reporter()
            s.run("status", st.steps(s.env))
            return
        # Every look, whatever failed before it: a status that stops at the
        # first API that fails tells the least when it is needed most.
        recap = s.book.run(f"status {s.env.name}", st.steps(s.env), workers=max(4, s.book.workers), keep_going=True)
        doc = st.report(s.env, recap)
        doc["logs"] = str(s.logdir.relative_to(s.logdir.parents[3])) if s.logdir else None
        if json_:
            print(st.render_json(doc))
        else:
            Reporter().block(st.table(doc))
        if not doc["as_asked"]:
            # The table ends with the diagnosis: said once.
            raise Failed("status: not as the inventory asks" + (f": {doc['diagnosis']}" if json_ else ""))


@task(help=ENV)
def doctor(c, env=""):
    """What would stop a run: the tools, gcloud's account, the project, the kubectl context, the gcloud lines' parse."""
    from playbooks.cli import doctor as dr

    with clean_errors():
        s = _session(c, "doctor", env)
        s.run("doctor", dr.steps(s.env), parallel=False, keep_going=True)


@task(name="list", default=True, help={"json": "print them as one JSON list (host, slice, why, since, by, nodes, "
                                                "source, held, note)", **ENV})
def hosts_list(c, json_=False, env=""):
    """The quarantined hosts: which, why, since when, by what; on GKE every node cordoned or tainted now, read from
    the cluster, joined with this checkout's record, each said with where it is known from (read-only)."""
    from playbooks.plays import quarantine as q

    _report(c, "hosts", env, q.list_step, "hosts:quarantined", json_,
            lambda env, rows: [line for r in rows for line in q.row_lines(r)] or [q.none_line(env)])


@task(help={"host": "the host: a simulated TPU host's name (local), a TPU slice's node pool (GKE)",
            "why": "why it is set aside, in one line (kept in the record)", **ENV})
def quarantine(c, host, why="", env=""):
    """Set a host aside: recorded; local: its Ray node stopped; GKE: its slice's nodes cordoned, tainted, pods moved."""
    from playbooks.cli import task_steps
    from playbooks.cli.session import one_line

    with clean_errors():
        s = _session(c, "quarantine", env)
        _host(s.env, host)
        text = one_line("--why", why)
        s.run("quarantine", task_steps.quarantine_steps(s.env, host, text, "invoke hosts.quarantine"),
              parallel=False)


@task(help={"host": "the quarantined host to give back", **ENV})
def release(c, host, env=""):
    """Give a host back: GKE: its nodes uncordoned and untainted; local: started again; then out of the record."""
    from playbooks.cli import task_steps

    with clean_errors():
        s = _session(c, "release", env)
        _host(s.env, host)
        s.run("release", task_steps.release_steps(s.env, host), parallel=False)


@task(name="maintenance", help={"host": "the TPU slice's node pool (GKE)", **ENV})
def start_maintenance(c, host, env=""):
    """GKE: start a slice's scheduled host maintenance now (its nodes labelled cloud.google.com/perform-maintenance,
    GKE's documented way); after a save. The watch does it itself with maintenance_start: after_save."""
    from playbooks.cli import task_steps
    from playbooks.core.errors import InputError

    with clean_errors():
        s = _session(c, "maintenance", env)
        if s.env.platform.simulated:
            raise InputError(f"hosts.maintenance: {s.env.name} is local: its simulated maintenance starts at its time "
                             "(chaos.maintenance); GKE only")
        _host(s.env, host)
        s.run("maintenance", task_steps.start_maintenance_steps(s.env, host), parallel=False)


def _host(env, host: str) -> None:
    from playbooks.cli import task_steps
    from playbooks.core.errors import InputError

    if problem := task_steps.host_problem(env, host):
        raise InputError(problem)


hosts = Collection("hosts")
hosts.add_task(hosts_list)
hosts.add_task(quarantine)
hosts.add_task(release)
hosts.add_task(start_maintenance)

chaos = Collection("chaos")
chaos.add_task(delete_worker)
chaos.add_task(preempt_worker)
chaos.add_task(maintenance_notice)
chaos.add_task(hang_worker)
chaos.add_task(sicken_worker)
chaos.add_task(heal_worker)

ns = Collection(capacity, prereqs, network, cluster, nodepools, storage, raycluster, dashboard, up, status, train,
                watch, preflight, logs, metrics, goodput, runs, stop_tpus, teardown, doctor)
ns.add_collection(chaos)
ns.add_collection(hosts)
# Defaults of None (not 4, not "apply"): Invoke converts an INVOKE_PLAYBOOK_*
# variable to its default's type, and int("abc") would be its traceback;
# playbooks.session checks every value (defaults: apply, 4 steps at once).
ns.configure({"playbook": {"env": None, "inventory": None, "mode": None, "parallel": None, "heartbeat": None,
                          "kind": None, "lock_wait": None}})
