"""Every bad input of tests/data/bad_inputs.yaml through the real CLI, refused
cleanly: a non-zero exit (2 unless the case says), one line on stderr that
holds each of the case's words (the place, the value, the rule), nothing on
stdout, no traceback, no process started, no file written outside .state/,
within 5 s. The valid ones (``accept: true``) run. Then the worst inputs
in-process, each refused in under a second, and the teardown prompt on a
real terminal."""
from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.conftest import INVOKE, ROOT

CORPUS = ROOT / "tests" / "data" / "bad_inputs.yaml"
CASES = yaml.safe_load(CORPUS.read_text())
GKE = {  # the tutorial's variables, lower-cased
    "kind": "gke", "project_id": "my-proj-1", "region": "us-east5", "zone": "us-east5-b", "cluster_name": "demo",
    "cluster_version": "1.35.2-gke.1842000", "mode": "standard", "gs_bucket": "demo-ckpt", "ksa_name": "demo-ksa",
    "namespace": "default", "user_identifier": "me@example.com",
}
LIMIT = 5.0


def _env_of(base: str, changes: dict) -> dict:
    out = dict(GKE) if base == "gke" else {"kind": "local"}
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def prepare(case: dict, tmp: Path) -> tuple[list[str], dict[str, str], Path]:
    """The command line, the environment and the folder a case runs with."""
    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp)).replace("{root}", str(ROOT))

    env = {k: v for k, v in os.environ.items() if not k.startswith(("INVOKE_", "CLOUDSDK_", "KUBECONFIG"))}
    env.update({"HOME": str(tmp / "home"), "PYTHONPATH": str(ROOT / "tests" / "noproc"),
                "NOPROC_LOG": str(tmp / "procs.log"), "CLOUDSDK_CONFIG": str(tmp / "gcloud"),
                "KUBECONFIG": str(tmp / "kubeconfig"), "TMPDIR": str(tmp / "t")})
    (tmp / "home").mkdir()
    (tmp / "t").mkdir()
    inventory: str | bytes | None = None
    if "gke" in case:
        inventory = yaml.safe_dump({"default": "t", "environments": {"t": _env_of("gke", case["gke"])}})
    elif "local" in case:
        inventory = yaml.safe_dump({"default": "t", "environments": {"t": _env_of("local", case["local"])}})
    elif "envs" in case:
        envs = {n: _env_of(e.pop("base"), e) for n, e in ((n, dict(e)) for n, e in case["envs"].items())}
        inventory = yaml.safe_dump({"default": next(iter(envs)), "environments": envs})
    elif "inventory" in case:
        inventory = case["inventory"]
    elif "inventory_python" in case:
        inventory = eval(case["inventory_python"])  # noqa: S307 - the corpus is this repository's
    if case.get("fifo"):
        os.mkfifo(tmp / "inventory.yaml")
        env["INVOKE_PLAYBOOK_INVENTORY"] = str(tmp / "inventory.yaml")
    if inventory is not None:
        path = tmp / "inventory.yaml"
        (path.write_bytes if isinstance(inventory, bytes) else path.write_text)(inventory)
        env["INVOKE_PLAYBOOK_INVENTORY"] = "inventory.yaml" if case.get("relative") else str(path)
    if "inventory_path" in case:
        env["INVOKE_PLAYBOOK_INVENTORY"] = fill(case["inventory_path"])
    if "config" in case:
        (tmp / "invoke.yaml").write_text(case["config"])
        env["INVOKE_RUNTIME_CONFIG"] = str(tmp / "invoke.yaml")
    env.update({k: fill(str(v)) for k, v in (case.get("env") or {}).items()})
    args = eval(case["args_python"]) if "args_python" in case else case.get("args", ["--dry", "up"])  # noqa: S307
    cwd = Path(fill(case["cwd"])) if "cwd" in case else ROOT
    return [INVOKE, f"--search-root={ROOT}", *args], env, cwd


def run_case(case: dict, tmp: Path) -> dict:
    argv, env, cwd = prepare(case, tmp)
    start = time.monotonic()
    r = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=60)
    seconds = time.monotonic() - start
    started = (tmp / "procs.log").read_text() if (tmp / "procs.log").exists() else ""
    return {"rc": r.returncode, "out": r.stdout, "err": r.stderr, "seconds": seconds, "started": started,
            "words": [w.replace("{tmp}", str(tmp)) for w in case.get("words", [])]}


def problems(case: dict, r: dict) -> list[str]:
    """What is wrong with how the CLI answered a case (nothing: clean)."""
    out = []
    text = r["out"] + r["err"]
    if "Traceback" in text:
        out.append("a traceback")
    if r["started"]:
        out.append(f"processes started: {r['started'].strip()}")
    if r["seconds"] > LIMIT:
        out.append(f"took {r['seconds']:.1f}s (limit {LIMIT:.0f}s)")
    if case.get("accept"):
        if r["rc"] != 0:
            out.append(f"a valid input was refused (exit {r['rc']}): {r['err'].strip()[:300]}")
        return out
    lines = [line for line in r["err"].splitlines() if line.strip()]
    if r["rc"] != case.get("exit", 2):
        out.append(f"exit {r['rc']}, want {case.get('exit', 2)}")
    if len(lines) != 1:
        out.append(f"{len(lines)} lines on stderr, want 1")
    if r["out"].strip():
        out.append(f"stdout is not empty: {r['out'].strip()[:200]!r}")
    line = lines[0] if lines else ""
    missing = [w for w in r["words"] if w not in line]
    if missing:
        out.append(f"the line lacks {missing}")
    return out


def test_the_corpus_is_well_formed():
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    for c in CASES:
        assert c.get("accept") or c.get("words"), f"{c['name']}: a refusal names the words it must contain"
    assert len([c for c in CASES if not c.get("accept")]) >= 150


