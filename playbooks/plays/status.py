"""`invoke status`: everything the environment owns, as it is, in one table,
and one diagnosis line: the first thing that is not as the inventory asks,
and why. Read-only: the plays of `up` run in check mode (every probe at once,
before the steps), plus what only status shows: the TPU nodes of each pool,
the RayCluster's workers (why they are not running), the jobs of this
environment's runs."""
from __future__ import annotations

import json
import time
from typing import Any

from .. import hosts, k8s, metrics, plan
from ..core.errors import PlaybookError
from ..core.facts import ABSENT, Fact
from ..core.play import Outcome, StepContext
from ..core.recap import CHANGED, FAILED, OK, SKIPPED, Recap
from ..core.step import Step
from ..rayapi import jobs_fact
from ..schema import Environment
from . import jobs
from .dashboard import address

PLAY = "status"


def _nodes_of_pools(env: Environment) -> dict[str, tuple[int, int]]:
    """pool -> (ready nodes, nodes), from the kubernetes client (on a
    controller host: kubectl there, see k8s.kubectl_json)."""
    selector = "cloud.google.com/gke-nodepool"
    if hosts.controller(env):
        nodes = k8s.kubectl_json(env, "nodes", "-l", selector).get("items") or []
    else:
        from kubernetes import client as k
        api = k8s.client(env)
        try:
            nodes = api.sanitize_for_serialization(k.CoreV1Api(api).list_node(label_selector=selector)).get("items") or []
        except PlaybookError:
            raise
        except Exception as e:
            raise k8s._api_error("nodes", e) from None
    out: dict[str, list[int]] = {}
    for n in nodes:
        pool = ((n.get("metadata") or {}).get("labels") or {}).get(selector, "")
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (n.get("status") or {}).get("conditions") or [])
        counts = out.setdefault(pool, [0, 0])
        counts[0] += int(ready)
        counts[1] += 1
    return {p: (a, b) for p, (a, b) in out.items()}


def tpu_nodes_step(env: Environment) -> Step:
    from .nodepools import nodepool_name
    fact = Fact(name="TPU nodes", python=lambda: _nodes_of_pools(env), assumed={},
                display="kubectl get nodes -l cloud.google.com/gke-nodepool  # the kubernetes client",
                describe=lambda d: ", ".join(f"{p} {a}/{b}" for p, (a, b) in sorted(d.items())) or "none")

    def run(ctx: StepContext) -> Outcome:
        have = ctx.look(fact)
        if not ctx.runner.probing:
            return Outcome(OK, f"would count the ready nodes of each TPU pool ({env.hosts_per_slice} hosts each)")
        short = []
        for i in range(env.slices):
            name = nodepool_name(env, i)
            ready, total = have.get(name, (0, 0))
            if ready < env.hosts_per_slice:
                short.append(f"{name} {ready} of {env.hosts_per_slice} nodes ready")
        if short and env.capacity == "flex-start":
            # flex-start pools have nodes only while workers ask for them
            return Outcome(OK, "flex-start: " + "; ".join(short))
        if short:
            return Outcome(FAILED, "; ".join(short))
        return Outcome(OK, f"every pool has its {env.hosts_per_slice} nodes ready")

    return Step(PLAY, "TPU nodes ready", run=run, id="status:nodes",
                after=("kube:credentials", *[f"nodepools:{nodepool_name(env, i)}" for i in range(env.slices)]))


def workers_step(env: Environment) -> Step:
    from ..gke import raycluster_fact
    probe = raycluster_fact(env)

    def run(ctx: StepContext) -> Outcome:
        rc = ctx.look(probe)
        if rc is ABSENT:
            return Outcome(OK, "no RayCluster yet")
        why = k8s.ready(env, rc)
        if why is None:
            return Outcome(OK, f"head and {env.slices * env.hosts_per_slice} TPU workers ready")
        causes = ctx.look(k8s.causes_fact(env))
        return Outcome(FAILED, f"{why}" + (f"; why: {'; '.join(causes)}" if causes else ""))

    return Step(PLAY, "RayCluster workers", run=run, id="status:workers",
                after=("raycluster:apply",), probes=(probe,))


def _age(ms: Any) -> str:
    if not ms:
        return "?"
    s = max(0, time.time() - float(ms) / 1000)
    return f"{s / 3600:.1f}h" if s >= 3600 else f"{s / 60:.0f}m" if s >= 60 else f"{s:.0f}s"


