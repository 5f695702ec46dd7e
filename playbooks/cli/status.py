"""`invoke status`: everything the environment owns, as it is, in one table,
and one diagnosis line: the first thing that is not as the inventory asks,
and why (when that is something not ready yet, the first failure after
it: it often says why). Read-only: the plays of `up` run in check mode
(every probe at once, before the steps), plus what only status shows: the
TPU nodes of each pool (and what is coming for each slice: its nodes'
scheduled host maintenance, a flex-start pool's end), the RayCluster's workers (why they are not
running), the jobs of this environment's runs. A report says what is (as asked, missing, not running,
not ready, unknown because ...), never what a change would do.

On GKE its first row is gcloud's account: without one every gcloud look
fails with the same words, so that is said once, in the diagnosis with its
fix (`gcloud auth login`), and the rows it left unknown say so briefly."""
from __future__ import annotations

import json
import time
from typing import Any

from playbooks.access.cli_clients import NO_ACCOUNT_WORDS, fact
from playbooks.access.connectors import connector
from playbooks.access.ray_api import job_logs_command, jobs_fact, ours, run_of
from playbooks.cli import doctor, task_steps
from playbooks.cloud import capacity_options, env_cost, kube_objects, maintenance, still_billed
from playbooks.cloud import pods as P
from playbooks.cloud.endpoints import dashboard
from playbooks.cloud.gke import (
    bucket_fact,
    clusters_fact,
    nodepool_name,
    nodepools_list_fact,
    objects_command,
    raycluster_fact,
)
from playbooks.cloud.slices import pods_fact
from playbooks.config.choices import capacity_option
from playbooks.config.schema import Environment
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT, Completed, Fact
from playbooks.core.recap import CHANGED, FAILED, NOT_READY, OK, SKIPPED, UNKNOWN, UNREACHABLE, Recap, StepResult
from playbooks.core.step import Step, fail, ok, unchecked
from playbooks.job.spec import Checkpoints, run_checkpoints
from playbooks.plays import quarantine, slice_notice
from playbooks.runs import events as E
from playbooks.runs import metrics, saves, stall, timeline

PLAY = "status"
ACCOUNT = "status:account"
# What the diagnosis adds when a row is its cause: how to make it as asked.
FIX = {ACCOUNT: "run `gcloud auth login` (`invoke doctor` checks it)"}
UP = "run `invoke up`"
COST = "status:cost"
BILLS = "status:bills"
UNDER = (COST, BILLS)  # said under the table, never a finding
SHOWN = 3  # the newest jobs said in the jobs line (and whose runs' checkpoints are looked at)
POOL_LABEL = P.NODEPOOL_LABEL


def pool_nodes(c: Completed) -> dict[str, tuple[int, int]]:
    """pool -> (ready nodes, nodes), from the nodes of ``nodes_command``."""
    out: dict[str, list[int]] = {}
    for n in P.gke_nodes(fact_json(c)):
        pool = ((n.get("metadata") or {}).get("labels") or {}).get(POOL_LABEL, "")
        ready = P.ready(n)
        counts = out.setdefault(pool, [0, 0])
        counts[0] += int(ready)
        counts[1] += 1
    return {p: (a, b) for p, (a, b) in out.items()}


def fact_json(c: Completed) -> Any:
    from playbooks.access.cli_clients import json_object
    return json_object("TPU nodes")(c)


def nodes_command(env: Environment):
    """The one node list status reads (the ready counts, the slices' ends,
    the cost): the read of every object of ours (``gke.objects_command``)."""
    return objects_command(env)


