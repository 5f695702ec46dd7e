"""How often a job saves, and what a loss costs at that period: pure
arithmetic and its words, no I/O (``save_plan.py`` gathers the numbers).

- The period. The first-order optimum of a checkpoint interval is
  sqrt(2 x the save's time x the mean time between interruptions) (Young,
  "A first order approximation to the optimum checkpoint interval",
  CACM 17(9), 1974; Daly, "A higher order estimate of the optimum
  checkpoint interval for restart dumps", FGCS 22(3), 2006, whose
  higher-order terms are left out). In steps: that / the step time,
  rounded, at least 1, at most the job's steps; where a loss is expected
  within the job (``Plan.losses``: capacity that can be taken back, Spot
  or flex-start, or the twin, whose hosts the chaos tasks take), at most
  half the job's steps (``most_period``). The optimum assumes
  interruptions at random with the MTBI as their mean: one longer than the
  job says "no save until the last step" (MaxText saves step 0, each
  multiple of the period and the last step: ``runs/saves.py``), the least
  expected cost and the worst loss, the whole job. Half the job is the
  longest period that still saves between step 0 and the last step
  (a job of 3 steps or more) and bounds a loss to half the job, for one
  save more at most. The save's time here is
  its blocking part (the trainer's ``checkpoint_saved`` seconds: what the
  steps wait for; Orbax finishes the rest asynchronously); an estimate
  takes the whole save as blocking, which lengthens the period.
- What a loss replays: the steps since the last finalized checkpoint, at
  most one period (N steps, ~N x the step time, x the chips: chip-hours,
  x their price: dollars).
- What a notice gives (``config/choices.py``, each capacity option's
  ``notice`` and ``notice_s``). Spot: "By default, GKE clusters give Pods
  a 30-second graceful termination period after receiving a preemption
  notice", split in two: "the first 15 seconds to shut down your Pods,
  then 15 seconds for critical system Pods"; it can be extended to 120
  seconds, on Standard node pools from GKE 1.35.0-gke.1171000, through the
  node system configuration (GKE's Spot VMs page, "Termination and
  graceful shutdown of Spot VMs",
  https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms). Every
  job saves when told (MaxText's enable_autocheckpoint, ``spec.py``): a
  save that ends within the pods' 15 s costs no replayed step, one that
  does not costs up to a period. Flex-start: no notice, the slice ends at
  its max run duration (7 days by default: ``cloud/slice_ends.py``). On-
  demand and reservations: no notice but host maintenance, announced days
  ahead by a node label (``cloud/slice_ends.py``).
- Where a save cannot end within the notice: MaxText 0.2.5's multi-tier
  checkpointing (its configs/base.yml: ``enable_multi_tier_checkpointing``,
  ``local_checkpoint_directory``, ``local_checkpoint_period``,
  ``multi_tier_checkpointing_backup_interval_minutes``; or the older
  ``enable_emergency_checkpoint`` with the same local keys) saves often to
  a directory on each node and to the bucket less often; on GKE it needs
  the Multi-Tier Checkpointing add-on (``--addons=HighScaleCheckpointing``
  with GcsFuseCsiDriver, GKE 1.32.4-gke.1415000 or later, not on
  Autopilot: "Train large-scale machine learning models on GKE with
  Multi-Tier Checkpointing",
  https://cloud.google.com/kubernetes-engine/docs/how-to/machine-learning/training/multi-tier-checkpointing).
  This project does not set it up: the line names it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from playbooks.config.choices import CapacityOption

# When nothing is measured and nothing can be estimated (a simulated TPU: a
# CPU has no TPU peak): the shipped local inventory's own period.
FALLBACK_PERIOD = 10

MULTI_TIER = ("enable_multi_tier_checkpointing=true local_checkpoint_directory=DIR local_checkpoint_period=K "
              "multi_tier_checkpointing_backup_interval_minutes=M (MaxText's multi-tier checkpointing: a copy on "
              "each node every K steps; GKE's Multi-Tier Checkpointing add-on, --addons=HighScaleCheckpointing, "
              "GKE 1.32.4-gke.1415000 or later, Standard only; this project does not set it up)")


@dataclass(frozen=True)
class Times:
    """A save's and a step's seconds: ``save_s`` its blocking part (the
    period's), ``whole_s`` to its finalization (what a notice must hold),
    ``step_s`` a step; ``measured`` or estimated, ``basis`` how."""

    save_s: float
    whole_s: float
    step_s: float
    basis: str
    measured: bool

    @property
    def kind(self) -> str:
        return "measured" if self.measured else "estimate"


@dataclass(frozen=True)
class Mtbi:
    """The mean time between interruptions expected, and whose figure it is."""

    hours: float
    basis: str


@dataclass(frozen=True)
class Plan:
    """A job's checkpoint period: the steps, where it came from (auto, the
    inventory's checkpoint_period, train_overrides, --set), the times it was
    chosen from (None: neither measured nor estimated), the MTBI, the
    job's steps."""

    period: int
    source: str
    times: Times | None
    mtbi: Mtbi
    steps: int
    why: str = ""  # why there are no times
    losses: str = ""  # why a loss is expected within the job ("": none): auto's period at most half of it

    @property
    def most(self) -> int:
        """The longest period auto chooses for this job."""
        return most_period(self.steps, bool(self.losses))

    @property
    def first_save(self) -> int | None:
        """The first step after step 0 that MaxText saves before the job's
        last step (step % period == 0), counted from a new run; None: none
        does (a period at least the job's last step, or a job of 1 or 2
        steps): a loss before the last step's save loses every step."""
        return self.period if self.period < self.steps - 1 else None


def optimum_seconds(save_s: float, mtbi_s: float) -> float:
    """Young's (and Daly's first-order) optimum interval: sqrt(2 x save x MTBI)."""
    return math.sqrt(2.0 * save_s * mtbi_s)


def most_period(steps: int, losses: bool) -> int:
    """The longest period auto chooses for a job of ``steps``: the job's
    steps, or half of them (at least 1) where a loss is expected within it
    (the module's docstring says why)."""
    return max(1, steps // 2) if losses else max(1, steps)


def period_steps(save_s: float, mtbi_s: float, step_s: float, most: int) -> int:
    """The optimum interval in steps: rounded, at least 1, at most ``most``."""
    return max(1, min(most, round(optimum_seconds(save_s, mtbi_s) / step_s)))


def cap_text(p: Plan, raw: int) -> str:
    """Why auto's period is shorter than ``raw``: the job's steps, or half of them."""
    if raw <= p.most:
        return ""
    if p.losses:
        return f", at most {p.most}: half the job's {p.steps} steps, as {p.losses}"
    return f", at most the job's {p.steps}"


def auto_text(p: Plan) -> str:
    """How auto chose: the formula with its numbers."""
    t = p.times
    if t is None:
        return f"auto: {p.why}: {FALLBACK_PERIOD} steps until a run measures them{cap_text(p, FALLBACK_PERIOD)}"
    opt = optimum_seconds(t.save_s, p.mtbi.hours * 3600)
    raw = max(1, round(opt / t.step_s))
    return (f"auto: sqrt(2 x {t.save_s:.3g} s a save x {p.mtbi.hours:g} h between interruptions) = {opt:.4g} s / "
            f"{t.step_s:.3g} s a step = {raw} steps{cap_text(p, raw)}")


def why_text(p: Plan) -> str:
    """Where the period came from, with the times and the MTBI's basis."""
    head = auto_text(p) if p.source == "auto" else f"from {p.source}"
    times = f"; {p.times.kind}: {p.times.basis}" if p.times is not None else ""
    return f"{head}{times}; MTBI {p.mtbi.hours:g} h: {p.mtbi.basis}"


def replay_text(steps: int, step_s: float | None, chips: int, hourly: tuple[float, float] | None) -> str:
    """'at most 100 steps (~214 s, 1.9 chip-hours, $5.13)'."""
    if step_s is None:
        return f"at most {steps} steps (their time not known)"
    seconds = steps * step_s
    money = ""
    if hourly is not None:
        lo, hi = hourly[0] * seconds / 3600, hourly[1] * seconds / 3600
        money = f", ${lo:,.2f}" if round(lo, 2) == round(hi, 2) else f", ${lo:,.2f}-{hi:,.2f}"
    return f"at most {steps} steps (~{seconds:.3g} s, {seconds * chips / 3600:.3g} chip-hours{money})"


def notice_text(option: CapacityOption | None, t: Times | None, loss: str) -> str:
    """What a notice on ``option`` gives a save of ``t``'s seconds, and
    what a preemption then replays (``loss``, in words); None: the local
    twin, whose hosts get none."""
    if option is None:
        return "the local twin: its hosts are lost without a notice (chaos), as a failed TPU host is"
    if option.notice_s is None:
        return f"{option.name}: {option.notice}"
    if t is None:
        return f"{option.name}: {option.notice}; no save measured or estimated to hold in it"
    lower = t.measured and t.whole_s <= t.save_s  # no finalization recorded: the blocking part, at least
    what = f"a save of ~{t.whole_s:.3g} s ({t.kind}{', its blocking part: at least' if lower else ''})"
    within = f"end within its {option.notice_s} s"
    if notice_holds(option, t):
        return f"{option.name}: {option.notice}: {what} does {within}: a preemption replays no step"
    return (f"{option.name}: {option.notice}: {what} does not {within}: a preemption replays {loss}; what would: "
            f"{MULTI_TIER}")


def notice_holds(option: CapacityOption, t: Times | None) -> bool:
    """Whether a save of ``t``'s seconds ends within the notice a slice of
    ``option`` gives the job's pods (a save it asks is then a checkpoint)."""
    return option.notice_s is not None and t is not None and t.whole_s <= option.notice_s


def preemption_text(p: Plan, taken: tuple[CapacityOption, ...]) -> str:
    """What a preemption (of a slice of ``taken``) does to a job that is not
    elastic: the words after "a preemption". It ends the job; run again,
    the job resumes from its last checkpoint where one is saved before its
    last step (``Plan.first_save``), else it starts over where it started
    (step 0's checkpoint, for a new run: MaxText saves step 0 and the last
    step, ``runs/saves.py``), but from the save a notice asks where that
    save ends within the notice (``notice_holds``)."""
    if p.first_save is not None:
        return (f" ends this job (run again, it resumes from its last checkpoint, saved every {p.period} steps: at "
                f"most {p.period} steps replayed)")
    last, t = p.steps - 1, p.times
    held = [o.name for o in taken if notice_holds(o, t)]
    spared = (f"; but a {' or '.join(held)} notice's save, ~{t.whole_s:.3g} s ({t.kind}), ends within the notice: "
              f"run again, it resumes from that save") if held and t is not None else ""
    better = most_period(p.steps, True)
    hint = f"; checkpoint_period={better} would save at step {better}" if better < last else ""
    source = "auto" if p.source == "auto" else f"from {p.source}"
    return (f" before the save of step {last}, the job's last, ends this job, and run again it starts over where it "
            f"started (step 0 for a new run{spared}): checkpoint_period={p.period} ({source}) saves no checkpoint "
            f"before it{hint}")


def line(p: Plan, options: tuple[CapacityOption | None, ...], chips: int,
         hourly: tuple[float, float] | None) -> str:
    """The one line before a submit: the period and why, what a loss
    replays at it, and what each capacity option's notice gives a save."""
    loss = replay_text(p.period, p.times.step_s if p.times else None, chips, hourly)
    notices = "; ".join(notice_text(o, p.times, loss) for o in options)
    return (f"checkpoint period: {p.period} steps ({why_text(p)}); a loss replays {loss}; notice: {notices}")
