"""The watch in a GKE head pod (stall_watch: cluster on GKE), seen from
this machine: what it records comes back through its Ray job's log.

- `invoke logs --follow` (as `train`) is a viewer: it follows the watch's
  log beside the job's, takes each event back into this machine's
  timeline once, shows the watch's actions in its words, and a host the
  watch set aside comes into this machine's record (`invoke hosts`).
- `invoke watch` on a job that ended (one run with `train --detach`)
  brings the records back; a second time adds nothing.

Through `invoke` against the fakes (what runs as a process and what
in-process: tests/clients.py), the real Ray Jobs SDK over the fake
dashboard; the watch's log is written as the head's watch writes it
(``timeline.MARK`` lines)."""
from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass

import pytest

from playbooks.runs import events as E
from playbooks.runs.timeline import MARK
from tests.clients import ROOT, Cloud
from tests.fakes.cloud import INVOKE
from tests.test_clients_follow import RUN, SID, STATE, Job, gke, start, wait_for  # noqa: F401 - the fixture

pytestmark = pytest.mark.clients

WATCH = f"{SID}-watch"
HOST = "v6e-16-1"


def marked(e: dict) -> str:
    return MARK + json.dumps({"run": RUN, "event": e})


def watch_events(t: float) -> list[dict]:
    return [{"t": t, "kind": E.QUARANTINED, "source": "watch", "job": SID, "host": HOST, "slice": HOST,
             "why": "failed its health checks: devices: devices 3 of 4", "by": "health gate",
             "nodes": ["gke-n-1-0", "gke-n-1-1"]},
            {"t": t + 1, "kind": E.STEP, "step": 99, "seconds": 0.5, "source": "trainer", "job": SID}]


def record() -> dict:
    p = STATE / "quarantine.json"
    return json.loads(p.read_text())["hosts"] if p.exists() else {}


