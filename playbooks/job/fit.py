"""Does a job fit its TPUs? The mesh arithmetic (static checks), the AOT
compile that answers for the memory (MaxText's train_compile for the TPU
topology, on this machine's CPU), how its output is read, the cache of its
results, and the search for the smallest change that fits. The steps that
run them are ``plays/preflight.py``.

1. Static checks, instant: the model config exists in the pinned MaxText; the
   ICI parallelisms multiply to the chips of a slice, the DCN ones to the
   slices; hosts, chips and workers agree; the manifest's
   MEGASCALE_NUM_SLICES equals its slice replicas; heads split over the
   tensor axis. Then each chip's HBM estimated (``memory.py``) on every
   shape the job may run on (``shapes``: an elastic job's every slice count
   down to one); a confident misfit names the first change of the search's
   list the estimate says fits, and when none fits the environment's slices,
   the smallest shape of its generation that does (``smallest_shape``). A
   mesh product that does not match names the value that does (``ici.py``).
2. Fit, by ahead-of-time compiling the exact job for the TPU topology with
   MaxText's train_compile (same MaxText, flags and libtpu as the workers):
   per-chip arguments, outputs, temporaries and total against the chip's HBM.
3. When it does not fit, a small stated list of changes is compiled in turn
   and the first that fits is printed as a ready `--set` line.
Results are cached by everything that changes the compile. An elastic job
is compiled for each of its shapes.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from playbooks.access import connectors
from playbooks.cloud import manifests
from playbooks.config import paths
from playbooks.config import tutorial as T
from playbooks.config.maxtext_settings import as_text, model_config, overrides_model, parse
from playbooks.config.project import ROOT
from playbooks.config.schema import Environment
from playbooks.config.tpu import DEFAULT, GENERATIONS, chips, generation, inventory_shapes, ray_hosts_problem
from playbooks.config.versions import installed
from playbooks.core.command import Command
from playbooks.core.facts import ABSENT, Completed, Fact
from playbooks.job import ici, memory
from playbooks.job.ici import slice_devices
from playbooks.job.spec import PRESET_SHAPES, PRESETS, Job, preset_shape

GIB = 1024 ** 3
Extra = tuple[tuple[str, str], ...]


def _mesh_rule(axes: dict[str, int], target: int, what: str) -> str | None:
    auto = [k for k, v in axes.items() if v == -1]
    fixed = {k: v for k, v in axes.items() if v not in (-1, 1)}
    product = 1
    for v in fixed.values():
        product *= v
    shown = " x ".join(f"{k}={v}" for k, v in fixed.items()) or "all 1"
    if len(auto) > 1:
        return f"{what}: more than one axis is -1 ({', '.join(auto)}); MaxText fills only one"
    if auto:
        if target % product:
            return (f"{what}: {shown} = {product} does not divide the {target} to fill "
                    f"({auto[0]}=-1 gets the rest)")
        return None
    if product != target:
        prefix = next(iter(axes))[:4]
        return f"{what}: {shown} = {product}, but there are {target}: {ici.matching(fixed, target, prefix)}"
    return None


def static_checks(env: Environment, job: Job) -> list[str]:
    """Each violation: one line with the numbers."""
    out: list[str] = []
    args = dict(job.args)
    model = args.get("model_name", job.model)
    cfg = model_config(model) or None
    if cfg is None:
        out.append(f"model config models/{model}.yml is not in the pinned MaxText "
                   f"(maxtext {installed('maxtext')}: see trainer/models/)")
        cfg = {}
    base = ici.base()
    devices = slice_devices(env)
    per_chip = generation(env).devices_per_chip if env.platform.cloud else 1
    unit = ("CPU devices in a simulated slice" if env.platform.simulated else
            f"chips in a {env.topology} slice" if per_chip == 1 else
            f"devices in a {env.topology} slice: {per_chip} per {generation(env).name} chip")
    why = _mesh_rule(ici.axes(args, "ici_"), devices, f"ICI parallelism (per slice, {devices} {unit})")
    if why:
        out.append(why)
    if job.elastic:
        dcn = ici.axes(args, "dcn_")
        fixed = {k: v for k, v in dcn.items() if v not in (1, -1)}
        if fixed:
            out.append(f"DCN parallelism: {fixed} fixes the slice count, but the elastic job runs on 1 to "
                       f"{env.slices} slices; use -1")
    else:
        why = _mesh_rule(ici.axes(args, "dcn_"), env.slices, f"DCN parallelism (across slices, {env.slices} slices)")
        if why:
            out.append(why)
    if env.platform.cloud:
        per_host = env.chips_per_host
        if per_host * env.hosts_per_slice != chips(env.topology):
            out.append(f"hosts: {env.hosts_per_slice} hosts x {per_host} chips = "
                       f"{env.hosts_per_slice * per_host}, but topology {env.topology} has {chips(env.topology)} chips")
        workers = env.slices * env.hosts_per_slice
        if workers % env.hosts_per_slice:
            out.append(f"workers: {workers} is not a multiple of {env.hosts_per_slice} hosts per slice")
        why = manifests.megascale_problem(env)
        if why:
            out.append(why)
        if env.cluster_mode.restricted_pods:
            out += manifests.autopilot_violations(manifests.all_docs(env))
    ov = overrides_model(args.items())
    q = int(args["base_num_query_heads"]) if ov and "base_num_query_heads" in args else cfg.get("base_num_query_heads")
    kv = int(args["base_num_kv_heads"]) if ov and "base_num_kv_heads" in args else cfg.get("base_num_kv_heads")
    tensor = int(args.get("ici_tensor_parallelism", base.get("ici_tensor_parallelism", 1)))
    if q and tensor > 0 and q % tensor:
        out.append(f"attention: {q} query heads do not split over ici_tensor_parallelism={tensor}")
    if kv and tensor > 0 and kv % tensor and tensor % kv:
        out.append(f"attention: {kv} KV heads and ici_tensor_parallelism={tensor}: neither divides the other")
    return out



# -- the fit check: an ahead-of-time compile for the TPU topology --------------
# HBM per chip: each generation's record (config/tpu.py: what the runtime
# reports; libtpu's compile log says it again, and wins); the tutorial's
# generation (v6e) when a compile names none:
HBM_V6E_GIB = GENERATIONS[DEFAULT].hbm_gib
LIBTPU_BUSY = re.compile(r"(?:TPU is already in use by (?:a )?process with pid (\d+)|libtpu_lockfile)")
OOM = re.compile(r"CompileTimeHbmOom: .*?\(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)")
MEMORY = re.compile(r"Memory analysis: CompiledMemoryStats\((.*?)\)")
TOTAL = re.compile(r"Total hbm usage >= ([\d.]+)([KMGT]?)")
PROGRAM = re.compile(r"XLA::TPU program HBM usage: ([\d.]+)([KMGT]?) / ([\d.]+)([KMGT]?)")
HOST = re.compile(r"Total host usage >= ([\d.]+)([KMGT]?)")
UNIT = {"": 1 / GIB, "K": 1 / 1024 ** 2, "M": 1 / 1024, "G": 1.0, "T": 1024.0}

# Changes tried, in this order, when a job does not fit: smallest first (a
# change the job already has is not compiled again).
CANDIDATES: tuple[Extra, ...] = (
    (("remat_policy", "full"),),
    (("per_device_batch_size", "1"),),
    (("optimizer_memory_host_offload", "true"),),
    (("per_device_batch_size", "1"), ("optimizer_memory_host_offload", "true")),
    (("per_device_batch_size", "1"), ("optimizer_memory_host_offload", "true"),
     ("parameter_memory_host_offload", "true"), ("param_scan_axis", "0")),
)

# When no change of settings fits: more chips, as more slices of the same
# topology (an inventory change: `slices`), the job's DCN split following them.
MORE_SLICES = (2, 4)

# Proven by `bench/fit_compiles.py` (an AOT compile for 2 x v6e-16): the smallest
# change of the tutorial's 70B job that fits its 32 chips.
def _gib(value: str, unit: str) -> float:
    return float(value) * UNIT[unit]


@dataclass
class Fit:
    fits: bool
    seconds: float = 0.0
    arguments: float | None = None   # GiB per chip
    outputs: float | None = None
    aliased: float | None = None
    temporaries: float | None = None
    total: float | None = None
    capacity: float = HBM_V6E_GIB
    host: float | None = None
    needed: float | None = None      # temporaries asked for, when it does not fit
    error: str | None = None         # a failure that is not about memory
    cached: bool = False

    @property
    def margin(self) -> float | None:
        return None if self.total is None else self.capacity - self.total

    def lines(self) -> list[str]:
        if self.error:
            return [f"the job does not compile: {self.error}"]
        if not self.fits:
            needed = self.needed or 0.0
            return [f"does NOT fit: its temporaries alone need {needed:.2f} GiB per chip, the chip has "
                    f"{self.capacity:.2f} GiB of HBM (short by {needed - self.capacity:.2f} GiB)"]
        out = ["fits, per chip:"]
        if self.arguments is not None:
            out.append(f"  arguments {self.arguments:.2f} GiB, outputs {self.outputs:.2f} GiB "
                       f"({self.aliased:.2f} GiB of them aliased to arguments), temporaries {self.temporaries:.2f} GiB")
        if self.total is not None:
            margin = self.capacity - self.total
            out.append(f"  total {self.total:.2f} GiB of {self.capacity:.2f} GiB HBM: margin {margin:.2f} GiB "
                       f"({100 * margin / self.capacity:.1f}%)"
                       + (f"; host memory {self.host:.2f} GiB (offloaded)" if self.host else ""))
        return out

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "cached"}


def hbm_of(args: list[str]) -> float:
    """The HBM per chip of the generation a compile is for (its
    compile_topology's prefix), the default a compile log may correct."""
    top = next((a.split("=", 1)[1] for a in args if a.startswith("compile_topology=")), "")
    gen = next((g for g in GENERATIONS.values() if top.startswith(g.maxtext_prefix + "-")), None)
    return gen.hbm_gib if gen else HBM_V6E_GIB


def parse_compile(text: str, tpu_log: str = "", seconds: float = 0.0, hbm: float = HBM_V6E_GIB) -> Fit:
    m = OOM.search(text) or OOM.search(tpu_log)
    if m:
        return Fit(False, seconds, needed=float(m.group(1)), capacity=float(m.group(2)))
    mem = MEMORY.search(text)
    busy = LIBTPU_BUSY.search(text + "\n" + tpu_log)
    if not mem and busy:
        # Not libtpu's advice (delete its lock file): the other process
        # still uses it.
        who = f"pid {busy.group(1)}" if busy.group(1) else "another process"
        return Fit(False, seconds, error=f"libtpu is in use by {who} on this machine: wait for it to end and "
                                         f"run again (do not delete /tmp/libtpu_lockfile while it runs)")
    if not mem:
        errors = [ln for ln in text.splitlines() if re.search(r"(Error|Exception|error:)", ln)
                  and "E0000" not in ln and "unexpected worker hostname" not in ln]
        return Fit(False, seconds, error=(errors[-1].strip() if errors else "no memory analysis in its output"))
    stats = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", mem.group(1))}
    arguments, outputs, aliased, temporaries = (stats.get(f"{k}_size_in_bytes", 0) / GIB
                                                for k in ("argument", "output", "alias", "temp"))
    fit = Fit(True, seconds, arguments=arguments, outputs=outputs, aliased=aliased, temporaries=temporaries,
              capacity=hbm)
    # The compiler's own account (libtpu's log) is the one it fits against;
    # the stats above, summed, overstate it.
    if (t := TOTAL.search(tpu_log)):
        fit.total = _gib(*t.groups())
    else:
        fit.total = arguments + outputs - aliased + temporaries
    if (p := PROGRAM.search(tpu_log)):
        fit.capacity = _gib(p.group(3), p.group(4))
    if (h := HOST.search(tpu_log)):
        fit.host = _gib(*h.groups()) or None
    return fit


# When the job saves: not part of what it compiles to (and chosen from the
# run's measurements, so a compile cached for one period serves any).
RUNTIME_KEYS = ("checkpoint_period",)


def compile_args(env: Environment, job: Job, extra: Extra = (), slices: int | None = None) -> list[str]:
    """The job's own arguments, for the TPU topology it would run on (every
    slice, for an elastic job)."""
    args = {k: v for k, v in job.args if k not in RUNTIME_KEYS}
    for k, v in extra:
        args[k] = v
    args.update({"compile_topology": generation(env).compile_topology(env.topology),
                 "compile_topology_num_slices": str(slices or env.slices)})
    return [f"{k}={v}" for k, v in args.items()]


WORK = paths.PREFLIGHT


# Where a job writes: not part of what it compiles to.
WORK_KEYS = ("base_output_directory", "run_name", "jax_cache_dir", "dump_hlo_local_dir")


def _without_work_dirs(args: list[str]) -> list[str]:
    return [a for a in args if a.split("=", 1)[0] not in WORK_KEYS]


def with_work_dirs(args: list[str]) -> list[str]:
    """Where the compile may write: only under .state/preflight/ (not the
    job's /data/, not ~/jax_cache, not /tmp/xla_dump)."""
    return _without_work_dirs(args) + [f"base_output_directory={WORK}/out/", "run_name=preflight",
                                       f"jax_cache_dir={WORK}/jax_cache",
                  f"dump_hlo_local_dir={WORK}/xla_dump/"]


def versions() -> dict[str, str]:
    return {p: installed(p) for p in ("maxtext", "jax", "jaxlib", "libtpu")}


def cache_key(args: list[str]) -> str:
    """Everything that changes the compile: the job's arguments (model,
    settings, topology, slices) and the MaxText, jax and libtpu versions."""
    blob = json.dumps({"args": sorted(_without_work_dirs(args)), "versions": versions()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_path(key: str) -> Path:
    return paths.preflight_cache() / f"{key}.json"


def compile_command(args: list[str], key: str) -> Command:
    return Command(("python", "-m", "maxtext.trainers.pre_train.train_compile", f"trainer/{T.BASE_CONFIG}",
                    *with_work_dirs(args)), env=(("TPU_LOG_DIR", paths.preflight_tpu_logs(key)),), timeout=3 * 3600,
                   here=True)  # on this machine's CPU, even when the plays run on a controller


def compile_fact(args: list[str]) -> Fact:
    key = cache_key(args)
    command = compile_command(args, key)

    def parse(c: Completed) -> Fit:
        log = ROOT / dict(command.env)["TPU_LOG_DIR"] / "tpu_driver.INFO"
        err = log.with_name("tpu_driver.ERROR")
        text = "\n".join(p.read_text(errors="replace") for p in (log, err) if p.exists())
        fit = parse_compile(c.stdout + "\n" + c.stderr, text, c.seconds, hbm_of(args))
        if fit.fits or fit.needed is not None:
            connectors.this_machine().write(str(cache_path(key)), json.dumps(fit.to_json()).encode())
        return fit

    return Fact(name="fit", command=command, parse=parse, assumed=ABSENT,
                describe=lambda f: ("fits" if f.fits else "does not fit" if f.needed else "does not compile")
                if isinstance(f, Fit) else str(f))


def cached(args: list[str]) -> Fit | None:
    p = cache_path(cache_key(args))
    if not p.exists():
        return None
    fit = Fit(**json.loads(p.read_text()))
    fit.cached = True
    return fit



# libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) for a compile: a
# second compile at once fails, and libtpu's message advises deleting the
# lock file, which would break the first. Compiles take this lock first, so
# a second one waits, saying which pid it waits for.
COMPILE_LOCK = Path("/tmp/maxtext-playbooks-compile.lock")


# -- the search for a change that fits ------------------------------------------------------
def set_line(extra: Extra) -> str:
    return " ".join(f"--set {k}={v}" for k, v in extra)


def ready_command(env: Environment, job: Job, extra: Extra) -> str:
    """The `invoke train` line of the job with ``extra`` changed: its own
    flags (--elastic, --preset, --set) kept, a named preset for a change that
    is one."""
    prefix = f"INVOKE_PLAYBOOK_ENV={env.name} " if env.name else ""
    flags = [f"--model={job.model}"] + (["--elastic"] if job.elastic else [])
    change = dict(extra)
    presets = PRESETS.get(job.model, {})
    preset = next((name for name, ov in presets.items() if tuple(ov) == tuple(extra)), None)
    if preset is None and job.preset and all(change.get(k, v) == v for k, v in presets[job.preset]):
        preset = job.preset  # the job's own preset, which the change keeps
    given = dict(presets[preset]) if preset else {}
    sets = [(k, v) for k, v in job.sets if k not in change] + [(k, v) for k, v in extra if given.get(k) != v]
    flags += ([f"--preset={preset}"] if preset else []) + ([set_line(tuple(sets))] if sets else [])
    return f"{prefix}invoke train {' '.join(flags)}"


def job_uses(job: Job, extra: Extra) -> bool:
    """Whether the job already has these settings (its own or base.yml's)."""
    args, base = dict(job.args), ici.base()
    return all(args.get(k, as_text(base.get(k))) == v for k, v in extra)


def dcn_following_slices(job: Job) -> Extra:
    """Settings that make the job's DCN split follow the slice count: its
    largest fixed DCN axis becomes -1 (MaxText fills it from the slices)."""
    axes = ici.axes(dict(job.args), "dcn_")
    fixed = {k: v for k, v in axes.items() if v not in (1, -1)}
    filled = [k for k, v in axes.items() if v == -1]
    if not fixed:
        return () if filled else (("dcn_data_parallelism", "-1"),)
    largest = max(fixed, key=lambda k: fixed[k])
    return ((largest, "-1"),) + tuple((k, "1") for k in filled)


@dataclass(frozen=True)
class Attempt:
    """One compile of the search: a change of settings, or more slices."""

    what: str
    extra: Extra
    slices: int | None = None


def search_plan(env: Environment, job: Job) -> list[Attempt]:
    """What the search compiles, in order: the settings of CANDIDATES the job
    does not already have, then more slices of the same topology (the DCN
    split following them)."""
    out = [Attempt(set_line(extra), extra) for extra in CANDIDATES if not job_uses(job, extra)]
    extra = dcn_following_slices(job)
    for n in (env.slices * factor for factor in MORE_SLICES):
        shape = generation(env).compile_topology(env.topology)
        out.append(Attempt(f"{n} x {shape}" + (f" with {set_line(extra)}" if extra else ""), extra, n))
    return out


def found(env: Environment, job: Job, short: str, a: Attempt, r: Fit) -> str:
    """What to do, once an attempt fits."""
    if a.slices is None:
        return (f"{short}. Smallest change that fits ({r.total:.2f} of {r.capacity:.2f} GiB): "
                f"{ready_command(env, job, a.extra)}")
    return (f"{short}. No change of settings fits; {a.slices} slices do ({r.total:.2f} of {r.capacity:.2f} GiB): "
            f"set `slices: {a.slices}` for {env.name} in the inventory and run `invoke up` ({a.slices} node pools "
            f"of {generation(env).compile_topology(env.topology)}), then {ready_command(env, job, a.extra)}")


def none_found(env: Environment, job: Job, short: str, plan: list[Attempt]) -> str:
    settings = sum(1 for a in plan if a.slices is None)
    advice = shape_advice(env, job)
    return (f"{short}; none of the {settings} changes tried fits, nor {env.slices * MORE_SLICES[-1]} slices: a larger "
            f"topology is needed" + (f"; {advice}" if advice else ""))



# -- the estimate: each chip's HBM in an instant (memory.py), before any compile ----------------
def settings(job: Job, extra: Extra = ()) -> dict:
    """MaxText's settings as the job (with ``extra``) would have them:
    base.yml, the model's config, the job's arguments."""
    args = dict(job.args)
    args.update(extra)
    out = {**ici.base(), **model_config(args.get("model_name", job.model))}
    out.update({k: parsed(v) for k, v in args.items()})
    return out


@cache
def parsed(text: str) -> Any:
    """A value as MaxText reads it (``parse``: OmegaConf, milliseconds
    each), once a value: the shape search asks for the same ones again.
    Callers only read it."""
    return parse(text)


def shapes(env: Environment, job: Job, slices: int | None = None) -> list[int]:
    """The slice counts the job may run on, the most first: an elastic job
    from every slice down to one (its trainer starts on one whole slice at
    least: num_workers = (hosts per slice, every host)), another on every slice."""
    top = slices or env.slices
    return list(range(top, 0, -1)) if job.elastic else [top]


def shape_name(env: Environment, n: int) -> str:
    return f"{n} x {generation(env).compile_topology(env.topology)}"


Estimates = list[tuple[int, memory.Estimate]]


def estimates(env: Environment, job: Job, extra: Extra = (), slices: int | None = None) -> Estimates | str:
    """The estimate on each shape the job may run on, or why there is none."""
    s = settings(job, extra)
    why = memory.unsupported(s)
    if why:
        return f"no HBM estimate for {why}: the compile decides"
    # Per MaxText device: a chip of two devices (TPU7x) gives each half its HBM.
    gen = generation(env)
    per_device = gen.hbm_gib / gen.devices_per_chip
    return [(n, memory.estimate(s, slice_devices(env), n, per_device)) for n in shapes(env, job, slices)]


def grouped(env: Environment, got: Estimates) -> list[tuple[str, memory.Estimate]]:
    """The shapes with the same estimate together ("2 and 1 x v6e-16")."""
    out: dict[str, tuple[list[int], memory.Estimate]] = {}
    for n, e in got:
        out.setdefault(e.line(), ([], e))[0].append(n)
    def listed(ns: list[int]) -> str:
        return ", ".join(map(str, ns[:-1])) + " and " + str(ns[-1]) if len(ns) > 1 else str(ns[0])

    return [(f"{listed(ns)} x {generation(env).compile_topology(env.topology)}", e) for ns, e in out.values()]


def estimated(env: Environment, got: Estimates) -> str:
    """The estimate on each shape, in a few words."""
    each = [f"{e.total:.2f} of {e.capacity:.2f} GiB on {where} ({e.words()})" for where, e in grouped(env, got)]
    return f"HBM per chip, estimated: {', '.join(each)}"


def fitting_change(env: Environment, job: Job) -> tuple[Attempt, Estimates] | None:
    """The first change of the compile search's list (the same order) that
    the estimate does not call a misfit on any shape."""
    for a in search_plan(env, job):
        got = estimates(env, job, a.extra, a.slices)
        if not isinstance(got, str) and all(e.verdict != "misfit" for _, e in got):
            return a, got
    return None


def memory_problem(env: Environment, job: Job) -> str | None:
    """One line when the estimate says the job does not fit a shape it may
    run on: the numbers, the shapes that fit, and the change that fits."""
    got = estimates(env, job)
    if isinstance(got, str):
        return None
    bad = [(n, e) for n, e in got if e.verdict == "misfit"]
    if not bad:
        return None
    n, e = bad[0]
    where = " and ".join(shape_name(env, m) for m, _ in bad)
    after_loss = " (where the elastic job runs after a lost slice)" if n < env.slices else ""
    model = dict(job.args).get("model_name", job.model)
    tutorial = not (job.sets or job.preset or env.train_overrides)
    needs = e.line() if len(bad) == 1 else f"{shape_name(env, n)} needs {e.line()}"
    made = (f" --preset={job.preset} (made for {preset_shape(job.model, job.preset)})" if job.preset and
            PRESET_SHAPES[(job.model, job.preset)] != (generation(env).name, env.topology, env.slices) else "")
    head = f"{model}{made}{', the tutorial' + chr(39) + 's flags,' if tutorial else ''} does not fit {where}" \
           f"{after_loss} by estimate: {needs}"
    good = [shape_name(env, m) for m, x in got if x.verdict != "misfit"]
    if good:
        head += f"; it fits {', '.join(good)}"
    return head + ". " + _fix(env, job, bool(good))


def _fix(env: Environment, job: Job, full_fits: bool) -> str:
    plan = search_plan(env, job)
    hit = fitting_change(env, job)
    without = "; or train without --elastic (every slice, no shrinking)" if job.elastic and full_fits else ""
    if hit is None:
        advice = shape_advice(env, job)
        return (f"None of the {sum(1 for a in plan if a.slices is None)} changes the preflight tries fits by "
                f"estimate, nor {env.slices * MORE_SLICES[-1]} slices" + (f"; {advice}" if advice else "") + without)
    a, got = hit
    worst = max(got, key=lambda p: p[1].total)[1]
    said = f"{worst.total:.2f} GiB, {worst.words()}"
    proof = "`invoke preflight` with the same flags compiles it (the proof)"
    if a.slices is None:
        lead = "Estimated to fit" if worst.verdict == "fits" else "The first change not a misfit by estimate"
        return f"{lead} ({said}): {ready_command(env, job, a.extra)}; {proof}{without}"
    advice = shape_advice(env, job, unless=(env.topology, a.slices))
    return (f"No change of settings fits by estimate; {a.slices} slices do ({said}): set `slices: {a.slices}` for "
            f"{env.name} in the inventory, then {ready_command(env, job, a.extra)}; {proof}"
            + (f"; {advice}" if advice else "") + without)



# -- the smallest shape of the generation that fits, by estimate ------------------------------
# When no change of settings fits the environment's shape, every other shape
# of its generation is estimated, fewest chips first: each slice shape GKE
# allows and Ray takes (tpu.inventory_shapes; several hosts a slice when
# there are several slices: GKE's multislice takes multi-host slices only,
# schema.multislice_hosts), on 1 to SHAPE_MAX_SLICES slices (from 2 for an
# elastic job, which must have a slice to lose), with the job's own settings
# or each change of CANDIDATES (in that order for the same chips), the ICI
# axes taken from the slice (ici.derived) and the DCN split following the
# slices. The first whose estimate is within the chip's HBM on every shape
# the job may run on is named. SHAPE_MAX_SLICES: twice the most slices the
# compile's search tries for the tutorial's 2 (MORE_SLICES); at most ~3,000
# estimates (v5p's 32 chip counts x 16 x 6), each a few arithmetic steps,
# and the search stops at the first chip count that fits (tests/test_shapes.py
# holds the time of one that finds none).
SHAPE_MAX_SLICES = 16


@dataclass(frozen=True)
class Shape:
    """A shape the search names: its slices and the settings it needs."""

    topology: str
    slices: int
    machine_type: str
    change: Extra    # of CANDIDATES: () for the job's own settings
    follow: Extra    # the ICI and DCN settings the command line needs on this shape
    worst: memory.Estimate


def layouts(env: Environment, elastic: bool) -> list[tuple[int, int, str, str]]:
    """(chips, slices, topology, machine type) of each shape the search may
    name, fewest chips then fewest slices first; one topology per chip count."""
    gen, mine = generation(env), env.get("machine_type")
    out: dict[tuple[int, int], tuple[int, int, str, str]] = {}
    for top in inventory_shapes(gen):
        for n in range(2 if elastic else 1, SHAPE_MAX_SLICES + 1):
            types = [name for name, m in gen.machine_types.items() if m.forms(top) and (n == 1 or m.chips < chips(top))
                     and ray_hosts_problem(top, gen, m.chips, "") is None]
            if types and (chips(top), n) not in out:
                out[(chips(top), n)] = (chips(top) * n, n, top, mine if mine in types else types[0])
    return sorted(out.values())


def _on_shape(env: Environment, job: Job, known: dict, change: Extra, devices: int, n: int) -> tuple[Extra, Estimates]:
    """The job with ``change`` on ``n`` slices of ``devices``: the settings
    its command line needs besides ``change``, and its estimates. ``known``:
    the settings and estimates made before (an elastic job's shapes recur)."""
    args = {**dict(job.args), **dict(change)}
    dcn = () if ici.holds(ici.axes(args, "dcn_"), n) or job.elastic else dcn_following_slices(job)
    mesh = ici.derived(args, devices)
    if change + dcn not in known:
        known[change + dcn] = settings(job, change + dcn)
    s = {**known[change + dcn], **{k: int(v) for k, v in mesh}}
    gen = generation(env)
    got = []
    for m in shapes(env, job, n):
        key = (change + dcn + mesh, devices, m)
        if key not in known:
            known[key] = memory.estimate(s, devices, m, gen.hbm_gib / gen.devices_per_chip)
        got.append((m, known[key]))
    return dcn + (mesh if ici.user_set(env, job.sets) else ()), got


def smallest_shape(env: Environment, job: Job) -> Shape | None:
    """The shape of the fewest chips of this generation whose estimate is
    within the HBM on every shape the job may run on (None: none to
    SHAPE_MAX_SLICES slices)."""
    options = [c for c in [(), *CANDIDATES] if c == () or not job_uses(job, c)]
    known: dict = {c: settings(job, c) for c in options}
    options = [c for c in options if not memory.unsupported(known[c])]
    per_chip = generation(env).devices_per_chip
    every = layouts(env, job.elastic)
    if not every:
        return None

    def fits(change: Extra, n: int, top: str) -> tuple[Extra, memory.Estimate] | None:
        said, got = _on_shape(env, job, known, change, chips(top) * per_chip, n)
        worst = max((e for _, e in got), key=lambda e: e.total / e.capacity)
        return (said, worst) if worst.total <= worst.capacity else None

    # The largest shape holds the least per chip (the estimate's sharded
    # parts shrink with the chips, the rest stays): a change that does not
    # fit it fits none.
    _, n, top, _ = every[-1]
    options = [c for c in options if fits(c, n, top)]
    by_chips: dict[int, list[tuple[int, str, str]]] = {}
    for total, n, top, mt in every:
        by_chips.setdefault(total, []).append((n, top, mt))
    for group in by_chips.values():
        for change in options:
            for n, top, mt in group:
                if (hit := fits(change, n, top)):
                    return Shape(top, n, mt, change, hit[0], hit[1])
    return None


def shape_advice(env: Environment, job: Job, unless: tuple[str, int] | None = None) -> str:
    """The smallest shape of this generation that fits, in one line, with
    the inventory's change and the command line ("" when the estimate does
    not know the job, or the shape is ``unless``: (topology, slices))."""
    if memory.unsupported(settings(job)):
        return ""
    gen, model = generation(env), dict(job.args).get("model_name", job.model)
    got = smallest_shape(env, job)
    if got is not None and (got.topology, got.slices) == unless:
        return ""
    if got is None:
        return (f"no {gen.name} shape of up to {SHAPE_MAX_SLICES} slices fits {model} by estimate, with its own "
                f"settings or any change the preflight tries")
    keys = [f"`topology: {got.topology}`", f"`slices: {got.slices}`"]
    if got.machine_type != env.get("machine_type"):
        keys.append(f"`machine_type: {got.machine_type}`")
    n = chips(got.topology)
    how = f"with {set_line(got.change)}" if got.change else "with its own settings"
    return (f"the smallest {gen.name} shape that fits {model} by estimate: {got.slices} x "
            f"{gen.compile_topology(got.topology)} ({got.slices * n} chips: {got.slices} x {got.topology}) {how}, "
            f"{got.worst.total:.2f} of {got.worst.capacity:.2f} GiB per chip ({got.worst.words()}): set "
            f"{', '.join(keys)} for {env.name} in the inventory and run `invoke up`, then "
            f"{ready_command(env, job, got.change + got.follow)}; `invoke preflight` with the same flags compiles it "
            f"(the proof)")
