"""Preflight: prove a training job fits the chips before anyone pays for TPUs:
its static checks, then its AOT compile (and, when it does not fit, the
search for the smallest change that does). What is checked and how a compile
is read is ``playbooks/job/fit.py``."""
from __future__ import annotations

from playbooks.access import connectors
from playbooks.config import paths
from playbooks.config.schema import Environment
from playbooks.config.tpu import generation
from playbooks.config.versions import installed
from playbooks.core.lock import machine_lock
from playbooks.core.play import Outcome, StepContext
from playbooks.core.recap import FAILED, OK
from playbooks.core.step import Step, fail, ok, skipped
from playbooks.job import fit as F
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
    def decide(look):
        problems = F.static_checks(env, job)
        if problems:
            n = len(problems)
            head = f"{n} static check{'s' if n > 1 else ''} failed: {problems[0]}" + (" ..." if n > 1 else "")
            return fail(head + "\n" + "\n".join(f"- {p}" for p in problems))
        return ok(f"{dict(job.args).get('model_name')}: mesh, hosts and manifest agree "
                  f"({F.slice_devices(env)} devices per slice x {env.slices} slices)")

    return Step(PLAY, "static checks", decide, id="preflight:static")


def fit_step(env: Environment, job: Job, search: bool) -> Step:
    """A run step: the search compiles one candidate after another and says
    each as it goes (minutes each)."""
    shape = f"{env.slices} x {generation(env).compile_topology(env.topology)}"

    def run(ctx: StepContext) -> Outcome:
        ctx.note(f"MaxText {installed('maxtext')}, jax {installed('jax')}, libtpu {installed('libtpu')} "
                 f"(the libtpu trainer/requirements.txt installs on the TPU workers)")
        result = fit(ctx, env, job)
        if result is None:
            return Outcome(OK, f"would compile the job for {shape}")
        for line in result.lines():
            ctx.echo(f"  {line}")
        if result.error:
            return Outcome(FAILED, f"the job does not compile for {shape}: {result.error}")
        if result.fits:
            return Outcome(OK, f"fits {shape} with {result.margin:.2f} GiB to spare per chip"
                               + (" (cached)" if result.cached else ""))
        short = (f"does not fit {shape}: needs {result.needed:.2f} GiB of temporaries per chip, has "
                 f"{result.capacity:.2f} GiB")
        if not search:
            preset = PRESETS.get(job.model, {}).get("fits")
            hint = (f"; a preset that fits: {F.ready_command(env, job, preset)}"
                    if preset and not F.job_uses(job, preset)
                    else f"; `invoke preflight --model={job.model}` searches for a change that fits")
            return Outcome(FAILED, short + hint)
        plan = F.search_plan(env, job)
        for a in plan:
            ctx.echo(f"  trying {a.what}")
            r = fit(ctx, env, job, a.extra, a.slices)
            for line in r.lines() if r is not None else ():
                ctx.echo(f"    {line}")
            if r is not None and r.fits:
                return Outcome(FAILED, F.found(env, job, short, a, r))
        return Outcome(FAILED, F.none_found(env, short, plan))

    return Step(PLAY, "fits the TPU HBM (ahead-of-time compile)", run=run, id="preflight:fit",
                after=("preflight:static",))


def steps(env: Environment, job: Job, search: bool = True) -> list[Step]:
    if env.kind == "local":
        fit_check = skipped(PLAY, "fits the TPU HBM (ahead-of-time compile)",
                            "a local environment trains on CPU: the fit check is for TPU HBM", id="preflight:fit",
                            after=("preflight:static",))
    else:
        fit_check = fit_step(env, job, search)
    return [static_step(env, job), fit_check]