def timeline_events() -> list[dict]:
    p = STATE / "training" / RUN / "events.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def test_a_follow_on_gke_views_what_the_watch_in_the_head_records_and_takes_it_back_once(gke):  # noqa: F811
    cloud, env, _ = gke
    cloud.change_inventory(stall_watch="cluster", stall_action="restart", dashboard_port=cloud.envdata().dashboard_port,
                           reconnect_timeout=10)
    job = Job(cloud)
    cloud.dashboard.add_job(WATCH, f"python -m invoke watch --run={RUN} --job={SID}")
    cloud.dashboard.log(WATCH, "PLAY [watch] the watch's own lines", "@tpu-playbooks noise not an event")
    job.thread.start()
    p, lines = start(cloud, env, "logs", "--follow", f"--run={RUN}")
    wait_for(lines, "watch: in the cluster", p)
    job.go.set()
    wait_for(lines, "completed step: 3,", p)
    t = time.time()
    cloud.dashboard.log(WATCH, *[marked(e) for e in watch_events(t)])
    wait_for(lines, f"watch in the cluster: host {HOST} quarantined by health gate", p)
    rc = p.wait(timeout=240)
    cloud.dashboard.end(WATCH)
    out = "\n".join(lines)
    assert rc == 0, out[-4000:]
    assert "Traceback" not in out and "noise" not in out
    got = [e for e in timeline_events() if e.get("source") == "watch" or e.get("step") == 99]
    assert [e["kind"] for e in got] == [E.QUARANTINED, E.STEP], got
    rec = record()[HOST]
    assert rec["nodes"] == ["gke-n-1-0", "gke-n-1-1"] and "the watch in the cluster" in rec["by"]
    listed = cloud.invoke("hosts")
    assert listed.rc == 0 and f"{HOST}: slice {HOST}" in listed.out, listed.out[-2000:]

    # `invoke watch` of the ended job: its records brought back again add nothing, and a host released
    # here is not set aside again.
    (STATE / "quarantine.json").write_text(json.dumps({"hosts": {}}))
    again = subprocess.run([str(INVOKE), "watch", f"--run={RUN}", f"--job={SID}"], env=cloud.env(**env), cwd=ROOT,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stdout[-3000:]
    assert f"job {SID} is already SUCCEEDED: nothing to watch (0 new event(s) brought back from its watch {WATCH})" \
        in again.stdout, again.stdout[-3000:]
    assert record() == {} and len([e for e in timeline_events() if e.get("source") == "watch"]) == 1


def test_watch_brings_back_the_records_of_a_detached_job_nobody_viewed(gke):  # noqa: F811
    cloud, env, _ = gke
    cloud.change_inventory(stall_watch="cluster", dashboard_port=cloud.envdata().dashboard_port)
    cloud.dashboard.add_job(SID, "python maxtext_multi_slice_trainer.py base.yml")
    cloud.dashboard.add_job(WATCH, f"python -m invoke watch --run={RUN} --job={SID}")
    cloud.dashboard.log(WATCH, *[marked(e) for e in watch_events(time.time())])
    cloud.dashboard.end(SID)
    cloud.dashboard.end(WATCH)
    run = cloud.invoke("watch", f"--run={RUN}", f"--job={SID}", **env)
    assert run.rc == 0, run.out[-3000:]
    assert f"(2 new event(s) brought back from its watch {WATCH})" in run.out, run.out[-3000:]
    assert HOST in record()
    assert [e["kind"] for e in timeline_events() if e.get("job") == SID] == [E.QUARANTINED, E.STEP]


# -- the watch in the head pod itself ---------------------------------------------------
# What the Ray image lacks: the watch must never import them (it gets Ray,
# the standard library and cluster_watch.PACKAGES, with their own needs).
NOT_IN_THE_HEAD = ("fabric", "paramiko", "jax", "jaxlib", "maxtext", "matplotlib", "orbax", "pytest", "google.cloud")
HEAD = """
import importlib.abc, runpy, sys
BLOCKED = {blocked!r}
class NotInTheHead(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"{{name}} is not in the Ray head's image")
        return None
sys.meta_path.insert(0, NotInTheHead())
import playbooks.access.kube_api as k
k.SERVICE_ACCOUNT_DIR = {sa!r}
sys.argv = ["invoke", *{args!r}]
runpy.run_module("invoke", run_name="__main__", alter_sys=True)
"""


def gate_line(pod: dict, slice_: str = HOST) -> str:
    """A failed health gate naming the worker ``pod`` (by its hostname, as
    the trainer reports it) of ``slice_``."""
    hostname = pod["spec"].get("hostname") or pod["metadata"]["name"]
    e = {"t": round(time.time(), 3), "kind": E.HEALTH_GATE, "ok": False, "source": "trainer",
         "unhealthy": [{"slice": slice_, "host": 0, "rank": 4, "hostname": hostname, "failed": ["devices"]}]}
    return f"(RayTrainWorker pid=42, ip=10.0.0.3) trainer event: {json.dumps(e)}"


@dataclass
class HeadWatch:
    """`invoke watch --elastic` run as the head pod runs it, its output
    lines as they come; each slice's nodes and worker pods at its start."""
    p: subprocess.Popen
    lines: list[str]
    nodes: dict[str, set[str]]
    pods: dict[str, list[dict]]
    mark: int  # the fake API server's requests from the watch's start on


def head_watch(cloud: Cloud, tmp_path) -> HeadWatch:
    """The full tutorial on the fakes, the job running, a failed health gate
    in its log on a worker of slice HOST, and the watch started as the head
    pod runs it: no kubectl, gcloud or kubeconfig, none of what the Ray
    image lacks; the pod's service account; the head's dashboard."""
    cloud.seed_full()
    cloud.change_inventory(stall_watch="cluster", stall_action="restart")
    workers = list(cloud.kube.list("pods", "default", "ray.io/node-type=worker"))
    nodes: dict[str, set[str]] = {}
    for n in cloud.kube.list("nodes"):
        nodes.setdefault(n["metadata"]["labels"].get("cloud.google.com/gke-nodepool"), set()).add(n["metadata"]["name"])
    pods = {pool: [p for p in workers if (p.get("spec") or {}).get("nodeName") in names]
            for pool, names in nodes.items()}
    assert nodes.get(HOST) and pods[HOST], "the fake cluster has no worker pod on the slice"
    cloud.dashboard.add_job(SID, "python maxtext_elastic_trainer.py base.yml")
    cloud.dashboard.log(SID, "(TrainController pid=7) Started training worker group of size 8.",
                        gate_line(pods[HOST][0]))
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(cloud.kube.token)
    (sa / "ca.crt").write_text(cloud.kube.pki.ca_file.read_text())
    env = cloud.env()
    for gone in ("KUBECONFIG", "CLOUDSDK_CONFIG", "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE", "CLOUDSDK_AUTH_TOKEN_HOST",
                 "BOTO_CONFIG"):
        env.pop(gone, None)
    bare = tmp_path / "bin"  # the head's PATH: its Python, nothing of Google's
    bare.mkdir()
    env.update({"PATH": f"{ROOT / '.venv' / 'bin'}:{bare}", "TPU_PLAYBOOKS_IN_CLUSTER": "1",
                "TPU_PLAYBOOKS_DASHBOARD": f"http://127.0.0.1:{cloud.dashboard.server.port}",
                "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(cloud.kube.server.port)})
    code = HEAD.format(blocked=NOT_IN_THE_HEAD, sa=str(sa),
                       args=["watch", f"--run={RUN}", f"--job={SID}", "--elastic"])
    mark = cloud.kube.server.mark()
    p = subprocess.Popen([str(ROOT / ".venv" / "bin" / "python"), "-c", code], env=env, cwd=ROOT,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(x.rstrip("\n") for x in p.stdout), daemon=True).start()
    return HeadWatch(p, lines, nodes, pods, mark)


def test_the_watch_in_the_head_sets_a_sick_slice_aside_with_its_service_account_alone(cloud: Cloud, tmp_path):
    """A failed health gate on a host of slice v6e-16-1, the watch run as
    the head pod runs it (``head_watch``): its nodes cordoned and tainted,
    its worker pods moved off, every event also a line of its log for this
    machine to take back."""
    from playbooks.plays.quarantine import TAINT_KEY
    from playbooks.runs import watch_records
    w = head_watch(cloud, tmp_path)
    wait_for(w.lines, f"host {HOST} quarantined", w.p, 120)
    cloud.dashboard.end(SID)
    assert w.p.wait(timeout=120) == 0, "\n".join(w.lines[-80:])
    out = "\n".join(w.lines)
    assert "not answered in the cluster" not in out and "is not in the Ray head's image" not in out, out[-4000:]
    for n in w.nodes[HOST]:
        spec = cloud.kube.get("nodes", n)["spec"]
        assert spec.get("unschedulable") and any(t["key"] == TAINT_KEY for t in spec.get("taints") or []), n
    left = {p["metadata"]["name"] for p in cloud.kube.list("pods", "default", "ray.io/node-type=worker")}
    assert not left & {p["metadata"]["name"] for p in w.pods[HOST]}
    seen = cloud.kube.server.since(w.mark)
    assert {r.headers.get("authorization", "").lower() for r in seen} == {f"bearer {cloud.kube.token}".lower()}
    # What this machine takes back from the watch's log: the quarantine, with the slice's nodes.
    back = [watch_records.parse(x) for x in w.lines]
    quarantined = [e for _, e in filter(None, back) if e["kind"] == E.QUARANTINED]
    assert [(e["host"], sorted(e["nodes"])) for e in quarantined] == [(HOST, sorted(w.nodes[HOST]))], out[-3000:]


def test_in_the_head_a_slice_given_back_from_this_machine_is_a_slice_again(cloud: Cloud, tmp_path):
    """The head keeps its own record, which a release from this machine
    never reaches: its watch reads the nodes' taint. Slice v6e-16-1 set
    aside by a failed gate, then given back here (`invoke hosts.release`:
    uncordoned, untainted) while the head's record still lists it; a gate
    failing on slice v6e-16-0 then sets that one aside, and the job goes
    on: it is not stopped as if no slice were left."""
    from playbooks.runs import quarantine_record as R
    w = head_watch(cloud, tmp_path)
    wait_for(w.lines, f"host {HOST} quarantined", w.p, 120)
    env = cloud.envdata()
    held = R.read(env)[HOST]
    released = cloud.invoke("hosts.release", HOST)
    assert released.rc == 0 and HOST not in R.read(env), released.out[-3000:]
    # The head's copy (here the fakes' head shares this machine's folder): as it was.
    R.add(env, HOST, held).fn()
    other = "v6e-16-0"
    cloud.dashboard.log(SID, gate_line(w.pods[other][0], other))
    wait_for(w.lines, f"host {other} quarantined", w.p, 120)
    cloud.dashboard.end(SID)
    assert w.p.wait(timeout=120) == 0, "\n".join(w.lines[-80:])
    out = "\n".join(w.lines)
    assert f"health gate: host {other} quarantined (failed its checks); the elastic job's next worker group goes " \
           "on without it" in out, out[-4000:]
    assert not [x for x in w.lines if x.strip().startswith("apply  ray job stop")], out[-4000:]
    assert sorted(R.read(env)) == [other, HOST]   # the head's copy: both (`invoke hosts` is this machine's)