def tpu_nodes_step(env: Environment) -> Step:
    probe = fact("TPU nodes", nodes_command(env), pool_nodes,
                 assumed={nodepool_name(env, i): (env.hosts_per_slice, env.hosts_per_slice) for i in range(env.slices)},
                 describe=lambda d: ", ".join(f"{p} {a}/{b}" for p, (a, b) in sorted(d.items())) or "none")

    pools_probe = nodepools_list_fact(env)

    def decide(look):
        have = look(probe)
        try:  # each slice's capacity, as GKE shows it (the pool's config)
            pools = {p.get("name"): p for p in look(pools_probe)}
        except ProbeFailed:
            pools = {}
        short: list[str] = []
        waiting: list[str] = []
        each: list[str] = []
        for i in range(env.slices):
            name = nodepool_name(env, i)
            ready, _ = have.get(name, (0, 0))
            what = capacity_options.pool_capacity(pools[name]) if name in pools else "capacity unknown"
            empty = name in pools and capacity_option(capacity_options.pool_option(pools[name])).starts_empty
            each.append(f"{name} {what} {ready}/{env.hosts_per_slice}")
            if ready < env.hosts_per_slice:
                # flex-start pools have nodes only while workers ask for them
                (waiting if empty else short).append(f"{name} ({what}) {ready} of "
                                                                     f"{env.hosts_per_slice} nodes ready")
        if short and env.slices - len(short) >= env.min_slices:
            # min_slices whole pools are enough; the others are still coming
            return ok(f"{env.slices - len(short)} of {env.slices} pools have their nodes (min_slices "
                      f"{env.min_slices}): " + ", ".join(each), notes=["waiting: " + "; ".join(short + waiting)])
        if short:
            return fail("; ".join(short + waiting))
        if waiting:
            return ok("flex-start, nodes come as workers ask: " + "; ".join(waiting) + " (" + ", ".join(each) + ")",
                      notes=["waiting: " + "; ".join(waiting)])
        return ok(f"every pool has its {env.hosts_per_slice} nodes ready: {', '.join(each)}")

    return Step(PLAY, "TPU nodes ready", decide, id="status:nodes", probes=(probe, pools_probe),
                after=("kube:credentials", *[f"nodepools:{nodepool_name(env, i)}" for i in range(env.slices)]))


def maintenance_step(env: Environment) -> Step:
    """The cluster's maintenance exclusions in force (a run's hold among
    them: ``playbooks/cloud/maintenance.py``), read from `clusters list`."""
    probe = clusters_fact(env)

    def decide(look):
        c = look(probe)
        if c is ABSENT:
            return ok("no cluster")
        force = [maintenance.describe(n, w) for n, w in sorted(maintenance.exclusions(c).items())
                 if maintenance.in_force(w)]
        if force:
            return ok("in force: " + "; ".join(force))
        return ok("none in force: GKE may upgrade the nodes in its maintenance windows")

    return Step(PLAY, "maintenance exclusions", decide, id="status:maintenance", after=("cluster:cluster",),
                probes=(probe,))


def workers_step(env: Environment) -> Step:
    """The RayCluster's slices: as asked when min_slices are whole; the
    slices still waiting named, with their Kubernetes causes."""
    probe, pods = raycluster_fact(env), pods_fact(env)

    def decide(look):
        if look(probe) is ABSENT:
            return ok("no RayCluster yet")
        s = look(pods)
        if s.complete:
            return ok(f"head and {env.slices * env.hosts_per_slice} TPU workers ready ({s.text()})")
        causes = look(kube_objects.causes_fact(env))
        why = f"; why: {'; '.join(causes)}" if causes else ""
        if s.enough(env.min_slices):
            return ok(f"{s.text(env.min_slices)}{why}", notes=[s.waiting_text()])
        return fail(f"{s.text(env.min_slices)}{why}")

    return Step(PLAY, "RayCluster workers", decide, id="status:workers", after=("raycluster:slices",),
                probes=(probe, pods))


def _age(ms: Any) -> str:
    if not ms:
        return "?"
    s = max(0, time.time() - float(ms) / 1000)
    return f"{s / 3600:.1f}h" if s >= 3600 else f"{s / 60:.0f}m" if s >= 60 else f"{s:.0f}s"


def job_rows(env: Environment, listed: Any, look: Any = None) -> list[dict]:
    """One row per job of this environment's runs; with ``look``, the newest
    ones also with their run's checkpoints as Orbax counts them (the last
    finalized step, and the step directories ignored, by name)."""
    rows: list[dict] = []
    jobs = ours(None, listed)
    for j in jobs:
        sid = str(j["submission_id"])
        run = run_of(sid)
        row = {"job": sid, "run": run, "status": j.get("status"), "age": _age(j.get("start_time"))}
        kept = metrics.run_dir(env, run) / metrics.FILE
        if kept.is_file():
            _, steps, _ = metrics.read(kept)
            if steps:
                last = max(steps, key=lambda r: r["step"])
                row.update(last_step=last["step"], loss=last.get("loss"),
                           tokens_per_s_per_device=last.get("tokens_per_s_per_device"))
        rows.append(row)
    checked: dict[str, Any] = {}
    if look is not None:
        for row, j in list(zip(rows, jobs))[-SHOWN:]:
            run = str(row["run"])
            if run not in checked:
                probe = run_checkpoints(env, run, str(j.get("entrypoint") or ""))
                checked[run] = look(probe) if probe is not None else None
            if isinstance(have := checked[run], Checkpoints):
                row.update(checkpoint=have.last, not_finalized=[n for n, _ in have.partial])
            elif have is ABSENT:
                row.update(checkpoint=None, not_finalized=[])
    said_saves(env, rows[-SHOWN:], {run: () if have is ABSENT else have.steps for run, have in checked.items()
                                    if have is ABSENT or isinstance(have, Checkpoints)})
    return rows


