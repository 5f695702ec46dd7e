"""Every inventory rule: invalid input fails before any command, in one line
naming the environment, the key, the value and the rule."""
import subprocess

import pytest
import yaml

from playbooks.config.schema import load_inventory
from playbooks.core.errors import InputError
from tests.conftest import INVOKE, ROOT

MINIMAL = {  # only the tutorial's variables, lower-cased
    "project_id": "my-proj-1", "region": "us-east5", "zone": "us-east5-b", "cluster_name": "demo",
    "cluster_version": "1.35.2-gke.1842000", "mode": "standard", "gs_bucket": "demo-ckpt",
    "ksa_name": "demo-ksa", "namespace": "default", "user_identifier": "me@example.com",
}


def write(tmp_path, env: dict, name="t"):
    p = tmp_path / "inventory.yaml"
    p.write_text(yaml.safe_dump({"default": name, "environments": {name: env}}))
    return p


def resolve(tmp_path, **changes):
    env = {**MINIMAL, **changes}
    env = {k: v for k, v in env.items() if v is not None}
    return load_inventory(write(tmp_path, env)).env()


def error(tmp_path, **changes) -> str:
    with pytest.raises(InputError) as e:
        resolve(tmp_path, **changes)
    msg = str(e.value)
    assert "\n" not in msg
    assert "environment 't'" in msg
    return msg


def test_minimal_environment_gets_the_tutorials_defaults(tmp_path):
    e = resolve(tmp_path)
    assert (e.kind, e.slices, e.topology, e.machine_type) == ("gke", 2, "4x4", "ct6e-standard-4t")
    assert (e.chips_per_host, e.hosts_per_slice) == (4, 4)
    assert (e.subnet_1_range, e.subnet_2_range) == ("10.50.0.0/16", "10.60.0.0/16")
    assert e.ray_image.startswith("rayproject/ray:2.60.0")
    assert e.hold_maintenance is True        # GKE maintenance held off during runs, unless said otherwise


def test_shipped_inventory_is_valid_with_both_cluster_modes():
    inv = load_inventory()
    modes = {inv.env(n).get("mode") for n in inv.names if inv.env(n).kind == "gke"}
    assert modes == {"standard", "autopilot"}
    assert inv.env().kind == "local"


@pytest.mark.parametrize("changes, words", [
    ({"colour": "blue"}, ["unknown key 'colour'", "allowed:"]),
    ({"zone": None}, ["missing key 'zone'"]),
    ({"cluster_name": "Demo_Cluster"}, ["'cluster_name' = 'Demo_Cluster'", "not a valid GKE cluster name"]),
    ({"cluster_name": "a" * 41}, ["not a valid GKE cluster name"]),
    ({"gs_bucket": "My_Bucket"}, ["'gs_bucket' = 'My_Bucket'", "Cloud Storage bucket name"]),
    ({"gs_bucket": "goog-ckpt"}, ["'goog' prefix"]),
    ({"gs_bucket": "192.168.1.1"}, ["not an IP address"]),
    ({"gs_bucket": "gs://demo"}, ["without gs://"]),
    ({"namespace": "Team_A"}, ["'namespace' = 'Team_A'", "DNS-1123 label"]),
    ({"ksa_name": "KSA!"}, ["'ksa_name' = 'KSA!'", "DNS-1123 subdomain"]),
    ({"zone": "us-central1-a"}, ["'zone' = 'us-central1-a'", "outside region 'us-east5'"]),
    ({"zone": "nowhere"}, ["not a zone name"]),
    ({"topology": "2x4"}, ["'topology' = '2x4'", "on machine type 'ct6e-standard-4t' is 2 hosts of 4 chips",
                           "Ray takes every v6e 2x4 for one host of 8 chips"]),
    ({"machine_type": "ct6e-standard-1t", "topology": "4x4"},
     ["'topology' = '4x4'", "cannot be formed by machine type 'ct6e-standard-1t'"]),
    ({"machine_type": "ct6e-standard-8t"}, ["'topology' = '4x4'", "ct6e-standard-8t"]),
    ({"machine_type": "n2-standard-8"}, ["not a GKE TPU machine type"]),
    ({"slices": 0}, ["'slices' = 0", "at least 1"]),
    ({"slices": "two"}, ["'slices' = 'two'", "must be an integer"]),
    ({"subnet_2_range": "10.50.128.0/17"}, ["'subnet_2_range' = '10.50.128.0/17'", "overlaps subnet_1_range"]),
    ({"subnet_1_range": "10.0.0.0/8"}, ["'subnet_2_range' = '10.60.0.0/16'", "overlaps subnet_1_range '10.0.0.0/8'"]),
    ({"subnet_1_range": "10.50.0.1/16"}, ["not a CIDR range"]),
    ({"mode": "serverless"}, ["'mode' = 'serverless'", "standard, autopilot"]),
    ({"cluster_version": "1.33.5-gke.100"}, ["older than 1.34.1-gke.1829001"]),
    ({"mode": "autopilot", "cluster_version": "1.34.1-gke.1829001"}, ["older than 1.35.2-gke.1842000"]),
    ({"project_id": "P"}, ["not a valid project ID"]),
    ({"user_identifier": "me"}, ["not an email address"]),
    ({"kind": "aws"}, ["'kind' = 'aws'", "allowed: gke, local"]),
    ({"hold_maintenance": "yes"}, ["'hold_maintenance' = 'yes'", "must be true or false"]),
    ({"hold_maintenance": 1}, ["'hold_maintenance' = 1", "must be true or false"]),
])
def test_rule(tmp_path, changes, words):
    msg = error(tmp_path, **changes)
    for w in words:
        assert w in msg, msg


