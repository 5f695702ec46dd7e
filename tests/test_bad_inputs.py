"""Every input of tests/data/bad_inputs.yaml, refused cleanly: a non-zero
exit (2 unless the case says), one line on stderr that holds each of the
case's words (the place, the value, the rule), nothing on stdout, no
traceback, no process started, no file written outside .state/, within 5 s
(15 s for the sample through the real CLI: a new interpreter on a loaded machine).
The valid ones (``accept: true``) run.

Every case runs in this process, through Invoke's own Program, as the
`invoke` script runs it: the same command line (sys.argv too), environment
variables, working directory, HOME, config files and tasks.py, with stdin
not a terminal, stdout and stderr captured, and process creation refused and
logged. An error raised outside every task gets the line session's last
resort prints. The cases marked ``cli: true`` (at least one of each input
form, and every case whose answer depends on the separate process: Invoke
failing before any task, a fifo, a device file, the working directory, stdin,
Invoke's own argv parsing) run again through the real `invoke` executable,
with process creation disabled in the child (tests/noproc), in parallel with
the rest.

Then the worst inputs in-process, each refused in under a second, the
teardown prompt on a real terminal, and output into a pipe whose reader went
away (141, quiet) while a closed socket stays an error, not a signal."""
from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.conftest import INVOKE, ROOT
from tests.inproc import CHILDREN, as_the_cli_runs, run_invoke

CORPUS = ROOT / "tests" / "data" / "bad_inputs.yaml"
CASES = yaml.safe_load(CORPUS.read_text())
GKE = {  # the tutorial's variables, lower-cased
    "kind": "gke", "project_id": "my-proj-1", "region": "us-east5", "zone": "us-east5-b", "cluster_name": "demo",
    "cluster_version": "1.35.2-gke.1842000", "mode": "standard", "gs_bucket": "demo-ckpt", "ksa_name": "demo-ksa",
    "namespace": "default", "user_identifier": "me@example.com",
}
LIMIT = 5.0
# A case through the real CLI is a new interpreter with its imports: on this
# two-core machine, inside the whole suite (a MaxText run and AOT compiles at
# once), that alone has taken 5 s. Still bounded: the worst inputs would take
# minutes (or forever) if they were not refused up front.
CLI_LIMIT = 15.0
# How a case gives its input (the corpus header); each has a case run through the real CLI.
FORMS = ("gke", "local", "envs", "inventory", "inventory_python", "inventory_path", "config", "env", "args", "fifo",
         "cwd")


def forms(case: dict) -> set[str]:
    out = {f for f in FORMS if f in case}
    if "args_python" in case:
        out.add("args")
    return out


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
        inventory = eval(case["inventory_python"])
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
    args = eval(case["args_python"]) if "args_python" in case else case.get("args", ["--dry", "up"])
    cwd = Path(fill(case["cwd"])) if "cwd" in case else ROOT
    return [INVOKE, f"--search-root={ROOT}", *args], env, cwd


def _result(case: dict, tmp: Path, rc: int, out: str, err: str, seconds: float, started: str, **more) -> dict:
    return {"rc": rc, "out": out, "err": err, "seconds": seconds, "started": started,
            "words": [w.replace("{tmp}", str(tmp)) for w in case.get("words", [])], **more}


# -- through the real CLI ----------------------------------------------------------------------
def run_cli(case: dict, tmp: Path, prepared: tuple[list[str], dict[str, str], Path]) -> dict:
    """``prepared``: what prepare() gave, in the main thread (whose
    os.environ the in-process cases change meanwhile)."""
    CHILDREN.allowed = True
    argv, env, cwd = prepared
    start = time.monotonic()
    r = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=60)
    seconds = time.monotonic() - start
    started = (tmp / "procs.log").read_text() if (tmp / "procs.log").exists() else ""
    return _result(case, tmp, r.returncode, r.stdout, r.stderr, seconds, started)