def said_saves(env: Environment, rows: list[dict], on_disk: dict[str, tuple[int, ...]] | None = None) -> None:
    """The newest row of each run: its saves, finalized of those due, the
    missing named (``runs/saves.py``), from its timeline on this machine,
    against the steps Orbax counts finalized in its checkpoints folder
    (``on_disk``, by run: the look above)."""
    for row in reversed(rows):
        if any("saves" in r for r in rows if r["run"] == row["run"]):
            continue
        events = timeline.read(env, str(row["run"]))
        if events:
            row["saves"] = saves.account(events, (on_disk or {}).get(str(row["run"])))["line"]


def stall_fact(env: Environment, sid: str) -> Fact:
    """Whether a RUNNING job is stalled: its log's events with a time of
    their own (the trainer's), and what the chaos tasks and the pod watch
    recorded in its run's timeline."""
    def parse(c: Completed) -> Any:
        if not c.ok:
            raise ProbeFailed(f"the log of job {sid}", c.line, c.rc, c.stdout, c.stderr,
                              why=f"could not read it: {c.first_error_line()}")
        reader = timeline.Reader(sid)
        events = [e for line in c.stdout.splitlines() for e in reader.feed(line) if e["source"] == "trainer"]
        recorded = [e for e in timeline.read(env, run_of(sid)) if e.get("job") == sid]
        events += [e for e in recorded if e.get("source") in ("chaos", "pods")]
        found = stall.check(events, time.time(), env.stall_after)
        if found is None:
            return ""
        # The follower's diagnosis of this stall's hang (hang_diagnosis.py), when it made one.
        hang = [e for e in recorded if e.get("kind") == E.HANG_DIAGNOSED and float(e["t"]) >= found.since]
        return found.line() + (f"; {hang[-1].get('line')}" if hang else "")

    return fact(f"stall of job {sid}", job_logs_command(dashboard(env), sid, follow=False), parse, assumed="",
                describe=lambda line: line or "steps coming")


def jobs_step(env: Environment) -> Step:
    listing = jobs_fact(dashboard(env), connector(env))

    def decide(look):
        listed = look(listing)
        if listed is ABSENT:
            return unchecked(f"no Ray dashboard answers at {dashboard(env)}")
        rows = job_rows(env, listed, look)
        stalled = []
        for r in rows:
            if r["status"] == "RUNNING" and (line := look(stall_fact(env, r["job"]))):
                r["stalled"] = line
                stalled.append(f"job {r['job']} {line}")
        failed = [r["job"] for r in rows[-SHOWN:] if r["status"] == "FAILED"]
        text = ", ".join(f"{r['job']} {r['status']}" for r in rows[-SHOWN:]) or "none"
        if stalled:
            causes = look(kube_objects.causes_fact(env)) if env.platform.cloud else []
            return fail("; ".join(stalled) + (f"; why: {causes[0]}" if causes else ""))
        if failed and failed[-1] == rows[-1]["job"]:
            return fail(f"{len(rows)} job(s): {text}")
        return ok(f"{len(rows)} job(s): {text}", data=rows)

    after = ("dashboard:forward",) if env.platform.cloud else ("twin:head",)
    return Step(PLAY, "jobs", decide, id="status:jobs", after=after, probes=(listing,))


def cost_step(env: Environment) -> Step:
    """What the environment costs by the hour as it stands and since `up`
    (``cloud/env_cost.py``): said under the table, never a finding."""
    def decide(look):
        c = env_cost.read(env, look)
        return ok(env_cost.headline(c), data=c.doc() | {"lines": env_cost.lines(c)})

    return Step(PLAY, "environment cost", decide, id=COST, probes=env_cost.facts(env))


def bills_step(env: Environment) -> Step:
    """Whether the TPUs bill now, and what bills besides them: the
    cluster's other parts and the bucket with its bytes
    (``cloud/still_billed.py``): after `invoke stop-tpus`, what still
    costs money; after a teardown, the bucket it kept. Said under the
    table, never a finding."""
    bucket, held = bucket_fact(env), still_billed.bytes_fact(env)

    def decide(look):
        try:
            cluster = look(clusters_fact(env))
        except ProbeFailed:
            cluster = None
        cost = env_cost.read(env, look)
        b = still_billed.bills(cluster, cost, bucket_text(env, look, bucket, None))
        if b.off or b.absent:
            # The bucket's bytes (one `gcloud storage du`) are read where
            # the bucket is most of what bills: the TPUs off, or no cluster.
            b = still_billed.bills(cluster, cost, bucket_text(env, look, bucket, held))
        said = still_billed.lines(b)
        return ok(said[0], data=b.doc() | {"lines": said})

    return Step(PLAY, "what bills", decide, id=BILLS, probes=(*env_cost.facts(env), bucket))


