"""`invoke doctor`: are the tools there (where the commands run: this
machine or the controller host), at which versions, and does every gcloud
command of this environment's plan parse with that gcloud? It composes
the plays' commands (``task_steps.all_commands``), so it sits beside ``plan``.

The parse check runs gcloud's own argument parser (calliope) in gcloud's
bundled Python, without running a command: ~20 lines in ~3 s where the CLI
takes ~1.3 s a line. It relies on gcloud internals, so a known-good and a
known-bad canary line ride along; if either answers wrong, the check falls
back to the CLI itself (exit 2 = parse error; anything else got past the
parser)."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from playbooks.access.cli_clients import NO_ACCOUNT_WORDS, fact, gcloud, json_object, text_value
from playbooks.cli import task_steps
from playbooks.cloud.gke import clusters_fact, kube, kube_context
from playbooks.cloud.kube_context import has_context, kubeconfig_fact
from playbooks.config.schema import Environment
from playbooks.config.versions import installed, pinned, ray_version
from playbooks.core.command import PLACEHOLDER, Command
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT, Completed, Fact
from playbooks.core.step import Step, fail, ok, skipped

PLAY = "doctor"
GOOD = ["compute", "networks", "list", "--format=json"]
BAD = ["compute", "networks", "create", "doctor-canary", "--subnet-mode=nonsense"]


def _version(pattern: str | Callable[[str], str | None]):
    """A tool's version from its output: a pattern's first group, or what a
    function reads from its stdout."""
    def parse(c: Completed) -> Any:
        if c.rc == 127:
            return ABSENT
        if callable(pattern):
            v = pattern(c.stdout) if c.ok else None
        else:
            m = re.search(pattern, c.stdout + c.stderr)
            v = m.group(1) if m else None
        if not v:
            raise ProbeFailed("version", c.line, c.rc, c.stdout, c.stderr, why="no version in its output")
        return v
    return parse


def _info_version(stdout: str) -> str | None:
    """`gcloud info --format=json`'s SDK version (its "basic" section's)."""
    try:
        v = (json.loads(stdout).get("basic") or {}).get("version")
    except (ValueError, AttributeError):
        return None
    return v if isinstance(v, str) and re.fullmatch(r"[\d.]+", v) else None


# gcloud's version and its SDK's folder (the parse check's) are one `gcloud
# info` (its "basic" section's version is the SDK's, as `gcloud version`
# says it): one process where there were two.
GCLOUD_INFO = ("gcloud", "info", "--format=json")

TOOLS: dict[str, tuple[tuple[str, ...], str | Callable[[str], str | None], bool]] = {
    # name: (argv, version pattern or reader, needed only where the cluster is in the cloud)
    "gcloud": (GCLOUD_INFO, _info_version, True),
    "gsutil": (("gsutil", "version"), r"gsutil version:?\s*([\d.]+)", True),
    "kubectl": (("kubectl", "version", "--client", "--output=json"), r'"gitVersion":\s*"v?([^"]+)"', True),
    "gke-gcloud-auth-plugin": (("gke-gcloud-auth-plugin", "--version"), r"([\d]+\.[\d.]+)", True),
    "envsubst": (("envsubst", "--version"), r"envsubst \(GNU gettext-runtime\) ([\d.]+)", True),
    "ray": (("ray", "--version"), r"ray, version ([\w.]+)", False),
}


def tool_step(env: Environment, name: str) -> Step:
    argv, pattern, cloud_only = TOOLS[name]
    if cloud_only and not env.platform.cloud:
        return skipped(PLAY, name, "not used by a local environment", id=f"doctor:{name}")
    probe = fact(f"{name} version", Command(argv), _version(pattern), assumed="?")

    def decide(look):
        v = look(probe)
        if v is ABSENT:
            return fail(f"{name} is not installed (or not on PATH)")
        if name == "ray" and v not in ("?", ray_version()):
            return fail(f"ray {v} on PATH, but requirements.lock pins {ray_version()}: run scripts/bootstrap")
        return ok(f"{name} {v}")

    return Step(PLAY, name, decide, id=f"doctor:{name}")


def maxtext_step() -> Step:
    """MaxText on this machine, whatever the connector: the AOT preflight
    compiles here (its commands run here, ``Command.here``)."""
    def decide(look):
        v, pin = installed("maxtext"), pinned("maxtext")
        if v == "not installed":
            return fail("maxtext is not installed in this Python: run scripts/bootstrap")
        if pin and v != pin:
            return fail(f"maxtext {v} installed, requirements.lock pins {pin}: run scripts/bootstrap")
        return ok(f"maxtext {v}, jax {installed('jax')}, libtpu {installed('libtpu')} on this machine (the "
                  f"preflight compiles here)")

    return Step(PLAY, "maxtext", decide, id="doctor:maxtext")


def _sdk_root(c: Completed) -> str:
    info = json_object("gcloud info")(c)
    root = (info.get("installation") or {}).get("sdk_root") if isinstance(info, dict) else None
    if not isinstance(root, str) or not root:
        raise ProbeFailed("gcloud info", c.line, c.rc, c.stdout, c.stderr, why="no installation.sdk_root in it")
    return root


# The gcloud in use where the commands run: its SDK holds the Python and the
# parser that gcloud_parse.py loads.
SDK_ROOT = fact("gcloud's SDK", Command(GCLOUD_INFO), _sdk_root, assumed="/usr/lib/google-cloud-sdk")
PARSER = "playbooks/access/gcloud_parse.py"  # synced to a controller with manifests/ and trainer/


def gcloud_lines(env: Environment) -> list[list[str]]:
    """The gcloud argv (without "gcloud") of every command of the plan,
    placeholders given sample values."""
    out = []
    for c in task_steps.all_commands(env):
        if c.argv and c.argv[0] == "gcloud":
            out.append([PLACEHOLDER.sub("123456789", a) for a in c.argv[1:]])
    return out


def parse_command(root: str, lines: list[list[str]]) -> Command:
    """gcloud's bundled Python runs the parser, the lines fed on its stdin
    (`printf '%s\\n' <json lines> | ...`): nothing is written anywhere."""
    feed = Command(("printf", "%s\\n", *(json.dumps(line) for line in lines)))
    return Command((f"{root}/platform/bundledpythonunix/bin/python3", PARSER, root), pipe_from=feed)


def parse_results(c: Completed) -> list[dict]:
    if not c.ok:
        raise ProbeFailed("gcloud parse", c.line, c.rc, c.stdout, c.stderr,
                          why=f"gcloud's parser could not run: {c.first_error_line()}")
    return [json.loads(line) for line in c.stdout.splitlines() if line.strip()]


def cli_parse_fact(argv: list[str]):
    """The CLI's own verdict: exit code 2 is a parse error."""
    def parse(c: Completed) -> dict:
        first = c.first_error_line()
        return {"argv": argv, "ok": c.rc != 2, "error": first if c.rc == 2 else ""}
    env = (("CLOUDSDK_CORE_DISABLE_PROMPTS", "1"),)
    return fact("gcloud CLI parse", Command(("gcloud", *argv), env=env), parse,
                assumed={"argv": argv, "ok": True, "error": ""})