def test_every_bad_input_is_refused_cleanly_and_every_valid_one_runs(tmp_path):
    before = _tracked_changes()
    dirs = []
    for i in range(len(CASES)):
        d = tmp_path / f"{i:03d}"
        d.mkdir()
        dirs.append(d)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run_case, CASES, dirs))
    bad = []
    for case, r in zip(CASES, results):
        why = problems(case, r)
        if why:
            bad.append(f"{case['name']}: {'; '.join(why)}\n    stderr: {r['err'].strip()[:400]}")
    assert not bad, f"{len(bad)} of {len(CASES)} inputs not answered cleanly:\n" + "\n".join(bad)
    assert _tracked_changes() == before, "a refusal wrote a file outside .state/"
    for d in dirs:
        home = d / "home"
        assert not any(home.iterdir()), f"{d.name}: wrote into HOME: {list(home.iterdir())}"
    slowest = max(results, key=lambda r: r["seconds"])
    print(f"{len(CASES)} inputs; slowest {slowest['seconds']:.2f}s")


def _tracked_changes() -> str:
    """Files of the repository that differ or are new, .state/ aside (it is
    ignored by git, and where the tool may write)."""
    r = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    return r.stdout


# -- the worst inputs, in-process: refused in under a second ------------------------------
WORST = {
    "slices-a-trillion": "default: t\nenvironments:\n  t: {kind: gke, project_id: my-proj-1, region: us-east5, "
                         "zone: us-east5-b, cluster_name: demo, cluster_version: 1.35.2-gke.1842000, mode: standard, "
                         "gs_bucket: demo-ckpt, ksa_name: demo-ksa, namespace: default, user_identifier: me@x.io, "
                         "slices: 1000000000000}\n",
    "local-topology-huge": "default: t\nenvironments:\n  t: {kind: local, topology: 999x999}\n",
    "alias-bomb": ("environments:\n  t:\n    kind: local\n    train_overrides:\n      x0: &a0 [x,x,x,x,x,x,x,x,x]\n"
                   + "".join(f"      x{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10))
                   + "default: t\n"),
    "deep-nesting": "default: t\nx: " + "[" * 100_000 + "]" * 100_000 + "\n",
    "a-megabyte-string": "default: t\nenvironments:\n  t: {kind: local, ray_ip: '" + "1" * 1_000_000 + "'}\n",
    "regex-bomb": ("default: t\nenvironments:\n  t: {kind: gke, project_id: my-proj-1, region: us-east5, zone: "
                   "us-east5-b, cluster_name: demo, cluster_version: 1.35.2-gke.1842000, mode: standard, gs_bucket: "
                   "demo-ckpt, ksa_name: demo-ksa, namespace: default, user_identifier: 'a@" + "." * 1000 + "@'}\n"),
    "many-environments": "default: e0\nenvironments:\n" + "".join(
        f"  e{i}: {{kind: local, gcs_port: {2000 + 80 * i}, dashboard_port: {20000 + i}}}\n" for i in range(100))
    + "  e100: {kind: local}\n",
    "a-5000-digit-number": "default: t\nenvironments:\n  t: {kind: local, slices: " + "9" * 5000 + "}\n",
}


@pytest.mark.parametrize("name", list(WORST))
def test_the_worst_inputs_are_refused_in_under_a_second(tmp_path, name):
    from playbooks.core.errors import InputError
    from playbooks.schema import load_inventory

    p = tmp_path / "inventory.yaml"
    p.write_text(WORST[name])
    start = time.monotonic()
    with pytest.raises(InputError) as e:
        load_inventory(p)
    seconds = time.monotonic() - start
    assert seconds < 1.0, f"{name}: {seconds:.2f}s"
    assert "\n" not in str(e.value) and len(str(e.value)) < 600


def test_the_worst_flags_are_refused_in_under_a_second():
    from playbooks.core.errors import InputError
    from playbooks.plays.train import build_job
    from tests.conftest import env

    e = env("local")
    for sets in (["dataset_path=" + "x" * 10_000_000], ["a" * 1_000_000 + "=1"], [f"steps={'9' * 100_000}"],
                 ["per_device_batch_size=" + "[" * 100_000]):
        start = time.monotonic()
        with pytest.raises(InputError):
            build_job(e, "llama3-8b", sets=sets)
        assert time.monotonic() - start < 1.0, sets[0][:40]


# -- the teardown prompt, on a real terminal --------------------------------------------------
def _on_a_terminal(args: list[str], keys: bytes, tmp: Path) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}
    env.update({"HOME": str(tmp), "PYTHONPATH": str(ROOT / "tests" / "noproc"), "NOPROC_LOG": str(tmp / "p.log")})
    leader, follower = pty.openpty()
    p = subprocess.Popen([INVOKE, *args], cwd=ROOT, env=env, stdin=follower, stdout=follower, stderr=follower,
                         close_fds=True)
    os.close(follower)
    out, sent, deadline = b"", False, time.monotonic() + 30
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            if not sent and b"to confirm:" in out:
                os.write(leader, keys)
                sent = True
        elif p.poll() is not None:
            break
    p.wait(10)
    os.close(leader)
    assert not (tmp / "p.log").exists(), (tmp / "p.log").read_text()
    return p.returncode, out.decode(errors="replace")


@pytest.mark.parametrize("keys, words", [(b"\x04", "teardown cancelled"), (b"prod\r", "teardown cancelled")])
def test_the_teardown_prompt_takes_ctrl_d_or_a_wrong_name_as_no(tmp_path, keys, words):
    rc, out = _on_a_terminal(["teardown"], keys, tmp_path)
    assert rc == 1 and words in out and "Traceback" not in out, out
    assert "stop head" not in out  # nothing was torn down