# -- in this process (tests/inproc.py) ------------------------------------------------------
def run_in_process(case: dict, tmp: Path) -> dict:
    """The case through Invoke's Program in this process: its exit code,
    stdout, stderr, and the processes it tried to start."""
    argv, env, cwd = prepare(case, tmp)
    r = run_invoke(argv, env, cwd, tmp, LIMIT)
    return _result(case, tmp, r.rc, r.out, r.err, r.seconds, r.started, outside=r.outside)


def problems(case: dict, r: dict, limit: float = LIMIT) -> list[str]:
    """What is wrong with how the CLI answered a case (nothing: clean)."""
    out = []
    text = r["out"] + r["err"]
    if "Traceback" in text:
        out.append("a traceback")
    if r["started"]:
        out.append(f"processes started: {r['started'].strip()}")
    if r["seconds"] > limit:
        out.append(f"took {r['seconds']:.1f}s (limit {limit:.0f}s)")
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
        assert forms(c) or c.get("accept") or c["name"] == "ok-shipped", f"{c['name']}: no input"
    assert len([c for c in CASES if not c.get("accept")]) >= 150
    through_cli = [c for c in CASES if c.get("cli")]
    missing = [f for f in FORMS if not any(f in forms(c) for c in through_cli)]
    assert not missing, f"no case of these input forms runs through the real CLI (cli: true): {missing}"
    assert any(c.get("accept") for c in through_cli) and any(not c.get("accept") for c in through_cli)
    assert all(c.get("cli") for c in CASES if "exit" in c), "a case with its own exit code runs through the CLI"
    assert len(through_cli) <= len(CASES) // 5, "the real CLI is for a sample; the rest runs in-process"


def _clean(case: dict, r: dict, how: str) -> list[str]:
    why = problems(case, r, CLI_LIMIT if how == "real CLI" else LIMIT)
    if case.get("accept") and "PLAY [" not in r["out"]:  # what a run prints is seen: an empty stdout means something
        why.append(f"a valid input ran, but its stdout shows no play: {r['out'][:200]!r}")
    return [f"{case['name']} ({how}): {'; '.join(why)}\n    stderr: {r['err'].strip()[:400]}"] if why else []


def test_every_bad_input_is_refused_cleanly_and_every_valid_one_runs(tmp_path):
    before = _tracked_changes()
    sample = [c for c in CASES if c.get("cli")]
    dirs = {}
    for how, cases in (("cli", sample), ("in-process", CASES)):
        for c in cases:
            d = tmp_path / how / c["name"]
            d.mkdir(parents=True)
            dirs[how, c["name"]] = d
    prepared = [prepare(c, dirs["cli", c["name"]]) for c in sample]
    # The real CLI in two threads (this machine's two cores), while the cases run here one by one.
    with ThreadPoolExecutor(max_workers=2) as pool:
        cli = pool.map(lambda c, p: run_cli(c, dirs["cli", c["name"]], p), sample, prepared)
        here = [run_in_process(c, dirs["in-process", c["name"]]) for c in CASES]
        cli_results = list(cli)
    bad = []
    for case, r in zip(CASES, here):
        bad += _clean(case, r, "in-process")
        if r["outside"] and not case.get("cli"):
            bad.append(f"{case['name']}: refused outside every task (Invoke's own config loading, the CLI's "
                       f"last resort exits the process): mark it cli: true")
    for case, r in zip(sample, cli_results):
        bad += _clean(case, r, "real CLI")
    assert not bad, f"{len(bad)} of {len(CASES) + len(sample)} runs not answered cleanly:\n" + "\n".join(bad)
    assert _tracked_changes() == before, "a refusal wrote a file outside .state/"
    for (how, name), d in dirs.items():
        home = d / "home"
        assert not any(home.iterdir()), f"{name} ({how}): wrote into HOME: {list(home.iterdir())}"
    slowest = max(cli_results, key=lambda r: r["seconds"])
    print(f"{len(CASES)} inputs in-process in {sum(r['seconds'] for r in here):.1f}s; {len(sample)} through the "
          f"real CLI, the slowest {slowest['seconds']:.2f}s")