def parse_step(env: Environment) -> Step:
    if env.platform.simulated:
        return skipped(PLAY, "gcloud commands parse", "a local environment runs no gcloud command", id="doctor:parse")
    lines = gcloud_lines(env)

    def decide(look):
        root = look(SDK_ROOT)
        canaries = [{"argv": GOOD, "ok": True, "error": ""}, {"argv": BAD, "ok": False, "error": "(assumed)"}]
        results = look(fact("gcloud parse", parse_command(root, [GOOD, BAD, *lines]), parse_results,
                            assumed=canaries + [{"argv": line, "ok": True, "error": ""} for line in lines],
                            describe=lambda rs: f"{len(rs)} line(s) parsed"))
        good, bad, rest = results[0], results[1], results[2:]
        if not good["ok"] or bad["ok"] or len(rest) != len(lines):
            # The parser relies on gcloud internals: a canary answered wrong,
            # so each line goes through the gcloud CLI itself.
            rest = [look(cli_parse_fact(line)) for line in lines]
        rejected = [r for r in rest if not r["ok"]]
        if rejected:
            return fail(f"{len(rejected)} of {len(lines)} gcloud command lines do not parse with this gcloud:\n"
                        + "\n".join(f"  gcloud {' '.join(r['argv'])}\n    {r['error']}" for r in rejected))
        return ok(f"all {len(lines)} gcloud command lines of the plan parse with this gcloud")

    return Step(PLAY, "gcloud commands parse", decide, id="doctor:parse", after=("doctor:gcloud",))