def bucket_text(env: Environment, look: Any, bucket: Fact, held: Fact | None) -> str:
    """The bucket's line ("" where it is proven absent; said unknown where
    it could not be read); its bytes read by ``held`` (None: not read)."""
    try:
        b = look(bucket)
    except ProbeFailed as e:
        return f"bucket gs://{env.gs_bucket}: unknown ({env_cost.why_not(e)})"
    if b is ABSENT:
        return ""
    if held is None:
        return still_billed.bucket_line(env, b, None, unread="its size is read when the TPUs are off")
    try:
        n, why = look(held), ""
    except ProbeFailed as e:
        n, why = None, env_cost.why_not(e)
    return "" if n is ABSENT else still_billed.bucket_line(env, b, n, why)


def account_step() -> Step:
    """gcloud's credentials, read once (`gcloud config list`: no API)."""
    probe = doctor.credentials_fact()

    def decide(look):
        who = doctor.credentials(look(probe))
        return ok(who) if who else fail("no active account and no access token file: every gcloud command fails")

    return Step(PLAY, "gcloud account", decide, id=ACCOUNT, probes=(probe,))


def steps(env: Environment) -> list[Step]:
    """`up`'s probes, with the TPU nodes and the workers (why they are not
    ready) before the dashboard's steps: a worker's Kubernetes cause is the
    diagnosis, not the Ray node it is missing."""
    out = task_steps.up_steps(env)
    if env.platform.cloud:
        out = [account_step()] + out
        ours = [tpu_nodes_step(env), slice_notice.ends_step(env, PLAY, "status:slice-ends")] \
            if env.cluster_mode.our_node_pools else []
        mine = [maintenance_step(env)] + ours + [workers_step(env)]
        at = next((i for i, s in enumerate(out) if s.play == "dashboard"), len(out))
        out = out[:at] + mine + out[at:]
    out.append(jobs_step(env))
    # The hosts set aside: its notes, one line per host (and per node on GKE).
    out.append(quarantine.list_step(env, PLAY, held_fails=True))
    if env.platform.cloud:
        out += [cost_step(env), bills_step(env)]
    return out


def _state(lines: list[str]) -> str:
    """What the step's first probe found (its line's `=> ...`)."""
    for line in lines:
        if line.startswith("  probe") and "=> " in line:
            return line.rsplit("=> ", 1)[1].replace(" (cached)", "")
    return ""


def unread_reason(r: StepResult, full: dict[str, str]) -> str:
    """Why a step that could not look (or needs one that could not) is
    unknown: what could not be read, and why (``full``: each failure's
    reason in full, ``Recap.full_reasons``)."""
    needs = r.data.get("needs_unread") if isinstance(r.data, dict) else None
    own = full.get(r.cause, r.reason) if r.cause else r.reason
    if needs:
        return f"unknown because it needs {', '.join(needs)}, which could not be read ({own})"
    return f"unknown because {own}"


def verdict(r: StepResult, found: dict[str, str], full: dict[str, str] | None = None) -> tuple[str, str]:
    """(verdict, what is) of one step's result: what is there, never what a
    change would do; "unknown" where it could not be read."""
    if r.outcome == OK:
        return "as asked", r.reason
    if r.outcome == CHANGED and r.found == NOT_READY:
        return NOT_READY, r.reason.removeprefix("would wait: ")
    if r.outcome == CHANGED:
        return r.found or "missing", _state(r.lines) or r.found
    if r.outcome == FAILED and r.found == UNKNOWN:
        return UNKNOWN, unread_reason(r, full or {})
    if r.outcome in (FAILED, UNREACHABLE):
        return "not as asked", r.reason
    if r.found == UNKNOWN:
        waits = r.data.get("waits_on") if isinstance(r.data, dict) else None
        if waits:
            return UNKNOWN, "unknown because " + ", ".join(f"{t} is {found.get(t) or 'not as asked'}"
                                                           for t in waits)
        return UNKNOWN, "unknown because " + r.reason.removeprefix("not checked: ")
    return "not used", r.reason