def test_the_in_process_run_sees_what_the_cli_would(tmp_path):
    """The harness has teeth: a task that starts processes (doctor runs the
    installed tools) is caught and logged, not run; its output is seen."""
    # (its run log goes to .state/harness-self-test/, ignored by git like all of .state/)
    r = run_in_process({"name": "doctor", "envs": {"harness-self-test": {"base": "gke"}}, "args": ["doctor"]},
                       tmp_path)
    assert "_fork_exec" in r["started"] or "posix_spawn" in r["started"], r
    assert "PLAY [" in r["out"] and r["rc"] != 0


@pytest.mark.parametrize("level", ["system", "user", "project", "runtime"])
def test_a_near_miss_of_playbook_in_any_invoke_config_file_is_refused(tmp_path, monkeypatch, level):
    """Invoke keeps a top-level `playbok:` silently; the task refuses it,
    naming the file, whichever of Invoke's config files holds it. Invoke's
    own keys and other words are left alone."""
    from invoke.config import Config

    from playbooks.cli.session import playbook_config
    from playbooks.core.errors import InputError

    for var in [v for v in os.environ if v.startswith("INVOKE_")]:
        monkeypatch.delenv(var)
    folder = tmp_path / level
    folder.mkdir()
    name = {"user": ".invoke.yaml"}.get(level, "invoke.yaml")

    def config(text: str) -> Config:
        (folder / name).write_text(text)
        c = Config(system_prefix=f"{folder}/" if level == "system" else f"{tmp_path}/none/",
                   user_prefix=f"{folder}/." if level == "user" else f"{tmp_path}/none/.",
                   project_location=str(folder) if level == "project" else None,
                   runtime_path=str(folder / name) if level == "runtime" else None)
        c.load_project()
        c.load_runtime()
        return c

    for key in ("playbok", "play_book", "Playbook", "playbooks", "PLAYBOOK", "plabook"):
        with pytest.raises(InputError) as e:
            playbook_config(config(f"{key}:\n  env: dev\n"))
        assert str(e.value) == (f"Invoke config file {folder / name}: unknown top-level key {key!r} (nothing reads "
                                f"it, so its settings would not apply); did you mean playbook?")
    fine = config("run:\n  echo: true\ntasks:\n  dedupe: true\nsudo:\n  user: me\ntimeouts:\n  command: 60\n"
                  "runners: {}\ndocker: {image: x}\nplayback: 1\nplaybook_dir: x\nmy_playbook: 1\n"
                  "playground: 2\nplaybook:\n  env: dev\n")
    assert playbook_config(fine)["env"] == "dev"


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
    from playbooks.config.schema import load_inventory
    from playbooks.core.errors import InputError

    p = tmp_path / "inventory.yaml"
    p.write_text(WORST[name])
    start = time.monotonic()
    with pytest.raises(InputError) as e:
        load_inventory(p)
    seconds = time.monotonic() - start
    assert seconds < 1.0, f"{name}: {seconds:.2f}s"
    assert "\n" not in str(e.value) and len(str(e.value)) < 600


@pytest.mark.parametrize("value", ["dataset_path=" + "x" * 10_000_000, "a" * 1_000_000 + "=1",
                                   f"steps={'9' * 100_000}", "per_device_batch_size=" + "[" * 100_000,
                                   "remat_policy=" + "f" * 1000])
