"""The watch in a GKE head pod (stall_watch: cluster on GKE), seen from
this machine: what it records comes back through its Ray job's log.

- `invoke logs --follow` (as `train`) is a viewer: it follows the watch's
  log beside the job's, takes each event back into this machine's
  timeline once, shows the watch's actions in its words, and a host the
  watch set aside comes into this machine's record (`invoke hosts`).
- `invoke watch` on a job that ended (one run with `train --detach`)
  brings the records back; a second time adds nothing.

The real gcloud and kubectl against the fakes (tests/clients.py), the real
Ray Jobs SDK over the fake dashboard; the watch's log is written as the
head's watch writes it (``timeline.MARK`` lines)."""
from __future__ import annotations

import json
import subprocess
import time

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


def test_a_follow_on_gke_views_what_the_watch_in_the_head_records_and_takes_it_back_once(gke):
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


def test_watch_brings_back_the_records_of_a_detached_job_nobody_viewed(gke):
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
