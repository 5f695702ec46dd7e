"""Provisioning benchmark: `invoke up` from nothing against the loopback
fakes of GCP and Kubernetes, driven by the real gcloud, gsutil and kubectl,
with simulated operation latencies. The tutorial's sequential order
(playbook.parallel=1) against the dependency graph run at once (the default),
in the same process; then a converged re-run and a `status`: the client
processes they start (gcloud, gsutil, kubectl, the auth plugin and the
gcloud it starts: counted by wrappers on PATH, tests/fakes/cloud.py) and
their API requests, with the gcloud reads answered in-process (the
default) and with every command its process (TPU_PLAYBOOKS_PROCESSES_ONLY=1).

    .venv/bin/python bench/provision.py [--scale 10]

Latencies (GKE-like, divided by --scale): cluster 8 min, TPU node pool
6 min, VPC network 20 s, subnet 10 s, RayCluster ready 2 min after it is
applied and not before every node pool is RUNNING. gcloud itself polls a
container operation every 5 s.
"""
from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import doc_table  # noqa: E402
from tests.fakes.cloud import STANDARD, fake_cloud  # noqa: E402

LATENCY = {"cluster": 8 * 60, "nodepool": 6 * 60, "network": 20, "subnet": 10}
RAY_READY = 2 * 60
# The longest chain of waits no tool can shorten: the cluster, then its node
# pools (all at once), then the RayCluster ready. The networks (network then
# subnet, 30 s) wait beside the cluster; the rest waits on nothing simulated.
CRITICAL = LATENCY["cluster"] + LATENCY["nodepool"] + RAY_READY


def up(cloud, scale: float, parallel: int):
    cloud.reset()
    for k, v in LATENCY.items():
        cloud.gcp.latency[k] = v / scale
    cloud.kube.ray_latency = RAY_READY / scale

    def pools_running() -> bool:
        cs = list(cloud.gcp.st.clusters.values())
        return bool(cs) and all(p["status"] == "RUNNING" for c in cs for p in c["nodePools"])

    cloud.kube.ray_gate = pools_running
    run = cloud.invoke("up", timeout=3600, INVOKE_PLAYBOOK_PARALLEL=str(parallel))
    if run.rc != 0:
        sys.exit(f"invoke up failed (parallel={parallel}):\n{run.out[-4000:]}")
    return run


def counted(run) -> str:
    programs = collections.Counter(p.split(" ", 1)[0] for p in run.processes)
    return f"{len(run.processes)} ({', '.join(f'{k} {v}' for k, v in sorted(programs.items())) or 'none'})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=10.0, help="divide the latencies by this")
    ap.add_argument("--write", action="store_true", help="write the table, dated, into docs/benchmarks.md")
    a = ap.parse_args()
    shutil.rmtree(ROOT / ".state" / STANDARD, ignore_errors=True)
    slow = {"TPU_PLAYBOOKS_PROCESSES_ONLY": "1"}
    with tempfile.TemporaryDirectory() as t, fake_cloud(Path(t)) as cloud:
        seq = up(cloud, a.scale, 1)
        par = up(cloud, a.scale, 4)
        # Converged: every step ok. Probes one at a time (the tutorial's
        # order), then at once (the default: all looked up before the steps).
        runs = {}
        for name, args, extra in (("one at a time", ("up",), {"INVOKE_PLAYBOOK_PARALLEL": "1"}),
                                  ("up, processes only", ("up",), slow), ("status, processes only", ("status",), slow),
                                  ("status", ("status",), {}), ("up", ("up",), {})):
            runs[name] = r = cloud.invoke(*args, timeout=600, **extra)
            assert r.rc == 0, r.out
        again = runs["up"]
    shutil.rmtree(ROOT / ".state" / STANDARD, ignore_errors=True)
    rc = again.recaps()[-1]
    critical = CRITICAL / a.scale
    lines = [f"`invoke up` from nothing, GKE Standard, 2 x v6e-16, against the loopback fakes with the real "
             f"clients; simulated latencies / {a.scale:g}: "
             + ", ".join(f"{k} {v / a.scale:.0f} s" for k, v in LATENCY.items())
             + f", RayCluster ready {RAY_READY / a.scale:.0f} s after its apply and its node pools. Its critical "
             f"path, the longest chain of those waits (cluster, then its node pools at once, then the RayCluster "
             f"ready), is {critical:.0f} s; gcloud polls an operation every 5 s.", "",
             "| run | wall s | ratio (goal) |", "| --- | --- | --- |",
             f"| from nothing, the tutorial's order (`parallel=1`) | {seq.seconds:.1f} | |",
             f"| from nothing, the dependency graph (`parallel=4`) | {par.seconds:.1f} | "
             f"{par.seconds / seq.seconds:.2f} of the tutorial's order (<= 0.60); "
             f"{par.seconds / critical:.2f}x the critical path (<= 1.10) |",
             f"| converged re-run, probes one at a time | {runs['one at a time'].seconds:.1f} | |",
             f"| converged re-run, probes at once (the default) | {again.seconds:.1f} | "
             f"{again.seconds / runs['one at a time'].seconds:.2f} (<= 0.40) |", "",
             "Client processes started (gcloud, gsutil, kubectl, the auth plugin and the gcloud it starts), "
             "with the gcloud reads and kubectl answered in-process (the default) and with every command its "
             "process (`TPU_PLAYBOOKS_PROCESSES_ONLY=1`, as on a controller); the goal is two thirds of 18 (`up`) "
             "and 13 (`status`), their counts before the in-process reads, and, with every command its process, "
             "no more than those counts (one kubectl for every Kubernetes object, the node pools read with the "
             "clusters, the project's number with the enabled services):", "",
             "| run | processes, in-process reads | processes, every command its process | API requests |",
             "| --- | --- | --- | --- |",
             f"| converged `up` | {counted(again)} | {counted(runs['up, processes only'])} | "
             f"{len(again.requests)} ({len(again.gcp)} GCP, {len(again.kube)} Kubernetes), "
             f"{len(again.changes)} changing |",
             f"| `status` | {counted(runs['status'])} | {counted(runs['status, processes only'])} | "
             f"{len(runs['status'].requests)} |", "",
             f"The converged re-run's recap: ok={rc['ok']} changed={rc['changed']} failed={rc['failed']}."]
    print("\n" + "\n".join(lines))
    if a.write:
        doc_table.write("benchmarks.md", "provision", f"bench/provision.py --scale {a.scale:g}", lines)


if __name__ == "__main__":
    main()