def report(env: Environment, recap: Recap) -> dict:
    found = {r.title: r.found for r in recap.results if r.outcome == CHANGED}
    full = recap.full_reasons()
    items = []
    for r in recap.results:
        if r.step_id in UNDER:
            continue  # said under the table (``cost``, ``bills``), never a finding
        v, what = verdict(r, found, full)
        items.append({"what": r.title, "verdict": v, "outcome": r.outcome, "state": _state(r.lines),
                      "reason": what, "notes": list(r.notes)})
    one_cause(recap, items)
    # A check that could not look (unknown) is not a finding; what it waits
    # on is one, and is counted there.
    as_asked = not recap.not_run and all(i["outcome"] in (OK, SKIPPED) for i in items)
    return {"environment": env.name, "kind": env.kind, "mode": env.get("mode"), "as_asked": as_asked,
            "items": items, "jobs": recap.data("status:jobs") or [], "cost": recap.data(COST),
            "bills": recap.data(BILLS),
            "diagnosis": diagnosis(recap, items),
            "seconds": round(recap.wall, 1)}


def one_cause(recap: Recap, items: list[dict]) -> None:
    """gcloud without an account: every gcloud look failed with its words.
    The rows that could not be read for that say so briefly; the cause is
    said once, with its fix, by the diagnosis (the account's row)."""
    if not any(r.step_id == ACCOUNT and r.outcome == FAILED and r.found != UNKNOWN for r in recap.results):
        return
    for i in items:
        if i["verdict"] == UNKNOWN and NO_ACCOUNT_WORDS in i["reason"]:
            i["reason"] = "unknown because gcloud has no account (the diagnosis)"


def diagnosis(recap: Recap, items: list[dict]) -> str | None:
    """The first thing not as asked, and its fix where status knows it;
    what could not be read only when nothing read is wrong (an unknown is
    not a finding, but it is what to look at)."""
    found_wrong = [i for i in items if i["outcome"] in (CHANGED, FAILED, UNREACHABLE) and i["verdict"] != UNKNOWN]
    first = next(iter(found_wrong), None) or next((i for i in items if i["verdict"] == UNKNOWN
                                                   and i["outcome"] == FAILED), None)
    if first is not None and first["verdict"] == NOT_READY:
        # Something on its way (slices not whole yet): a failure after it
        # often says why (a worker's Kubernetes cause), and is the diagnosis.
        first = next((i for i in found_wrong if i["outcome"] in (FAILED, UNREACHABLE)), first)
    if first is None:
        return None
    if first["outcome"] == CHANGED:  # missing, not running: what `up` makes; not ready: on its way
        what = first["verdict"] + ("" if first["verdict"] == NOT_READY else f": {UP}")
    else:
        what = first["reason"]
    fix = FIX.get([r for r in recap.results if r.step_id not in UNDER][items.index(first)].step_id)
    return f"{first['what']}: {what}" + (f": {fix}" if fix else "")


def table(doc: dict) -> list[str]:
    width = max([len(i["what"]) for i in doc["items"]] + [10])
    out = [f"STATUS of {doc['environment']} ({doc['kind']}{', ' + doc['mode'] if doc.get('mode') else ''}), "
           f"in {doc['seconds']:.1f}s"]
    out.append(f"  {'WHAT':<{width}}  {'VERDICT':<13}  STATE / WHY")
    for i in doc["items"]:
        why = i["reason"] or i["state"]
        out.append(f"  {i['what']:<{width}}  {i['verdict']:<13}  {why}".rstrip())
        out += [f"  {'':<{width}}    {note}" for note in i.get("notes") or [] if note not in why]  # said once
    if doc["jobs"]:
        out.append("  JOBS (newest last)")
        for j in doc["jobs"][-5:]:
            extra = (f", step {j['last_step']}, loss {j['loss']:.3f}, "
                     f"{j['tokens_per_s_per_device']:.0f} tokens/s/device"
                     if j.get("last_step") is not None and j.get("loss") is not None
                     and j.get("tokens_per_s_per_device") is not None else "")
            if "checkpoint" in j:
                extra += (f", checkpoint {j['checkpoint']}" if j["checkpoint"] is not None else ", no checkpoint")
                if j["not_finalized"]:
                    extra += f" (not finalized, ignored: {', '.join(j['not_finalized'])})"
            out.append(f"    {j['job']}  {j['status']}  {j['age']} ago{extra}")
            if j.get("saves"):
                out.append(f"      {j['saves']}")
    if doc.get("cost"):
        out += [f"  {line}" for line in doc["cost"]["lines"]]
    if doc.get("bills"):
        out += [f"  {line}" for line in doc["bills"]["lines"]]
    out.append(f"diagnosis: {doc['diagnosis']}" if doc["diagnosis"] else
               "diagnosis: everything is as the inventory asks")
    return out


def render_json(doc: dict) -> str:
    return json.dumps(doc, indent=2, default=str)