def test_the_worst_flags_are_refused_in_under_a_second(tmp_path, value):
    """Refused in one short line through the whole CLI path, in this process
    (within LIMIT: Invoke's own debug log formats the whole argv, ~0.4 s for
    10 MB), and by the task's own flag handling (tasks._job: --steps, --set,
    the job) in under a second."""
    import importlib.util
    from types import SimpleNamespace

    from playbooks.core.errors import InputError
    from tests.conftest import env

    case = {"name": "worst-flag", "args": ["--dry", "train", "--set", value], "words": ["--set '"]}
    (tmp_path / "cli").mkdir()
    r = run_in_process(case, tmp_path / "cli")
    assert problems(case, r) == [] and len(r["err"]) < 600, r["err"][:300]
    with as_the_cli_runs([INVOKE, "--dry", "train", "--set", value], dict(os.environ), ROOT, tmp_path, LIMIT):
        spec = importlib.util.spec_from_file_location("tasks_under_test", ROOT / "tasks.py")
        tasks = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tasks)
        local = SimpleNamespace(env=env("local"))
        start = time.monotonic()
        with pytest.raises(InputError):
            tasks._job(local, "llama3-8b", False, "", [value], False, "")
        seconds = time.monotonic() - start
    assert seconds < 1.0, f"{value[:40]}: {seconds:.2f}s"


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


def test_train_fresh_on_gke_says_what_it_deletes_and_asks_first(tmp_path):
    """`train --fresh` deletes the run's checkpoints in the bucket: on a
    real terminal it names them (the gs:// path) and asks for the
    environment's name; any other answer deletes nothing and starts no
    process (without a terminal it is refused: the corpus's case)."""
    rc, out = _on_a_terminal(["train", "--fresh", "--env", "dev"], b"prod\r", tmp_path)
    assert rc == 1 and "train cancelled" in out and "Traceback" not in out, out
    assert ("Delete every checkpoint of run rayjob-multi-slice (gs://my-tpu-project-maxtext-ckpt/rayjob-multi-slice/"
            "checkpoints/) and its timeline") in out, out
    assert "Type the environment name (dev) to confirm:" in out, out
    assert "PLAY [" not in out  # nothing ran


def test_output_into_a_pipe_whose_reader_went_away_ends_quietly(tmp_path):
    """`invoke --dry up | head -1` with head already gone: the run ends as
    a shell says SIGPIPE ended it (141), with nothing on stderr and no
    internal error kept."""
    argv, env, cwd = prepare({"local": {}}, tmp_path)
    last_error = ROOT / ".state" / "last-error.txt"
    before = last_error.stat().st_mtime_ns if last_error.exists() else None
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write
    try:
        r = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=write, stderr=subprocess.PIPE,
                           text=True, timeout=60)
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (141, ""), r
    assert (last_error.stat().st_mtime_ns if last_error.exists() else None) == before


def test_a_write_to_a_closed_socket_is_an_error_not_the_end_of_the_process():
    """SIGPIPE stays ignored once tasks.py is imported: a peer that closed
    its end (an SSH controller's sshd, a client) gives the writer a
    BrokenPipeError to handle, never a silent death by signal."""
    code = ("import socket, tasks\n"
            "a, b = socket.socketpair()\n"
            "b.close()\n"
            "try:\n"
            "    a.sendall(b'x' * 1_000_000)\n"
            "except BrokenPipeError:\n"
            "    print('BrokenPipeError')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, "BrokenPipeError\n"), r


def test_every_task_takes_its_environment_as_dash_e(monkeypatch):
    """`invoke <task> -e NAME` on every task. Invoke gives short flags in
    the order of a task's parameters: train, preflight and watch once gave
    -e to --elastic, and `invoke train -e dev` answered "No idea what 'dev'
    is!"."""
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # tasks.py installs its own
    import tasks

    short = {}
    for name in tasks.ns.task_names:
        args = {a.name: a for a in tasks.ns[name].get_arguments()}
        short[name] = args["env"].names if "env" in args else None
    assert {n: s for n, s in short.items() if s != ("env", "e")} == {}
    assert {"train", "preflight", "watch", "hosts.release"} <= set(short)