def test_a_mutable_default_is_each_environments_own(tmp_path):
    """train_overrides defaults to {}: each environment that omits it gets a
    dict of its own, not the schema's one object."""
    from playbooks.config.schema import GKE

    p = tmp_path / "inventory.yaml"
    p.write_text(yaml.safe_dump({"default": "a", "environments": {
        "a": {**MINIMAL, "cluster_name": "alpha", "gs_bucket": "alpha-ckpt"},
        "b": {**MINIMAL, "cluster_name": "beta", "gs_bucket": "beta-ckpt", "subnet_1_name": "b-1",
              "subnet_2_name": "b-2", "dashboard_port": 8266},
        "c": {"kind": "local", "gcs_port": 6600, "dashboard_port": 8285}}}))
    inv = load_inventory(p)
    a, b, c = inv.env("a"), inv.env("b"), inv.env("c")
    default = next(k for k in GKE if k.name == "train_overrides").default
    assert a.train_overrides == b.train_overrides == c.train_overrides == {} == default
    assert len({id(a.train_overrides), id(b.train_overrides), id(c.train_overrides), id(default)}) == 4
    a.train_overrides["steps"] = 5  # the values are read-only by convention; a slip stays in its environment
    assert b.train_overrides == c.train_overrides == {} == default
    assert load_inventory(p).env("b").train_overrides == {}


def test_an_anchored_value_is_each_environments_own(tmp_path):
    """A YAML anchor hands one dict to every environment that names it."""
    p = tmp_path / "inventory.yaml"
    p.write_text("x-ov: &ov {steps: 5}\ndefault: a\nenvironments:\n"
                 "  a: {kind: local, train_overrides: *ov}\n"
                 "  b: {kind: local, gcs_port: 6600, dashboard_port: 8285, train_overrides: *ov}\n")
    inv = load_inventory(p)
    a, b = inv.env("a"), inv.env("b")
    assert a.train_overrides == b.train_overrides == {"steps": 5}
    assert a.train_overrides is not b.train_overrides


@pytest.mark.parametrize("identifier, member", [
    ("me@example.com", "user:me@example.com"),
    ("trainer@my-proj-1.iam.gserviceaccount.com", "serviceAccount:trainer@my-proj-1.iam.gserviceaccount.com"),
    ("123456789-compute@developer.gserviceaccount.com", "serviceAccount:123456789-compute@developer.gserviceaccount.com"),
    ("my-proj-1@appspot.gserviceaccount.com", "serviceAccount:my-proj-1@appspot.gserviceaccount.com"),
    ("Trainer@My-Proj-1.IAM.GServiceAccount.com", "serviceAccount:Trainer@My-Proj-1.IAM.GServiceAccount.com"),
    ("me@gserviceaccount.com.example.com", "user:me@gserviceaccount.com.example.com"),
    ("me@notgserviceaccount.com", "user:me@notgserviceaccount.com"),
    ("gserviceaccount.com@example.com", "user:gserviceaccount.com@example.com"),
])
def test_user_identifier_is_granted_as_the_member_it_names(identifier, member):
    """The tutorial grants its roles with --member=user:$USER_IDENTIFIER; a
    service account is a serviceAccount: member. The command lines, and the
    check that a role is already there, use that member."""
    from playbooks.config import tutorial as T
    from playbooks.core.fixtures import Answers
    from playbooks.plays import prereqs
    from tests.conftest import env, run_with_facts

    assert prereqs.iam_member(identifier) == member
    e = env("dev", user_identifier=identifier)
    granted = {"bindings": [{"role": r, "members": [member]} for r in T.USER_ROLES]}
    wrong = {"bindings": [{"role": r, "members": [("user:" if member.startswith("service") else "serviceAccount:")
                                                  + identifier]} for r in T.USER_ROLES]}
    facts = {"gcloud services list --enabled --format=json --project=my-tpu-project":
             [{"config": {"name": s}, "state": "ENABLED"} for s in prereqs.services(e)],
             "gcloud projects get-iam-policy my-tpu-project --format=json": Answers(wrong, granted)}
    recap, out = run_with_facts(prereqs.steps(e), facts)
    assert recap.counters() == "ok=3 changed=1 failed=0 skipped=0", out.text()
    assert [line.split("apply  ", 1)[1] for line in out if line.startswith("  apply")] == [
        f"gcloud projects add-iam-policy-binding my-tpu-project --member={member} --role={T.USER_ROLES[0]}"]
    assert f"{member} already has {T.USER_ROLES[1]}" in out.text()