def job_rows(env: Environment, listed: Any) -> list[dict]:
    rows = []
    for j in jobs.ours(None, listed):
        sid = str(j["submission_id"])
        run = jobs.run_of(sid)
        row = {"job": sid, "run": run, "status": j.get("status"), "age": _age(j.get("start_time"))}
        kept = metrics.run_dir(env, run) / metrics.FILE
        if kept.is_file():
            _, steps, _ = metrics.read(kept)
            if steps:
                last = max(steps, key=lambda r: r["step"])
                row.update(last_step=last["step"], loss=last.get("loss"),
                           tokens_per_s_per_device=last.get("tokens_per_s_per_device"))
        rows.append(row)
    return rows


def jobs_step(env: Environment, state: dict) -> Step:
    listing = jobs_fact(address(env), hosts.connector(env))

    def run(ctx: StepContext) -> Outcome:
        listed = ctx.look(listing)
        if listed is ABSENT or not ctx.runner.probing:
            return Outcome(OK, f"no Ray dashboard answers at {address(env)}" if ctx.runner.probing else
                           "would list the jobs of this environment's runs")
        rows = state["jobs"] = job_rows(env, listed)
        failed = [r["job"] for r in rows[-3:] if r["status"] == "FAILED"]
        text = ", ".join(f"{r['job']} {r['status']}" for r in rows[-3:]) or "none"
        return Outcome(FAILED if failed and failed[-1] == rows[-1]["job"] else OK, f"{len(rows)} job(s): {text}")

    after = ("dashboard:forward",) if env.kind != "local" else ("local:head",)
    return Step(PLAY, "jobs", run=run, id="status:jobs", after=after, probes=(listing,))


def steps(env: Environment, state: dict) -> list[Step]:
    out = plan.up_steps(env)
    if env.kind != "local":
        if env.mode == "standard":
            out.append(tpu_nodes_step(env))
        out.append(workers_step(env))
    out.append(jobs_step(env, state))
    return out


VERDICTS = {OK: "as asked", CHANGED: "missing", FAILED: "not as asked", SKIPPED: "not checked"}


def _state(lines: list[str]) -> str:
    """What the step's first probe found (its line's `=> ...`)."""
    for line in lines:
        if line.startswith("  probe") and "=> " in line:
            return line.rsplit("=> ", 1)[1].replace(" (cached)", "")
    return ""


def report(env: Environment, recap: Recap, state: dict) -> dict:
    items = []
    for r in recap.results:
        items.append({"what": r.title, "verdict": VERDICTS.get(r.outcome, r.outcome), "outcome": r.outcome,
                      "state": _state(r.lines), "reason": r.reason})
    first = next((i for i in items if i["outcome"] in (CHANGED, FAILED)), None)
    first = first or next((i for i in items if i["outcome"] == SKIPPED and "cannot be checked" not in i["reason"]
                           and "not checked" not in i["reason"]), None)
    diagnosis = f"{first['what']}: {first['reason']}" if first else None
    as_asked = all(i["outcome"] == OK or (i["outcome"] == SKIPPED and "cannot be checked" not in i["reason"])
                   for i in items) and not recap.not_run
    return {"environment": env.name, "kind": env.kind, "mode": env.get("mode"), "as_asked": as_asked,
            "items": items, "jobs": state.get("jobs", []), "diagnosis": diagnosis,
            "seconds": round(recap.wall, 1)}


def table(doc: dict) -> list[str]:
    width = max([len(i["what"]) for i in doc["items"]] + [10])
    out = [f"STATUS of {doc['environment']} ({doc['kind']}{', ' + doc['mode'] if doc.get('mode') else ''}), "
           f"in {doc['seconds']:.1f}s"]
    out.append(f"  {'WHAT':<{width}}  {'VERDICT':<13}  STATE / WHY")
    for i in doc["items"]:
        why = i["reason"] or i["state"]
        out.append(f"  {i['what']:<{width}}  {i['verdict']:<13}  {why}".rstrip())
    if doc["jobs"]:
        out.append("  JOBS (newest last)")
        for j in doc["jobs"][-5:]:
            extra = (f", step {j['last_step']}, loss {j['loss']:.3f}, {j['tokens_per_s_per_device']:.0f} tokens/s/device"
                     if j.get("last_step") is not None and j.get("loss") is not None
                     and j.get("tokens_per_s_per_device") is not None else "")
            out.append(f"    {j['job']}  {j['status']}  {j['age']} ago{extra}")
    out.append(f"diagnosis: {doc['diagnosis']}" if doc["diagnosis"] else
               "diagnosis: everything is as the inventory asks")
    return out


def render_json(doc: dict) -> str:
    return json.dumps(doc, indent=2, default=str)
