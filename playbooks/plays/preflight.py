"""Preflight: prove a training job fits the chips before anyone pays for TPUs:
its static checks, then its AOT compile (and, when it does not fit, the
search for the smallest change that does). What is checked and how a compile
is read is ``playbooks/job/fit.py``."""
from __future__ import annotations

from playbooks.access import connectors
from playbooks.cloud import node_shutdown
from playbooks.config import paths
from playbooks.config.schema import Environment
from playbooks.config.tpu import generation
from playbooks.config.versions import installed
from playbooks.core.lock import machine_lock
from playbooks.core.play import Outcome, StepContext
from playbooks.core.recap import FAILED, OK, SKIPPED
from playbooks.core.step import Step, fail, ok, skipped
from playbooks.job import fit as F
from playbooks.job import save_period
from playbooks.job.spec import PRESETS, Job

PLAY = "preflight"


def _cache_hit(ctx: StepContext, args: list[str]) -> F.Fit | None:
    hit = F.cached(args)
    if hit is not None:
        ctx.log.emit("probe", f"{F.compile_command(args, F.cache_key(args)).line()}  => "
                              f"{'fits' if hit.fits else 'does not fit'} (cached {F.cache_key(args)})")
    return hit


def fit(ctx: StepContext, env: Environment, job: Job, extra: F.Extra = (), slices: int | None = None) -> F.Fit | None:
    """The fit of the job (plus ``extra`` settings), from the cache or a compile."""
    args = F.compile_args(env, job, extra, slices)
    if not ctx.probing:
        result = ctx.look(F.compile_fact(args))
        return result if isinstance(result, F.Fit) else None
    hit = _cache_hit(ctx, args)
    if hit is not None:
        return hit
    with machine_lock(F.COMPILE_LOCK, "one TPU compile at a time on a machine: libtpu's own lock",
                      lambda line: ctx.echo(f"  ... {line}")):
        hit = _cache_hit(ctx, args)  # the compile we waited for may have been this one
        if hit is not None:
            return hit
        # libtpu writes its logs (the compiler's own memory account) only
        # into a folder that exists.
        connectors.this_machine().make_dirs(paths.preflight_tpu_logs(F.cache_key(args)))
        what = f"compiling for {slices or env.slices} x {generation(env).compile_topology(env.topology)}"
        with ctx.beating(what, lambda: ""):
            result = ctx.look(F.compile_fact(args))
    return result if isinstance(result, F.Fit) else None


def static_step(env: Environment, job: Job) -> Step:
    """The mesh, hosts and manifest rules, then (on TPUs) the estimate of
    each chip's HBM on every shape the job may run on: a confident misfit
    fails here, in an instant, with the change that fits."""
    def decide(look):
        problems = F.static_checks(env, job)
        got = F.estimates(env, job) if env.platform.cloud and not problems else None
        if got is not None and not isinstance(got, str):
            problems += [p for p in (F.memory_problem(env, job),) if p]
        if problems:
            n = len(problems)
            head = f"{n} static check{'s' if n > 1 else ''} failed: {problems[0]}" + (" ..." if n > 1 else "")
            return fail(head + ("\n" + "\n".join(f"- {p}" for p in problems) if n > 1 else ""))
        said = "" if got is None else f"; {got}" if isinstance(got, str) else f"; {F.estimated(env, got)}"
        notes = [] if got is None or isinstance(got, str) else [f"estimate on {where}: {e.line()}"
                                                                 for where, e in F.grouped(env, got)]
        if job.derived:
            notes.insert(0, f"ICI parallelism from the slice's {F.slice_devices(env)} devices (no ici_* set; the "
                            f"tutorial's are for the 16 chips of its slice): "
                            f"{' '.join(f'{k}={v}' for k, v in job.derived)}")
        return ok(f"{dict(job.args).get('model_name')}: mesh, hosts and manifest agree "
                  f"({F.slice_devices(env)} devices per slice x {env.slices} slices){said}", notes=notes)

    return Step(PLAY, "static checks", decide, id="preflight:static")


def _shapes_line(env: Environment, job: Job) -> str:
    return " and ".join(F.shape_name(env, n) for n in F.shapes(env, job))