def test_unknown_environment_and_bad_file(tmp_path):
    inv = load_inventory(write(tmp_path, MINIMAL))
    with pytest.raises(InputError, match="environment 'prod' is not defined"):
        inv.env("prod")
    bad = tmp_path / "bad.yaml"
    bad.write_text("default: x\nenvironments: [1, 2\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_inventory(bad)
    with pytest.raises(InputError, match="inventory file not found"):
        load_inventory(tmp_path / "missing.yaml")


def test_local_rules(tmp_path):
    p = write(tmp_path, {"kind": "local", "ray_ip": "10.0.0.5"})
    with pytest.raises(InputError, match=r"'ray_ip' = '10\.0\.0\.5' must be a loopback address"):
        load_inventory(p).env()
    p = write(tmp_path, {"kind": "local", "topology": "4x4", "chips_per_host": 3})
    with pytest.raises(InputError, match="'chips_per_host' = 3 must be 1, 4 or 8"):
        load_inventory(p).env()
    p = write(tmp_path, {"kind": "local", "topology": "2x2", "chips_per_host": 8})
    with pytest.raises(InputError, match="'chips_per_host' = 8 does not divide the 4 chips"):
        load_inventory(p).env()
    p = write(tmp_path, {"kind": "local", "project_id": "x"})
    with pytest.raises(InputError, match="unknown key 'project_id' for kind 'local'"):
        load_inventory(p).env()


def test_invoke_reports_one_line_and_exit_2_before_any_command(tmp_path, hermetic):
    p = write(tmp_path, {**MINIMAL, "zone": "europe-west4-a"})
    r = subprocess.run([INVOKE, "network"], cwd=ROOT, capture_output=True, text=True,
                       env={**hermetic, "INVOKE_PLAYBOOK_INVENTORY": str(p), "PATH": "/nonexistent"})
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: {p}: environment 't': key 'zone' = 'europe-west4-a' is outside region 'us-east5' "
        "(a zone is <region>-<letter>)"]
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_bad_task_argument_is_one_line(hermetic):
    r = subprocess.run([INVOKE, "--dry", "train", "--model=llama2-7b"], cwd=ROOT, capture_output=True, text=True,
                       env=hermetic)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: --model 'llama2-7b' is not allowed (allowed: llama3-8b, llama3-70b)"
    r = subprocess.run([INVOKE, "--dry", "train", "--set", "steps"], cwd=ROOT, capture_output=True, text=True,
                       env=hermetic)
    assert r.returncode == 2 and "--set 'steps': must be key=value" in r.stderr


@pytest.mark.parametrize("args, line", [
    (["train", "--steps=abc"], "error: --steps 'abc' must be a whole number >= 1"),
    (["preflight", "--steps=0"], "error: --steps '0' must be a whole number >= 1"),
    (["chaos.delete-worker", "--restore-after=-5"], "error: --restore-after '-5' must be a number of seconds >= 0"),
    (["chaos.delete-worker", "--restore-after=soon"],
     "error: --restore-after 'soon' must be a number of seconds >= 0"),
])
def test_a_number_flag_that_is_not_one_is_one_line_not_a_traceback(hermetic, args, line):
    r = subprocess.run([INVOKE, "--dry", *args], cwd=ROOT, capture_output=True, text=True, env=hermetic)
    assert (r.returncode, r.stdout, r.stderr.strip()) == (2, "", line)


def _plays(args: list[str], environ: dict[str, str]) -> list[str]:
    r = subprocess.run([INVOKE, "--dry", *args], cwd=ROOT, capture_output=True, text=True, env=environ)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    return [line.split(" | ")[1].split(" (")[0] for line in r.stdout.splitlines() if line.startswith("PLAY [")]


def test_env_flag_wins_over_the_variable_and_one_names_the_environment_of_the_whole_chain(hermetic):
    """--env on any task: it wins over INVOKE_PLAYBOOK_ENV; given on one task
    of a chain, every task of the chain acts on that environment (a chain
    whose tasks name two is refused: tests/data/bad_inputs.yaml)."""
    assert _plays(["status", "--env", "dev"], {**hermetic, "INVOKE_PLAYBOOK_ENV": "local"}) == ["env dev"]
    assert _plays(["network", "--env", "dev", "cluster"], hermetic) == ["env dev", "env dev"]
    assert _plays(["network", "cluster", "--env", "dev-autopilot"], hermetic) == ["env dev-autopilot"] * 2
    assert _plays(["network", "--env", "dev", "cluster", "--env", "dev"], hermetic) == ["env dev", "env dev"]
    assert _plays(["status"], {**hermetic, "INVOKE_PLAYBOOK_ENV": "dev"}) == ["env dev"]
    assert _plays(["status"], hermetic) == ["env local"]


def test_every_task_takes_env():
    """Every task opens a session on an environment: each has --env."""
    import tasks
    names = list(tasks.ns.task_names)
    missing = [n for n in names if "env" not in {a.name for a in tasks.ns[n].get_arguments()}]
    assert len(names) >= 20 and missing == [], missing