# -- what will stop a run: credentials, the project, the cluster's context --------
def credentials_fact() -> Fact:
    """gcloud's configuration, where the commands run (a local read: no API)."""
    return fact("gcloud credentials", gcloud("config", "list", "--format=json"), json_object(),
                assumed={"core": {"account": "${ACCOUNT}"}},
                describe=lambda c: ((c.get("core") or {}).get("account") or
                                    ("an access token file" if (c.get("auth") or {}).get("access_token_file")
                                     else "no account")))


def credentials(cfg: dict) -> str | None:
    """What gcloud authenticates with (its active account, an access token
    file), or None: then every gcloud command fails."""
    account = (cfg.get("core") or {}).get("account")
    token_file = (cfg.get("auth") or {}).get("access_token_file")
    if account:
        return f"gcloud account {account}"
    if token_file:
        return f"gcloud authenticates with the access token in {token_file}"
    return None


def account_step(env: Environment) -> Step:
    probe = credentials_fact()

    def decide(look):
        who = credentials(look(probe))
        if who:
            return ok(who)
        return fail("gcloud has no active account: run `gcloud auth login` (every gcloud command would fail)")

    if env.platform.simulated:
        return skipped(PLAY, "gcloud account", "a local environment runs no gcloud command", id="doctor:account")
    return Step(PLAY, "gcloud account", decide, id="doctor:account")


class NoAccount(Exception):
    """gcloud refused a read for want of an account: the one line of its
    stderr that says so (the fix is the account step's to say, once)."""


def gcloud_look(look: Callable[[Fact], Any], probe: Fact) -> Any:
    """``look(probe)``; a refusal for want of an account (gcloud's
    NO_ACCOUNT_WORDS) raises ``NoAccount`` with that one line of its
    stderr, where "could not look" would repeat the whole of it (`gcloud
    auth login` among it) after the account step named the fix."""
    try:
        return look(probe)
    except ProbeFailed as e:
        if NO_ACCOUNT_WORDS not in f"{e.why} {e.stderr}":
            raise
        said = next((ln.strip() for ln in f"{e.stderr}\n{e.why}".splitlines() if NO_ACCOUNT_WORDS in ln), "")
        raise NoAccount(said) from None


def no_account(e: NoAccount) -> str:
    return f"not checked: gcloud has no account (`doctor : gcloud account` says the fix); gcloud: {e}"


def project_step(env: Environment) -> Step:
    if env.platform.simulated:
        return skipped(PLAY, "project access", "a local environment uses no project", id="doctor:project")
    probe = fact(f"project {env.project_id}",
                 gcloud("projects", "describe", env.project_id, "--format=value(projectId)"), text_value(),
                 assumed=env.project_id)

    def decide(look):
        try:
            return ok(f"project {gcloud_look(look, probe)} is readable with these credentials")
        except NoAccount as e:
            return fail(no_account(e))

    return Step(PLAY, f"project {env.project_id}", decide, id="doctor:project", after=("doctor:account",))


def context_step(env: Environment) -> Step:
    if env.platform.simulated:
        return skipped(PLAY, "kubectl context", "a local environment has no Kubernetes cluster", id="doctor:context")
    clusters, kubeconfig = clusters_fact(env), kubeconfig_fact(env)
    name = kube_context(env)
    server = fact("Kubernetes API", kube(env, "version", "--output=json"), json_object(),
                  describe=lambda v: f"server {(v.get('serverVersion') or {}).get('gitVersion', '?')}")

    def decide(look):
        try:
            made = gcloud_look(look, clusters)
        except NoAccount as e:
            return fail(no_account(e))
        if made is ABSENT:
            return ok(f"cluster {env.cluster_name} does not exist yet: no context to check (`invoke cluster` "
                      f"makes both)")
        if not has_context(look(kubeconfig), name):
            return fail(f"cluster {env.cluster_name} exists, but the kubeconfig has no context {name}: run "
                        f"`invoke cluster` (gcloud container clusters get-credentials)")
        v = look(server)
        return ok(f"context {name} reaches Kubernetes {(v.get('serverVersion') or {}).get('gitVersion', '?')}")

    return Step(PLAY, f"kubectl context {kube_context(env)}", decide, id="doctor:context",
                after=("doctor:project",))


def steps(env: Environment) -> list[Step]:
    return ([tool_step(env, n) for n in TOOLS] + [maxtext_step(), account_step(env), project_step(env),
                                                  context_step(env), parse_step(env)])
