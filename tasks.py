"""Tasks: the tutorial "Train Llama 3 70B with MaxText, Ray Train and
multislice Trillium on GKE with KubeRay and DRANET", as idempotent, checked
playbooks. `invoke --list` for the tasks, `invoke --help TASK` for one.

Environment: config key playbook.env (INVOKE_PLAYBOOK_ENV), default from the
inventory. Inventory: playbook.inventory (INVOKE_PLAYBOOK_INVENTORY).
Modes: apply (default), check (playbook.mode=check), dry run (invoke --dry).
"""
import signal

from invoke import Collection, task

# Output piped into `head` ends quietly, like any command-line tool.
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

# Only light modules here: `invoke --list` must stay instant.
from playbooks.cli.session import (  # noqa: E402 - after SIGPIPE
    bare_flag,
    clean_errors,
    install_last_resort,
    open_session,
    seconds,
    whole_number,
)

# An error Invoke raises reading its config files after this import (a
# `playbook:` that is not a mapping, a project invoke.yaml that is not YAML)
# is one line too, not a traceback.
install_last_resort()


def _play(c, name):
    from playbooks.cli import chain, task_steps

    with clean_errors():
        s = open_session(c.config, name)
        s.run(name, task_steps.chained(s.env, name, task_steps.play_steps(s.env, name), chain.current()))


@task
def capacity(c):
    """Read-only, before anything is made: the machine type, the GKE version, the TPU quota, the reservation."""
    _play(c, "capacity")


@task
def prereqs(c):
    """§1 Enable the APIs; grant your user its three IAM roles."""
    _play(c, "prereqs")


@task
def network(c):
    """§2 The two DCN VPC networks (MTU 8896) and their subnets."""
    _play(c, "network")


@task
def cluster(c):
    """§3 The GKE cluster (Standard or Autopilot, from the inventory) and kubectl credentials."""
    _play(c, "cluster")


@task
def nodepools(c):
    """§4 One multi-host TPU v6e node pool per slice (Standard; skipped on Autopilot)."""
    _play(c, "nodepools")


@task
def storage(c):
    """§5 The checkpoint bucket, the Kubernetes service account, its workload-identity binding."""
    _play(c, "storage")


@task
def raycluster(c):
    """§7 Apply the RayCluster (with DRANET NICs) and wait until every TPU worker is ready."""
    _play(c, "raycluster")


@task
def dashboard(c):
    """Port-forward the Ray dashboard (8265) and check 1 head + every TPU worker."""
    _play(c, "dashboard")


@task
def up(c):
    """Everything above, in the tutorial's order (local: start the local Ray cluster)."""
    from playbooks.cli import chain, task_steps

    with clean_errors():
        s = open_session(c.config, "up")
        s.run("up", task_steps.chained(s.env, "up", task_steps.up_steps(s.env), chain.current()))


JOB_HELP = {
    "model": "llama3-8b (default) or llama3-70b: the tutorial's job for that model",
    "elastic": "the elastic trainer's job (goes on with fewer slices, grows back)",
    "steps": "training steps, a whole number >= 1 (default: the job's own, 100 in the tutorial)",
    "set": "key=value: a MaxText setting added to or replacing the job's (repeatable)",
    "preset": "a named set of changes, e.g. --model=llama3-70b --preset=fits (fits 2 x v6e-16)",
}


def _job(s, model, elastic, steps, sets, fresh, preset):
    """The job the flags ask for (a bad flag is one line, exit 2)."""
    from playbooks.job import spec

    # Invoke passes a bare `--set` (no key=value after it) as no --set at all.
    bare_flag("--set", "-t")
    n = whole_number("--steps", steps, 1, spec.MAX_STEPS, "the tutorial's jobs run 100") if steps != "" else None
    return spec.build_job(s.env, model, elastic, n, sets or [], fresh, preset)


