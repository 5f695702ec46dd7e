"""The RayCluster manifest: rendered with each environment's values, it
validates against KubeRay's RayCluster CRD schema (v1.7.0) and Kubernetes'
resource.k8s.io/v1 schema; rendering never lets a variable go missing."""
import functools
import shutil
import subprocess

import jsonschema
import pytest
import yaml

from playbooks.cloud import manifests
from playbooks.config import tutorial as T
from playbooks.core.errors import InputError
from playbooks.core.render import check_values, envsubst, leftover, render, variables
from tests.conftest import ROOT, env

CRD = ROOT.parent / "shared" / "kuberay" / "ray.io_rayclusters.v1.7.0.yaml"
MANIFEST = (ROOT / T.RAYCLUSTER_MANIFEST).read_text()


@functools.cache
def crd_validator() -> jsonschema.protocols.Validator:
    """KubeRay's RayCluster v1 schema, loaded and checked once for the
    module (the CRD is 0.9 MB: ~1.5 s to parse in pure Python and ~1.3 s to
    check as a schema, each time jsonschema.validate is called)."""
    if not CRD.exists():
        pytest.skip(f"KubeRay CRD not found at {CRD} (the workspace's shared/kuberay folder)")
    crd = yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def docs(e):
    return list(yaml.safe_load_all(render(MANIFEST, manifests.raycluster_values(e))))


LISTED = {"capacity": ["reservation", "flex-start", "spot", "on-demand"], "reservation": "zeta-resv",
          "capacity_wait": 600}


@pytest.mark.parametrize("name,changes", [("dev", {}), ("dev-autopilot", {}), ("dev", LISTED),
                                          ("dev-autopilot", LISTED)], ids=["dev", "dev-autopilot", "dev-list",
                                                                           "dev-autopilot-list"])
