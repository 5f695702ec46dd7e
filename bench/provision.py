"""Provisioning benchmark: `invoke up` from nothing against the loopback
fakes of GCP and Kubernetes, driven by the real gcloud, gsutil and kubectl,
with simulated operation latencies. The tutorial's sequential order
(playbook.parallel=1) against the dependency graph run at once (the default),
in the same process; then a converged re-run: its CLI processes and API
requests.

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


def kind(line: str) -> str:
    """A command's resource kind: the words before its first flag or name."""
    words = [w for w in line.split() if "=" not in w or not w.split("=")[0].isupper()]
    if words[:1] == ["gcloud"]:
        for verb in ("list", "describe", "get-iam-policy", "ls"):
            if verb in words:
                return " ".join(words[1:words.index(verb) + 1])
        return " ".join(words[1:4])
    if words[:1] == ["kubectl"]:
        return " ".join(words[:3])
    return " ".join(words[:3])


def run_log(env: str) -> list[str]:
    """The command lines of the newest run of this environment (one log
    each), without the in-process facts (logged there too, but no process)."""
    runs = sorted((ROOT / ".state" / env / "runs").iterdir())
    out = []
    for p in sorted(runs[-1].glob("*.log")):
        first, second = (p.read_text().splitlines() + ["", ""])[:2]
        if not second.startswith("# in-process fact"):
            out.append(first[2:])
    return out


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=10.0, help="divide the latencies by this")
    ap.add_argument("--write", action="store_true", help="write the table, dated, into docs/benchmarks.md")
    a = ap.parse_args()
    shutil.rmtree(ROOT / ".state" / STANDARD, ignore_errors=True)
    with tempfile.TemporaryDirectory() as t, fake_cloud(Path(t)) as cloud:
        seq = up(cloud, a.scale, 1)
        par = up(cloud, a.scale, 4)
        # Converged: every step ok. Probes one at a time (the tutorial's
        # order), then at once (the default: all looked up before the steps).
        one_at_a_time = cloud.invoke("up", timeout=600, INVOKE_PLAYBOOK_PARALLEL="1")
        assert one_at_a_time.rc == 0, one_at_a_time.out
        again = cloud.invoke("up", timeout=600)
        assert again.rc == 0, again.out
        lines = run_log(STANDARD)
    shutil.rmtree(ROOT / ".state" / STANDARD, ignore_errors=True)
    kinds = collections.Counter(kind(ln) for ln in lines)
    rc = again.recaps()[-1]
    worst = max(kinds.values())
    lines = [f"`invoke up` from nothing, GKE Standard, 2 x v6e-16, against the loopback fakes with the real "
             f"clients; simulated latencies / {a.scale:g}: "
             + ", ".join(f"{k} {v / a.scale:.0f} s" for k, v in LATENCY.items())
             + f", RayCluster ready {RAY_READY / a.scale:.0f} s after its apply and its node pools.", "",
             "| run | wall s | ratio (goal) |", "| --- | --- | --- |",
             f"| from nothing, the tutorial's order (`parallel=1`) | {seq.seconds:.1f} | |",
             f"| from nothing, the dependency graph (`parallel=4`) | {par.seconds:.1f} | "
             f"{par.seconds / seq.seconds:.2f} (<= 0.60) |",
             f"| converged re-run, probes one at a time | {one_at_a_time.seconds:.1f} | |",
             f"| converged re-run, probes at once (the default) | {again.seconds:.1f} | "
             f"{again.seconds / one_at_a_time.seconds:.2f} (<= 0.40) |", "",
             f"The converged re-run: {len(lines)} CLI processes, {len(again.requests)} API requests "
             f"({len(again.gcp)} GCP, {len(again.kube)} Kubernetes), {len(again.changes)} changing; recap "
             f"ok={rc['ok']} changed={rc['changed']} failed={rc['failed']}; probe processes per resource kind: "
             f"at most {worst} (goal <= 1): " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) + "."]
    print("\n" + "\n".join(lines))
    if a.write:
        doc_table.write("benchmarks.md", "provision", f"bench/provision.py --scale {a.scale:g}", lines)


if __name__ == "__main__":
    main()