@task(
    iterable=["set_"],
    help={
        **JOB_HELP,
        "fresh": "delete the run's checkpoints first, so it starts from step 0",
        "skip_preflight": "submit without the static checks and the AOT fit check (GKE runs them by default)",
    },
)
def train(c, model="llama3-8b", elastic=False, steps="", set_=None, fresh=False, preset="", skip_preflight=False):
    """§8-9 Submit the tutorial's training job with `ray job submit`, follow it, exit with its status."""
    from playbooks.cli import task_steps

    with clean_errors():
        s = open_session(c.config, "train")
        job = _job(s, model, elastic, steps, set_, fresh, preset)
        log = (s.logdir / "job.log") if s.logdir else None
        s.run("train", task_steps.train_steps(s.env, job, log, preflight_first=not skip_preflight), parallel=False)


@task(iterable=["set_"], help=JOB_HELP)
def preflight(c, model="llama3-8b", elastic=False, steps="", set_=None, preset=""):
    """Prove a job fits its TPUs: static checks, an AOT compile (if it does not fit, the smallest change that does)."""
    from playbooks.cli import task_steps

    with clean_errors():
        s = open_session(c.config, "preflight")
        job = _job(s, model, elastic, steps, set_, False, preset)
        s.run("preflight", task_steps.preflight_steps(s.env, job), parallel=False)


def _run_flag(run: str) -> str | None:
    from playbooks.config.maxtext_settings import run_name_problem
    from playbooks.core.errors import InputError

    if run == "":
        return None
    why = run_name_problem(run)
    if why:
        raise InputError(f"--run {run!r}: a run name {why}")
    return run


@task(help={"run": "the run (its run_name); default: the newest job of this environment",
            "follow": "follow the log to the job's end (the exit code is then its outcome)"})
def logs(c, run="", follow=False):
    """The driver log of a run's newest job (Ray Jobs SDK); --follow to its end, exiting with its outcome."""
    from playbooks.cli import task_steps
    from playbooks.plays import logs as lg

    with clean_errors():
        s = open_session(c.config, "logs")
        name = _run_flag(run)
        steps = [] if s.env.kind == "local" else task_steps.cluster_ready_steps(s.env)
        s.run("logs", steps + [lg.logs_step(s.env, name, follow)], parallel=False)


@task(help={"run": "the run (its run_name); default: the newest run with metrics"})
def metrics(c, run=""):
    """Draw a run's step metrics (loss, tokens/s per device, step time) into its metrics.png."""
    from playbooks.plays import logs as lg

    with clean_errors():
        s = open_session(c.config, "metrics")
        s.run("metrics", [lg.metrics_step(s.env, _run_flag(run))], parallel=False)


@task(help={"restore_after": "local only: seconds before the killed host comes back (default 60; 0: never)"})
def delete_worker(c, restore_after="60"):
    """§9 Delete one Ray TPU worker pod (local: kill one simulated TPU host), as a preemption would."""
    from playbooks.cli import task_steps

    with clean_errors():
        s = open_session(c.config, "chaos")
        s.run("chaos", task_steps.chaos_steps(s.env, seconds("--restore-after", restore_after)), parallel=False)


@task(help={"restore_after": "seconds before the frozen worker is resumed (default 60; 0: never)"})
def hang_worker(c, restore_after="60"):
    """Freeze one worker's trainer (SIGSTOP; local: one simulated host's), resume it after --restore-after: a stall."""
    from playbooks.cli import task_steps

    with clean_errors():
        s = open_session(c.config, "chaos")
        s.run("chaos", task_steps.hang_steps(s.env, seconds("--restore-after", restore_after)), parallel=False)