def test_raycluster_validates_against_kuberays_crd(name, changes):
    validator = crd_validator()
    e = env(name, **changes)
    rc = next(d for d in docs(e) if d["kind"] == "RayCluster")
    validator.validate(rc)  # raises with the path of what is wrong
    # One TPU worker group for every slice, whatever option made its pool.
    [group] = rc["spec"]["workerGroupSpecs"]
    assert (group["replicas"], group["numOfHosts"]) == (e.slices, e.hosts_per_slice)
    worker = group["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["google.com/tpu"] == str(e.chips_per_host)
    envs = {x["name"]: x["value"] for x in worker["env"]}
    assert envs["MEGASCALE_NUM_SLICES"] == str(e.slices)
    claim = {"standard": "two-netdev", "autopilot": "all-netdev"}[e.mode]
    assert group["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == claim
    # The tutorial's privileged worker on Standard; on Autopilot, whose policy
    # denies it, SYS_PTRACE alone (py-spy reads a worker's stack with it).
    assert worker["securityContext"] == ({"privileged": True} if e.mode == "standard" else
                                         {"capabilities": {"add": ["SYS_PTRACE"]}})
    # The head serves the workers' stacks (the hang diagnosis reads them).
    [head] = rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    assert {"name": "RAY_DASHBOARD_ENABLE_PROFILING", "value": "1"} in head["env"]
    sel = group["template"]["spec"]["nodeSelector"]
    assert sel["cloud.google.com/gke-tpu-topology"] == e.topology
    assert ("cloud.google.com/compute-class" in sel) == (e.mode == "autopilot")
    affinity = group["template"]["spec"]["affinity"]
    if e.mode == "autopilot":
        assert affinity == {}                           # the ComputeClass's priorities carry the capacity
    else:
        [term] = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term == {"matchExpressions": [{"key": "tpu-playbooks/capacity", "operator": "In",
                                              "values": changes.get("capacity", ["on-demand"])}]}


def node_labels(e, option):
    """A TPU node's labels, as GKE sets them on a pool made by our create
    command for this option: the command's --node-labels, and GKE's own."""
    from playbooks.plays import nodepools
    argv = nodepools.create_command(e, "v6e-16-0", option).argv
    [given] = [a.split("=", 1)[1] for a in argv if a.startswith("--node-labels=")]
    labels = dict(kv.split("=", 1) for kv in given.split(","))
    labels.update({"cloud.google.com/gke-nodepool": "v6e-16-0", "iam.gke.io/gke-metadata-server-enabled": "true",
                   "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                   "cloud.google.com/gke-tpu-topology": e.topology})
    if option == "spot":
        labels["cloud.google.com/gke-spot"] = "true"
    if option == "flex-start":
        labels["cloud.google.com/gke-flex-start"] = "true"
    return labels


def schedules(spec, labels):
    """Kubernetes' rule: every nodeSelector label, and one of the required
    node affinity's terms (each of its expressions)."""
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    ops = {"In": lambda v, vs: v in vs, "NotIn": lambda v, vs: v not in vs}
    return any(all(ops[x["operator"]](labels.get(x["key"]), x["values"]) for x in t["matchExpressions"])
               for t in required["nodeSelectorTerms"])


@pytest.mark.parametrize("listed", [["reservation", "spot"], ["spot", "on-demand"], ["flex-start"], ["on-demand"],
                                    ["reservation", "flex-start", "spot", "on-demand"]])
def test_the_tpu_workers_schedule_on_the_pools_of_every_option_of_the_list_and_no_other(listed):
    """The plan may give each slice another option, and a failed create moves
    a slice to the next: the one worker group must land on a pool of any
    option of the list, and on nothing else of that shape."""
    extra = {"reservation": "zeta-resv"} if "reservation" in listed else {}
    e = env("dev", capacity=listed, **extra)
    rc = next(d for d in docs(e) if d["kind"] == "RayCluster")
    spec = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    for option in ("on-demand", "spot", "reservation", "flex-start"):
        assert schedules(spec, node_labels(env("dev", capacity=option, reservation="zeta-resv")
                                           if option == "reservation" else env("dev", capacity=option), option)) \
            == (option in listed), option
    # ... and the rule reads a nodeSelector that does not match as not scheduling.
    assert not schedules(spec, {**node_labels(e, listed[0]), "cloud.google.com/gke-tpu-topology": "2x4"})


def test_a_broken_raycluster_is_caught_by_the_schema():
    validator = crd_validator()
    rc = next(d for d in docs(env("dev")) if d["kind"] == "RayCluster")
    validator.validate(rc)
    rc["spec"]["workerGroupSpecs"][0]["numOfHosts"] = "four"
    with pytest.raises(jsonschema.ValidationError, match="'four' is not of type 'integer'"):
        validator.validate(rc)


def test_resource_claim_template_validates_against_kubernetes_1_35():
    import kubernetes_validate

    rct = next(d for d in docs(env("dev")) if d["kind"] == "ResourceClaimTemplate")
    kubernetes_validate.validate(rct, "1.35.0", strict=True)
    bad = yaml.safe_load(yaml.safe_dump(rct))
    bad["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.35.0", strict=True)
    bad = yaml.safe_load(yaml.safe_dump(rct))
    bad["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClass"] = "netdev.google.com"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.35.0", strict=True)


def test_variables_are_exactly_the_ones_given():
    assert set(variables(MANIFEST)) == set(manifests.raycluster_values(env("dev")))
    values = manifests.raycluster_values(env("dev"))
    with pytest.raises(InputError, match=r"variable \$\{GS_BUCKET\} has no value"):
        check_values("m.yaml", MANIFEST, {k: v for k, v in values.items() if k != "GS_BUCKET"})
    with pytest.raises(InputError, match=r"variable \$\{KSA_NAME\} is empty"):
        check_values("m.yaml", MANIFEST, {**values, "KSA_NAME": ""})
    with pytest.raises(InputError, match="the template does not use EXTRA"):
        check_values("m.yaml", MANIFEST, {**values, "EXTRA": "x"})


def test_leftover_placeholders_are_refused():
    assert leftover("a: 1\n# ${COMMENT} is fine\n") is None
    assert leftover("a: ${B}\n") == "rendered manifest still holds ${B} on line 1: refusing to apply it"


@pytest.mark.skipif(not shutil.which("envsubst"), reason="envsubst not installed")
def test_real_envsubst_renders_what_python_renders(tmp_path):
    values = manifests.raycluster_values(env("dev"))
    cmd = envsubst(T.RAYCLUSTER_MANIFEST, values, root=ROOT)
    r = subprocess.run(list(cmd.argv), input=MANIFEST, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", **dict(cmd.env)})
    assert r.returncode == 0
    assert r.stdout == render(MANIFEST, values)
    # envsubst alone, unrestricted and with a variable unset, would have
    # silently emptied it: the restricted form plus the checks prevent that.
    r = subprocess.run(["envsubst"], input="x: ${NOT_SET}\n", capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert r.stdout == "x: \n"


def test_apply_pipeline_refuses_leftovers_before_kubectl(tmp_path):
    """The runner checks envsubst's output before kubectl sees it."""
    from playbooks.core.command import Command
    from playbooks.core.connector import LocalConnector
    from playbooks.core.runner import Runner
    src = tmp_path / "m.yaml"
    src.write_text("a: ${A}\nb: ${B}\n")
    render_cmd = Command(("envsubst", "${A}"), env=(("A", "1"),), stdin_file=str(src))
    marker = tmp_path / "kubectl-ran"
    apply = Command(("sh", "-c", f"cat > {marker}"), pipe_from=render_cmd, pipe_check=leftover)
    c = Runner(connector=LocalConnector(str(tmp_path)))._run(apply)
    assert c.rc == 3 and "still holds ${B} on line 2" in c.stderr
    assert not marker.exists()


@pytest.mark.parametrize("capacity, field, value", [
    ("on-demand", None, None),
    ("spot", "spot", True),
    ("flex-start", "flexStart", {"enabled": True}),
    ("reservation", "reservations", {"affinity": "Specific", "specific": [{"name": "v6e-res", "project": "owner-proj"}]}),
])
def test_the_autopilot_compute_class_enables_dranet_and_carries_the_capacity(capacity, field, value):
    extra = {"reservation": "projects/owner-proj/reservations/v6e-res"} if capacity == "reservation" else {}
    e = env("dev-autopilot", capacity=capacity, **extra)
    cc = manifests.compute_class_doc(e)
    assert (cc["apiVersion"], cc["kind"], cc["metadata"]["name"]) == ("cloud.google.com/v1", "ComputeClass",
                                                                      manifests.COMPUTE_CLASS)
    assert cc["spec"]["nodePoolAutoCreation"] == {"enabled": True}
    assert cc["spec"]["nodePoolConfig"]["dra"]["networking"]["enabled"] is True
    [p] = cc["spec"]["priorities"]
    assert (p["machineType"], p["acceleratorNetworkProfile"]) == ("ct6e-standard-4t", "auto")
    assert set(p) - {"machineType", "acceleratorNetworkProfile"} == ({field} if field else set())
    if field:
        assert p[field] == value
    rc = next(d for d in docs(e) if d["kind"] == "RayCluster")
    sel = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"]
    assert sel["cloud.google.com/compute-class"] == manifests.COMPUTE_CLASS
    assert "cloud.google.com/gke-spot" not in sel   # the capacity rides on the ComputeClass


def test_the_autopilot_compute_class_tries_the_capacity_list_in_its_order():
    e = env("dev-autopilot", capacity=["reservation", "spot", "on-demand"],
            reservation="projects/owner-proj/reservations/v6e-res")
    prios = manifests.compute_class_doc(e)["spec"]["priorities"]
    assert [{k: v for k, v in p.items() if k not in ("machineType", "acceleratorNetworkProfile")} for p in prios] == [
        {"reservations": {"affinity": "Specific", "specific": [{"name": "v6e-res", "project": "owner-proj"}]}},
        {"spot": True},
        {}]
    assert all((p["machineType"], p["acceleratorNetworkProfile"]) == ("ct6e-standard-4t", "auto") for p in prios)


def test_autopilots_rules_refuse_the_tutorials_worker_and_pass_ours():
    standard = list(docs(env("dev")))
    found = manifests.autopilot_violations(standard)
    assert found == ["RayCluster maxtext-tpu-cluster: workerGroupSpecs[0]: containers[ray-worker].securityContext."
                     "privileged: true is denied on Autopilot (autogke-disallow-privilege)"]
    assert manifests.autopilot_violations(manifests.all_docs(env("dev-autopilot"))) == []
    rc = next(d for d in docs(env("dev-autopilot")) if d["kind"] == "RayCluster")
    spec = rc["spec"]["headGroupSpec"]["template"]["spec"]
    spec["hostNetwork"] = True
    spec["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    worker = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["securityContext"]["capabilities"]["add"] += ["NET_ADMIN"]   # SYS_PTRACE passes, this does not
    assert manifests.autopilot_violations([rc]) == [
        "RayCluster maxtext-tpu-cluster: headGroupSpec: spec.hostNetwork: true is a host namespace, denied on Autopilot",
        "RayCluster maxtext-tpu-cluster: headGroupSpec: volumes[host].hostPath is denied on Autopilot",
        "RayCluster maxtext-tpu-cluster: workerGroupSpecs[0]: containers[ray-worker].securityContext.capabilities.add: "
        "NET_ADMIN is denied on Autopilot (autogke-default-linux-capabilities)"]


def test_the_autopilot_claim_template_validates_against_kubernetes_1_35():
    import kubernetes_validate

    rct = next(d for d in docs(env("dev-autopilot")) if d["kind"] == "ResourceClaimTemplate")
    assert rct["metadata"]["name"] == "all-netdev"
    assert rct["spec"]["spec"]["devices"]["requests"][0]["exactly"] == {"deviceClassName": "netdev.google.com",
                                                                         "allocationMode": "All"}
    kubernetes_validate.validate(rct, "1.35.0", strict=True)


# -- each TPU generation (playbooks/config/tpu.py) ---------------------------------------
def generation_env(name):
    from playbooks.config.schema import load_inventory
    from tests.goldens import GENERATIONS_INVENTORY
    return load_inventory(GENERATIONS_INVENTORY).env(name)


@pytest.mark.parametrize("name,label,claims,memory", [("std-v5e", "tpu-v5-lite-podslice", False, "144G"),
                                                      ("std-v5p", "tpu-v5p-slice", False, "200G"),
                                                      ("std-tpu7x", "tpu7x", True, "200G")])
def test_each_generations_raycluster_validates_and_selects_its_nodes(name, label, claims, memory):
    """The RayCluster of a v5e, v5p and TPU7x environment: KubeRay's CRD
    accepts it, its workers select the generation's accelerator label and
    topology, ask the machine type's chips, and claim DRANET's NICs only
    where GKE's DRANET page lists the machine type (TPU7x's; v5e and v5p:
    the template without them, no ResourceClaimTemplate)."""
    import kubernetes_validate

    e = generation_env(name)
    rendered = manifests.raycluster_docs(e)
    assert [d["kind"] for d in rendered] == ["ResourceClaimTemplate"] * claims + ["RayCluster"]
    rc = rendered[-1]
    if CRD.exists():
        crd_validator().validate(rc)
    [group] = rc["spec"]["workerGroupSpecs"]
    spec = group["template"]["spec"]
    assert ("resourceClaims" in spec) == claims
    sel = spec["nodeSelector"]
    assert (sel["cloud.google.com/gke-tpu-accelerator"], sel["cloud.google.com/gke-tpu-topology"]) == (label, e.topology)
    worker = spec["containers"][0]
    assert worker["resources"]["limits"] == {"memory": memory, "google.com/tpu": "4"}
    assert ("eth1" in str(worker["env"])) == claims  # megascale on the DCN NICs, else on the primary network
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w"}, "spec": spec}
    kubernetes_validate.validate(pod, "1.35.0", strict=True)


def test_the_template_without_dranet_is_the_tutorials_less_its_nic_claims():
    """The two RayCluster templates differ only where DRANET is: the claim
    template, the worker's claims, the megascale interfaces, the memory
    variable (so a change to one cannot silently miss the other)."""
    with_claims = MANIFEST.split("apiVersion: ray.io/v1", 1)[1]
    without = (ROOT / manifests.NO_DRANET_MANIFEST).read_text().split("apiVersion: ray.io/v1", 1)[1]
    expect = (with_claims.replace("        resourceClaims:\n        - name: netdev\n          resourceClaimTemplateName:"
                                  " ${NETDEV_CLAIM}\n", "")
              .replace("            claims:\n            - name: netdev\n", "")
              .replace(" --megascale_grpc_interface_prefixes=eth1,eth2,lo", "")
              .replace("memory: 200G", "memory: ${WORKER_MEMORY}"))
    assert without == expect
    assert set(variables((ROOT / manifests.NO_DRANET_MANIFEST).read_text())) == set(
        manifests.raycluster_values(generation_env("std-v5p")))