def _smaller_shapes(ctx: StepContext, env: Environment, job: Job, full: F.Fit) -> Outcome:
    """An elastic job that fits every slice: each smaller shape it may
    shrink to, compiled too; those that do not fit named in one line."""
    shape = F.shape_name(env, env.slices)
    said = f"fits {shape} with {full.margin:.2f} GiB to spare per chip" + (" (cached)" if full.cached else "")
    bad, errors = [], []
    for n in F.shapes(env, job)[1:]:
        r = fit(ctx, env, job, (), n)
        if r is None:
            continue
        for line in r.lines():
            ctx.echo(f"  {F.shape_name(env, n)}: {line}")
        if r.error:
            errors.append(f"{F.shape_name(env, n)} does not compile: {r.error}")
        elif not r.fits:
            bad.append(f"{F.shape_name(env, n)} (needs {r.needed:.2f} GiB of temporaries per chip)")
    if errors:
        return Outcome(FAILED, f"{said}, but {'; '.join(errors)}")
    if bad:
        return Outcome(FAILED, f"{said}, but the elastic job will not run on {', '.join(bad)}, where it shrinks "
                               f"after a lost slice: train it without --elastic, or with a change that fits "
                               f"those too (`invoke preflight --model={job.model} --elastic` names one)")
    more = F.shapes(env, job)[1:]
    return Outcome(OK, said + (f", and {', '.join(F.shape_name(env, n) for n in more)}" if more else ""))


def fit_step(env: Environment, job: Job, search: bool) -> Step:
    """A run step: the search compiles one candidate after another and says
    each as it goes (minutes each). An elastic job is compiled for every
    shape it may run on."""
    shape = F.shape_name(env, env.slices)

    def run(ctx: StepContext) -> Outcome:
        if F.static_checks(env, job):
            return Outcome(SKIPPED, "the static checks failed: nothing to compile")
        ctx.note(f"MaxText {installed('maxtext')}, jax {installed('jax')}, libtpu {installed('libtpu')} "
                 f"(the libtpu trainer/requirements.txt installs on the TPU workers)")
        result = fit(ctx, env, job)
        if result is None:
            for n in F.shapes(env, job)[1:]:
                fit(ctx, env, job, (), n)
            return Outcome(OK, f"would compile the job for {_shapes_line(env, job)}")
        for line in result.lines():
            ctx.echo(f"  {line}")
        if result.error:
            return Outcome(FAILED, f"the job does not compile for {shape}: {result.error}")
        if result.fits:
            return _smaller_shapes(ctx, env, job, result)
        short = (f"does not fit {shape}: needs {result.needed:.2f} GiB of temporaries per chip, has "
                 f"{result.capacity:.2f} GiB")
        if not search:
            preset = PRESETS.get(job.model, {}).get("fits")
            hint = (f"; a preset that fits: {F.ready_command(env, job, preset)}"
                    if preset and not F.job_uses(job, preset)
                    else f"; `invoke preflight --model={job.model}` searches for a change that fits")
            return Outcome(FAILED, short + hint)
        return _search(ctx, env, job, short)

    return Step(PLAY, "fits the TPU HBM (ahead-of-time compile)", run=run, id="preflight:fit",
                after=("preflight:static",))


def _search(ctx: StepContext, env: Environment, job: Job, short: str) -> Outcome:
    plan = F.search_plan(env, job)
    for a in plan:
        ctx.echo(f"  trying {a.what}")
        r = fit(ctx, env, job, a.extra, a.slices)
        for line in r.lines() if r is not None else ():
            ctx.echo(f"    {line}")
        if r is not None and r.fits:
            return Outcome(FAILED, F.found(env, job, short, a, r))
    return Outcome(FAILED, F.none_found(env, job, short, plan))


def save_step(env: Environment, job: Job) -> Step:
    """What each capacity option's notice gives a save of this job, and what
    a loss replays at its checkpoint period (``job/save_period.py``; the
    dollars are `train`'s, which reads the prices)."""
    plan = job.save_plan
    sent = node_shutdown.sender(env)   # the options as this gcloud makes their pools

    def decide(look):
        return ok(save_period.line(plan, sent(look) or (None,), env.slices * env.hosts_per_slice
                                   * env.chips_per_host, None))
    return Step(PLAY, "checkpoint period and notices", decide, id="preflight:save-period")


def steps(env: Environment, job: Job, search: bool = True) -> list[Step]:
    if env.platform.simulated:
        fit_check = skipped(PLAY, "fits the TPU HBM (ahead-of-time compile)",
                            "a local environment trains on CPU: the fit check is for TPU HBM", id="preflight:fit",
                            after=("preflight:static",))
    else:
        fit_check = fit_step(env, job, search)
    return [static_step(env, job), fit_check]
