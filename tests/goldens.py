"""Golden transcripts of `invoke --dry <task>` for every environment of the
shipped inventory. `make goldens` (python -m tests.goldens) rewrites them;
tests/test_goldens.py compares them line by line."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tests.inproc import run_invoke

ROOT = Path(__file__).resolve().parent.parent
GOLDENS = ROOT / "tests" / "goldens"
INVOKE = str(Path(sys.executable).parent / "invoke")

TASKS = {
    "capacity": ["capacity"],
    "prereqs": ["prereqs"],
    "network": ["network"],
    "cluster": ["cluster"],
    "nodepools": ["nodepools"],
    "storage": ["storage"],
    "raycluster": ["raycluster"],
    "dashboard": ["dashboard"],
    "up": ["up"],
    "train-llama3-8b": ["train"],
    "train-llama3-70b": ["train", "--model=llama3-70b"],
    "train-elastic": ["train", "--elastic"],
    "train-fresh": ["train", "--fresh"],
    "preflight-llama3-70b": ["preflight", "--model=llama3-70b"],
    "train-llama3-70b-fits": ["train", "--model=llama3-70b", "--preset=fits"],
    "chaos": ["chaos.delete-worker"],
    "chaos-preempt": ["chaos.preempt-worker", "--grace=15"],
    "chaos-maintenance": ["chaos.maintenance", "--in=120"],
    "chaos-hang": ["chaos.hang-worker"],
    "chaos-sicken": ["chaos.sicken-worker"],
    "chaos-heal": ["chaos.heal-worker"],
    "goodput": ["goodput"],
    "teardown": ["teardown"],
    "teardown-delete-bucket": ["teardown", "--delete-bucket"],
    "stop-tpus": ["stop-tpus"],
    # A chain that will make node pools: the capacity checks run first, in its first task.
    "chain-network-cluster-nodepools": ["network", "cluster", "nodepools"],
    "status": ["status"],
}


# The capacity options on Standard, from an inventory of their own.
CAPACITY_INVENTORY = GOLDENS / "capacity-inventory.yaml"
CAPACITY_TASKS = ("capacity", "nodepools", "up", "raycluster", "train-llama3-8b", "train-elastic", "teardown")


# The tutorial's 70B job does not fit 2 x v6e-16 (32 GiB chips), nor 2 x
# v5e-16 (16 GiB): on GKE its dry run says so (the HBM estimate, before any
# compile) and exits 1 (docs/preflight.md). v5p's 95 GiB and TPU7x's 192 GiB
# chips hold it.
MISFITS = ("train-llama3-70b", "preflight-llama3-70b")
FITS_70B = ("std-v5p", "std-tpu7x")


def expected_rc(env: str, task: str, inventory: Path | None = None) -> int:
    envs = yaml.safe_load((inventory or ROOT / "inventory.yaml").read_text())["environments"]
    return 1 if task in MISFITS and envs[env].get("kind") != "local" and env not in FITS_70B else 0


# The TPU generations besides v6e on Standard (v5e, v5p, TPU7x), from an
# inventory of their own: the whole path, from capacity to teardown.
GENERATIONS_INVENTORY = GOLDENS / "generations-inventory.yaml"
GENERATION_TASKS = ("capacity", "network", "nodepools", "up", "raycluster", "stop-tpus", "train-llama3-70b",
                    "preflight-llama3-70b", "train-elastic", "status", "teardown")


# The twin's chaos alone: on GKE these tasks refuse in one line (tests/test_chaos.py).
LOCAL_ONLY = ("chaos-sicken", "chaos-heal")
# GKE's alone: a local environment has no bucket to delete (refused in one line: tests/test_bill_stop.py).
CLOUD_ONLY = ("teardown-delete-bucket",)
# The hosts set aside: hosts.quarantine and hosts.release name a host, each
# environment's first (a simulated host; a slice's node pool on GKE).
HOST_TASKS = {
    "hosts": ["hosts"],
    "hosts-quarantine": ["hosts.quarantine", "{host}", "--why=chips failed the matmul check"],
    "hosts-release": ["hosts.release", "{host}"],
}
# GKE only (cases() lists it for dev alone).
HOST_TASKS_GKE = {"hosts-maintenance": ["hosts.maintenance", "{host}"]}
FIRST_HOST = {"dev": "v6e-16-0", "dev-autopilot": "v6e-16-0", "local": "tpu-group-0-0",
              "std-replace-pool": "v6e-16-0"}
# A slice's pool made again (quarantine_replace_pool), from an inventory of its own.
QUARANTINE_INVENTORY = GOLDENS / "quarantine-inventory.yaml"


def args_of(env: str, task: str) -> list[str]:
    """The command line of a golden case."""
    if task in HOST_TASKS or task in HOST_TASKS_GKE:
        return [a.format(host=FIRST_HOST[env]) for a in {**HOST_TASKS, **HOST_TASKS_GKE}[task]]
    return TASKS[task]


def environments() -> list[str]:
    return list(yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"])


def cases() -> list[tuple[str, str, Path | None]]:
    """(environment, task, inventory): every task of the shipped inventory's
    environments, and the capacity options' tasks."""
    envs = yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"]
    out = [(e, t, None) for e in environments() for t in TASKS
           if t != "status" and (t not in LOCAL_ONLY or envs[e].get("kind") == "local")
           and (t not in CLOUD_ONLY or envs[e].get("kind") != "local")]
    for e in yaml.safe_load(CAPACITY_INVENTORY.read_text())["environments"]:
        out += [(e, t, CAPACITY_INVENTORY) for t in CAPACITY_TASKS]
    for e in yaml.safe_load(GENERATIONS_INVENTORY.read_text())["environments"]:
        out += [(e, t, GENERATIONS_INVENTORY) for t in GENERATION_TASKS]
    out += [(e, t, None) for e in ("dev", "dev-autopilot", "local") for t in HOST_TASKS]
    # A slice's maintenance started now (GKE only: a local environment refuses it in one line).
    out += [("dev", "hosts-maintenance", None)]
    out += [("std-replace-pool", t, QUARANTINE_INVENTORY) for t in ("hosts-quarantine", "hosts-release")]
    # stall_action: restart: the watch's quarantine, its steps in the dry run (an elastic job), or the stop.
    out += [("std-replace-pool", "train-elastic", QUARANTINE_INVENTORY)]
    out += [("local-restart", t, QUARANTINE_INVENTORY) for t in ("train-elastic", "train-llama3-8b")]
    # The watch in a GKE head pod (stall_watch: cluster): the head's account bound to the bucket, its
    # rights applied and deleted, its submit.
    out += [("std-head-watch", t, QUARANTINE_INVENTORY) for t in ("storage", "raycluster", "train-elastic",
                                                                  "teardown")]
    return out


