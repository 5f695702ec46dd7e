"""A job's checkpoint period, chosen and put on its command line
(``checkpoint_period=N``): from --set, else train_overrides, else the
inventory's ``checkpoint_period`` (a number, or auto: ``save_period.py``'s
optimum from the save and step times and the mean time between
interruptions). The times are the environment's last run's, measured
(``runs/save_times.py`` reads them; ``cli/task_steps.py`` hands them in),
else estimated here, each with its basis:

- a save: the checkpoint's bytes (``memory.checkpoint_bytes``: the
  weights and AdamW's moments) / (the hosts of one data-parallel
  replica, which hold one copy of the state between them, x
  ``HOST_WRITE_GBPS``). An assumption: no
  save to Cloud Storage was measured by this project; a run's own
  ``checkpoint_finalized`` replaces it.
- a step: 6 x the parameters x each chip's tokens (per_device_batch_size
  x max_target_length) FLOPs, the usual dense-transformer count (attention
  and remat's recompute left out), / (the chip's bf16 peak, config/tpu.py,
  x ``ASSUMED_MFU``).
- the MTBI: the inventory's ``interruption_mtbi_hours``, else the shortest
  of its capacity options' (``config/choices.py``: an assumption where
  Google publishes no rate), on the twin on-demand's (its hosts stand for
  on-demand ones).
- whether a loss is expected within the job (``losses``): on capacity that
  can be taken back (each option's ``preemptible``: Spot, flex-start), and
  on the twin, whose hosts the chaos tasks take to rehearse a loss; auto's
  period is then at most half the job's steps, so that a save lands
  between step 0's and the last step's (``save_period.most_period``)."""
from __future__ import annotations

from playbooks.cloud.capacity_options import preemptible
from playbooks.config.choices import ON_DEMAND
from playbooks.config.schema import AUTO, Environment
from playbooks.config.tpu import generation
from playbooks.job import fit, memory
from playbooks.job.save_period import FALLBACK_PERIOD, Mtbi, Plan, Times, most_period, period_steps
from playbooks.job.spec import Job, set_arg

HOST_WRITE_GBPS = 1.0  # GB/s one TPU host writes to Cloud Storage: assumed
ASSUMED_MFU = 0.4
KEY = "checkpoint_period"
SET, OVERRIDES, INVENTORY = "--set", "train_overrides", "the inventory's checkpoint_period"


def mtbi(env: Environment) -> Mtbi:
    """The run's MTBI: the inventory's, else the shortest of its capacity
    options'; an option's figure per VM (Spot's: ``mtbi_per_vm``) is
    divided by the run's VMs, its slices x hosts per slice: each is
    preempted on its own and a slice is lost when any of its VMs is, so
    the interruptions a run expects are each VM's rate x the VMs."""
    if env.interruption_mtbi_hours is not None:
        return Mtbi(float(env.interruption_mtbi_hours), "interruption_mtbi_hours")
    opts = env.options or (ON_DEMAND,)
    vms = max(1, env.slices * env.hosts_per_slice)

    def hours(o) -> float:
        return o.mtbi_hours / vms if o.mtbi_per_vm else o.mtbi_hours

    o = min(opts, key=hours)
    twin = "" if env.options else " (the local twin's hosts stand for on-demand ones)"
    per_vm = (f" ({o.mtbi_hours:g} h per VM / {vms} VMs: a slice is lost when any of its VMs is)"
              if o.mtbi_per_vm else "")
    return Mtbi(hours(o), f"{o.name}'s{twin}{per_vm}, {o.mtbi_basis}")


def losses(env: Environment) -> str:
    """Why a loss is expected within a job of ``env``, in words ("": none)."""
    taken = preemptible(env)
    if taken:
        return f"{' or '.join(taken)} capacity can be taken back"
    if env.platform.simulated:
        return "the chaos tasks take the local twin's hosts"
    return ""


def writing_hosts(env: Environment, s: dict) -> int:
    """The hosts that write one copy of the state: every host over the
    data-parallel replicas (each replica holds the whole state, sharded
    over its hosts; one copy is saved)."""
    axes = memory.mesh(s, fit.slice_devices(env), env.slices)
    replicas = 1
    for a in memory.REPLICA_AXES:
        replicas *= axes.get(a, 1)
    return max(1, env.slices * env.hosts_per_slice // replicas)


def estimate(env: Environment, job: Job) -> Times | str:
    """A save's and a step's seconds, estimated (or why not)."""
    if env.platform.simulated:
        return "nothing measured here yet, and a simulated TPU's CPU has no TPU peak to estimate from"
    s = fit.settings(job)
    why = memory.unsupported(s)
    if why:
        return f"nothing measured here yet, and no estimate for {why}"
    size, params, writers = memory.checkpoint_bytes(s), memory.parameters(s), writing_hosts(env, s)
    save = size / (writers * HOST_WRITE_GBPS * 1e9)
    tokens = float(s.get("per_device_batch_size", 1)) * int(s.get("max_target_length", 2048))
    gen = generation(env)
    step = 6 * params * tokens / (gen.peak_bf16_tflops * 1e12 * ASSUMED_MFU)
    basis = (f"a save {size / 1e9:.4g} GB of state ({params:.3g} parameters and their AdamW moments) / "
             f"({writers} hosts x {HOST_WRITE_GBPS:g} GB/s, assumed) = {save:.3g} s; a step 6 x "
             f"{params:.3g} x {tokens:.0f} tokens per chip / ({gen.peak_bf16_tflops:g} TFLOP/s x "
             f"{ASSUMED_MFU:.0%} MFU, assumed) = {step:.3g} s")
    return Times(save, save, step, basis, measured=False)


def source(env: Environment, job: Job) -> str:
    if KEY in dict(job.sets):
        return SET
    if KEY in (env.train_overrides or {}):
        return OVERRIDES
    return AUTO if env.checkpoint_period == AUTO else INVENTORY


def plan(env: Environment, job: Job, measured: Times | None) -> Plan:
    """The job's period, where it came from, and the times behind it."""
    got = measured if measured is not None else estimate(env, job)
    times, why = (got, "") if isinstance(got, Times) else (None, got)
    m, steps, src, lost = mtbi(env), max(1, job.steps), source(env, job), losses(env)
    if src == AUTO:
        most = most_period(steps, bool(lost))
        period = period_steps(times.save_s, m.hours * 3600, times.step_s, most) if times else \
            min(most, FALLBACK_PERIOD)
    elif src == INVENTORY:
        period = int(env.checkpoint_period)
    else:
        period = int(job.arg(KEY) or 0)
    return Plan(period, src, times, m, steps, why, lost)


def apply(env: Environment, job: Job, measured: Times | None) -> Plan:
    """The period chosen, on the job's command line, and kept with it."""
    p = plan(env, job, measured)
    set_arg(job.args, KEY, str(p.period))
    job.save_plan = p
    return p