def _report(c, task: str, make_step, step_id: str, as_json: bool, lines_of) -> None:
    """A read-only report task (goodput, runs): its one step run quietly,
    then its data printed as JSON or as lines (a dry run prints the step)."""
    import json

    from playbooks.cli.session import Failed
    from playbooks.core.recap import Reporter
    from playbooks.core.runner import Mode

    with clean_errors():
        s = open_session(c.config, task, reporter=Reporter(lambda line: None), read_only=True)
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
            "json": "print it as one JSON object (run, wall_s, productive_s, goodput_pct, badput_s, incidents, cost)"})
def goodput(c, run="", json_=False):
    """What each second of a run went to: productive steps, badput by cause, each incident, its cost (read-only)."""
    from playbooks.plays import logs as lg
    from playbooks.runs import goodput as gp

    _report(c, "goodput", lambda env: lg.goodput_step(env, _run_flag(run)), "goodput:report", json_,
            lambda env, report: gp.lines(report))


@task(help={"json": "print them as one JSON list (run, state, steps, wall_s, goodput_pct, chip_hours, cost, ...)"})
def runs(c, json_=False):
    """Every run this environment knows (its timelines), newest first: state, steps, wall, goodput, chip-hours, cost."""
    from playbooks.plays import logs as lg
    from playbooks.runs import run_list

    _report(c, "runs", lg.runs_step, "runs:list", json_, lambda env, rows: run_list.table(rows, env.name))


@task(help={"yes": "do not ask for confirmation"})
def teardown(c, yes=False):
    """§10 Delete the RayCluster, the cluster, the bucket, the subnets and networks (a second run is a no-op)."""
    import sys

    from playbooks.cli import task_steps
    from playbooks.core.runner import Mode
    from playbooks.plays import teardown as td

    with clean_errors():
        s = open_session(c.config, "teardown")
        if s.mode is Mode.APPLY and not yes:
            what = td.summary(s.env)
            if not sys.stdin.isatty():
                from playbooks.core.errors import InputError
                raise InputError(f"teardown deletes {what}; confirm with --yes (stdin is not a terminal)")
            try:
                answer = input(f"Delete {what}? Type the environment name ({s.env.name}) to confirm: ")
            except EOFError:  # Ctrl-D: no answer is no
                answer = ""
                print()
            if answer.strip() != s.env.name:
                from invoke.exceptions import Exit
                raise Exit("teardown cancelled", code=1)
        s.run("teardown", task_steps.teardown_steps(s.env))


@task(help={"json": "print it as one JSON document (the exit code: 0 when everything is as the inventory asks)"})
def status(c, json_=False):
    """Everything the environment owns, as it is, and the first thing not as the inventory asks, and why (read-only)."""
    from playbooks.cli import status as st
    from playbooks.cli.session import Failed
    from playbooks.core.recap import Reporter
    from playbooks.core.runner import Mode

    with clean_errors():
        lines: list[str] = []
        s = open_session(c.config, "status", reporter=Reporter(lines.append), read_only=True)
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
            raise Failed(f"status: not as the inventory asks: {doc['diagnosis']}")


@task
def doctor(c):
    """What would stop a run: the tools, gcloud's account, the project, the kubectl context, the gcloud lines' parse."""
    from playbooks.cli import doctor as dr

    with clean_errors():
        s = open_session(c.config, "doctor")
        s.run("doctor", dr.steps(s.env), parallel=False, keep_going=True)


chaos = Collection("chaos")
chaos.add_task(delete_worker)
chaos.add_task(hang_worker)

ns = Collection(capacity, prereqs, network, cluster, nodepools, storage, raycluster, dashboard, up, status, train,
                preflight, logs, metrics, goodput, runs, teardown, doctor)
ns.add_collection(chaos)
# Defaults of None (not 4, not "apply"): Invoke converts an INVOKE_PLAYBOOK_*
# variable to its default's type, and int("abc") would be its traceback;
# playbooks.session checks every value (defaults: apply, 4 steps at once).
ns.configure({"playbook": {"env": None, "inventory": None, "mode": None, "parallel": None, "heartbeat": None,
                            "lock_wait": None}})