def dry_run(env: str, args: list[str], inventory: Path | None = None, real_cli: bool = False) -> tuple[int, str, str]:
    """`invoke --dry ...` with process creation refused: in this process
    (tests/inproc.py), or, ``real_cli``, through the `invoke` executable with
    process creation disabled in the child (tests/noproc)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "procs.log"
        e = dict(os.environ)
        e.update({"INVOKE_PLAYBOOK_ENV": env, "HOME": tmp})
        if inventory:
            e["INVOKE_PLAYBOOK_INVENTORY"] = str(inventory)
        else:
            e.pop("INVOKE_PLAYBOOK_INVENTORY", None)
        argv = [INVOKE, "--dry", *args]
        if real_cli:
            e.update({"PYTHONPATH": str(ROOT / "tests" / "noproc"), "NOPROC_LOG": str(log)})
            r = subprocess.run(argv, cwd=ROOT, env=e, capture_output=True, text=True, timeout=120)
            rc, out, err = r.returncode, r.stdout, r.stderr
            started = log.read_text() if log.exists() else ""
        else:
            ran = run_invoke(argv, e, ROOT, Path(tmp), limit=30.0)
            rc, out, err, started = ran.rc, ran.out, ran.err, ran.started
    return rc, normalize(out), err + (f"\nPROCESSES STARTED:\n{started}" if started else "")


def normalize(text: str) -> str:
    return text.replace(str(ROOT), "<repo>")


def golden_path(env: str, name: str) -> Path:
    return GOLDENS / env / f"{name}.txt"


def main() -> int:
    failed = 0
    for env, name, inventory in cases():
        rc, out, err = dry_run(env, args_of(env, name), inventory)
        if rc != expected_rc(env, name, inventory) or "PROCESSES STARTED" in err:
            print(f"{env} {name}: exit {rc}\n{err}", file=sys.stderr)
            failed += 1
            continue
        p = golden_path(env, name)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(out)
        print(f"wrote {p.relative_to(ROOT)} ({len(out.splitlines())} lines)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
