"""Against an inventory the goldens never saw: every command of the tutorial
appears in the dry run, with this inventory's values, to the flag (our only
additions: --project=, --quiet on deletes, kubectl's --context=; the jobs'
two settings, CACHE below)."""
import pytest
import yaml

from tests.goldens import dry_run

P, R, Z, C, B, K, NS, U = ("acme-ml-prod", "europe-west4", "europe-west4-a", "llm-train", "acme-llm-ckpt",
                           "trainer-sa", "ml", "ops@acme.io")
CTX = f"--context=gke_{P}_{Z}_{C}"
# gcloud compute runs with debug verbosity: its log is where it shows a failed call's HTTP status.
D = "CLOUDSDK_CORE_VERBOSITY=debug "
ENV = {"kind": "gke", "mode": "standard", "project_id": P, "region": R, "zone": Z, "cluster_name": C,
       "cluster_version": "1.35.2-gke.1842000", "gs_bucket": B, "ksa_name": K, "namespace": NS,
       "user_identifier": U, "slices": 3}


@pytest.fixture(scope="module")
def transcripts(tmp_path_factory):
    d = tmp_path_factory.mktemp("inv")
    inv = d / "inventory.yaml"
    # Same project and region: its own subnets and dashboard port (no two environments own one thing).
    auto = {**ENV, "mode": "autopilot", "cluster_name": "llm-auto", "gs_bucket": "acme-llm-auto",
            "dashboard_port": 8266}
    inv.write_text(yaml.safe_dump({"default": "acme", "environments": {"acme": ENV, "acme-auto": auto}}))
    out = {}
    for name, args in {"up": ["up"], "train": ["train"], "train70": ["train", "--model=llama3-70b", "--skip-preflight"],
                       "elastic": ["train", "--elastic", "--steps=50"], "chaos": ["chaos.delete-worker"],
                       "teardown": ["teardown"], "teardown-all": ["teardown", "--delete-bucket"]}.items():
        rc, text, err = dry_run("acme", args, inventory=inv)
        assert rc == 0 and "PROCESSES STARTED" not in err, err
        out[name] = text
    # The tutorial's 70B job splits FSDP over 2 slices: on 3, the preflight refuses it.
    rc, out["train70-3"], err = dry_run("acme", ["train", "--model=llama3-70b"], inventory=inv)
    assert rc == 1, out["train70-3"]
    rc, out["auto"], err = dry_run("acme-auto", ["up"], inventory=inv)
    assert rc == 0, err
    rc, out["auto-teardown"], err = dry_run("acme-auto", ["teardown"], inventory=inv)
    assert rc == 0, err
    return out


def lines(text):
    """The dry run's apply lines, without the mark of a command answered in-process (a comment)."""
    return [ln.split("apply  ", 1)[1].split("  # in-process: ")[0] for ln in text.splitlines()
            if ln.startswith("  apply")]


def test_provisioning_commands(transcripts):
    up = lines(transcripts["up"])
    expected = [
        # the tutorial's two APIs, and the Cloud Billing API the prices are read from (no `prices:` here)
        f"gcloud services enable container.googleapis.com cloudbuild.googleapis.com cloudbilling.googleapis.com "
        f"--project={P}",
        *[f"gcloud projects add-iam-policy-binding {P} --member=user:{U} --role={r}"
          for r in ("roles/container.admin", "roles/iam.serviceAccountAdmin", "roles/cloudbuild.builds.editor")],
        f"{D}gcloud compute networks create {C}-net-1 --subnet-mode=custom --mtu=8896 --project={P}",
        f"{D}gcloud compute networks create {C}-net-2 --subnet-mode=custom --mtu=8896 --project={P}",
        f"{D}gcloud compute networks subnets create tpu-subnet-1 --network={C}-net-1 --region={R} --range=10.50.0.0/16 --project={P}",
        f"{D}gcloud compute networks subnets create tpu-subnet-2 --network={C}-net-2 --region={R} --range=10.60.0.0/16 --project={P}",
        f"gcloud container clusters create {C} --addons=RayOperator,GcsFuseCsiDriver --machine-type=n1-standard-16 "
        f"--enable-dataplane-v2 --workload-pool={P}.svc.id.goog --location={Z} --cluster-version=1.35.2-gke.1842000 --project={P}",
        f"gcloud container clusters get-credentials {C} --location={Z} --project={P}",
        *[f"gcloud container node-pools create v6e-16-{i} --location={Z} --cluster={C} --machine-type=ct6e-standard-4t "
          f"--threads-per-core=1 --tpu-topology=4x4 --num-nodes=4 "
          f"--additional-node-network=network={C}-net-1,subnetwork=tpu-subnet-1 "
          f"--additional-node-network=network={C}-net-2,subnetwork=tpu-subnet-2 "
          # the tutorial's DRANET label, and ours naming the pool's capacity option
          f"--node-labels=cloud.google.com/gke-networking-dra-driver=true,tpu-playbooks/capacity=on-demand --enable-gvnic "
          f"--scopes=https://www.googleapis.com/auth/cloud-platform --project={P}" for i in range(3)],
        f"gsutil mb -p {P} -c STANDARD -l {R} gs://{B}",
        f"kubectl create namespace {NS} {CTX}",
        f"kubectl create serviceaccount {K} --namespace {NS} {CTX}",
        f"gcloud storage buckets add-iam-policy-binding gs://{B} --member \"principal://iam.googleapis.com/projects/"
        f"${{PROJECT_NUMBER}}/locations/global/workloadIdentityPools/{P}.svc.id.goog/subject/ns/{NS}/sa/{K}\" "
        f"--role roles/storage.objectUser",
    ]
    for e in expected:
        assert e in up, f"missing: {e}"
    assert f"PROJECT_NUMBER=$(gcloud projects describe {P} '--format=value(projectNumber)')" in transcripts["up"]
    apply = [ln for ln in up if "kubectl apply -f -" in ln]
    assert len(apply) == 1
    assert apply[0].endswith(f"< manifests/ray-cluster.tpu-multi-slice.yaml | kubectl apply -f - {CTX}")
    for v in (f"KSA_NAME={K}", f"GS_BUCKET={B}", "SLICES=3", "HOSTS_PER_SLICE=4", "CHIPS_PER_HOST=4",
              "\"cloud.google.com/gke-tpu-topology\": \"4x4\"", f"NAMESPACE={NS}"):
        assert v in apply[0]
    assert f"kubectl port-forward svc/maxtext-tpu-cluster-head-svc 8265:8265 --namespace {NS} {CTX}" in\
           transcripts["up"]
    # the tutorial's `ray list nodes`, read from the State API endpoint it calls
    assert ("curl -fsS 'http://localhost:8265/api/v0/nodes?limit=10000&detail=true'  "
            "# what `ray list nodes --address http://localhost:8265` reads") in transcripts["up"]
    assert "would check: 1 head + 12 TPU workers" in transcripts["up"]


def test_autopilot_cluster_command(transcripts):
    up = lines(transcripts["auto"])
    assert (f"gcloud container clusters create-auto llm-auto --enable-ray-operator --location={R} "
            f"--cluster-version=1.35.2-gke.1842000 --project={P}") in up
    assert f"gcloud container clusters get-credentials llm-auto --location={R} --project={P}" in up
    assert not any("node-pools create" in ln for ln in up)
    assert "skipped: [nodepools : TPU node pools] Autopilot has no node pools" in transcripts["auto"]
    # No VPC of ours (GKE makes the networks: the ComputeClass's profile auto), in up or teardown.
    assert not any("compute networks" in ln for ln in up + lines(transcripts["auto-teardown"]))
    assert "skipped: [network : DCN networks] Autopilot: GKE makes and manages" in transcripts["auto"]
    # The ComputeClass with DRA networking, applied before the RayCluster, which selects it; no privileged.
    [i] = [n for n, ln in enumerate(up) if "< manifests/compute-class.tpu-dranet.yaml" in ln]
    [j] = [n for n, ln in enumerate(up) if "< manifests/ray-cluster.tpu-multi-slice.yaml" in ln]
    assert i < j
    assert "PRIORITIES='[{\"machineType\": \"ct6e-standard-4t\", \"acceleratorNetworkProfile\": \"auto\"}]'" in up[i]
    assert "WORKER_SECURITY_CONTEXT='{\"capabilities\": {\"add\": [\"SYS_PTRACE\"]}}'" in up[j] and "\"cloud.google.com/compute-class\": \"maxtext-tpu-dranet\"" in up[j]
    assert "NETDEV_CLAIM=all-netdev" in up[j]
    assert "ok: [raycluster : Autopilot's rules]" in transcripts["auto"]


def _submit(text):
    s = [ln for ln in lines(text) if ln.startswith("ray job submit")]
    assert len(s) == 1
    head, job = s[0].split(" -- ", 1)
    assert head.startswith("ray job submit --address http://localhost:8265 --working-dir trainer "
                           "--runtime-env-json '{\"excludes\": [\"ray-env\", \".git\"], ")
    return job


# The two settings added to the tutorial's jobs: a checkpoint saved when the
# job is told it will stop (SIGTERM: a preemption, a pod deleted, the elastic
# trainer's save before a resize), and the persistent compilation cache in
# the bucket (a restarted job loads what it compiled).
CACHE = f" enable_autocheckpoint=true jax_cache_dir=gs://{B}/jax_cache"


# The checkpoint period chosen (job/save_plan.py), not MaxText's 10,000:
# the estimated optimum, held at the job's steps.
PERIOD = " checkpoint_period={}"


def test_training_jobs_are_the_tutorials(transcripts):
    assert _submit(transcripts["train"]) == (
        "python maxtext_multi_slice_trainer.py base.yml base_output_directory=/data/ dataset_type=synthetic "
        "per_device_batch_size=4 max_target_length=4096 model_name=llama3-8b steps=100 ici_fsdp_parallelism=4 "
        "ici_tensor_parallelism=4 run_name=rayjob-multi-slice" + CACHE + PERIOD.format(100))
    assert _submit(transcripts["train70"]) == (
        "python maxtext_multi_slice_trainer.py base.yml base_output_directory=/data/ dataset_type=synthetic "
        "per_device_batch_size=2 max_target_length=4096 model_name=llama3-70b steps=100 ici_tensor_parallelism=4 "
        "ici_fsdp_parallelism=4 dcn_fsdp_parallelism=2 dcn_data_parallelism=1 remat_policy=full "
        "run_name=rayjob-multi-slice-70b-fsdp" + CACHE + PERIOD.format(100))
    assert _submit(transcripts["elastic"]) == (
        "python maxtext_elastic_trainer.py base.yml base_output_directory=/data/ dataset_type=synthetic "
        "per_device_batch_size=4 max_target_length=4096 model_name=llama3-8b steps=50 ici_fsdp_parallelism=4 "
        "ici_tensor_parallelism=4 run_name=rayjob-elastic-8b" + CACHE + PERIOD.format(50))
    assert '"TRAINER_SLICES": "3"' in transcripts["train"]
    assert "compile_topology=v6e-16 compile_topology_num_slices=3" in transcripts["train"]
    assert "skipped: [preflight : preflight] --skip-preflight: no static checks" in transcripts["train70"]
    assert ("DCN parallelism (across slices, 3 slices): dcn_fsdp_parallelism=2 = 2, but there are 3"
            in transcripts["train70-3"]) and "ray job submit" not in transcripts["train70-3"]


def test_maintenance_is_held_off_for_the_run_and_released(transcripts):
    """Before the submit, the run's exclusion (no node or minor upgrades, 7
    days); after the job, and at teardown, its removal."""
    update = f"gcloud container clusters update {C} --location={Z} "
    hold = (update + "--add-maintenance-exclusion-name=playbooks-train-rayjob-elastic-8b "
            "--add-maintenance-exclusion-start=P0D --add-maintenance-exclusion-end=P7D "
            f"--add-maintenance-exclusion-scope=no_minor_or_node_upgrades --project={P} --quiet")
    release = update + f"--remove-maintenance-exclusion=playbooks-train-rayjob-elastic-8b --project={P} --quiet"
    elastic = lines(transcripts["elastic"])
    submit = next(i for i, ln in enumerate(elastic) if ln.startswith("ray job submit"))
    assert elastic.index(hold) < submit < elastic.index(release)
    assert (update + f"--remove-maintenance-exclusion=playbooks-train-rayjob-multi-slice --project={P} --quiet"
            in lines(transcripts["teardown"]))


def test_chaos_is_the_tutorials_find_then_delete(transcripts):
    t = transcripts["chaos"]
    assert (f"POD=$(kubectl get pods -l ray.io/node-type=worker --namespace {NS} "
            f"-o 'jsonpath={{.items[0].metadata.name}}' {CTX})") in t
    # bounded (plays: cloud/pod_delete.py; docs/tutorial-differences.md)
    assert f'kubectl delete pod "${{POD}}" --namespace {NS} --timeout=90s {CTX}' in lines(t)


def test_teardown_deletes_in_dependency_order(transcripts):
    """The bucket only with --delete-bucket (kept without it: tests/test_bill_stop.py)."""
    got = lines(transcripts["teardown-all"])
    expected = [
        f"kubectl delete raycluster maxtext-tpu-cluster --namespace {NS} {CTX}",
        "kill -TERM $(cat .state/acme/port-forward.pid)",
        # the runs' maintenance exclusions, once their jobs went with the RayCluster
        f"gcloud container clusters update {C} --location={Z} --remove-maintenance-exclusion="
        f"playbooks-train-rayjob-multi-slice --project={P} --quiet",
        f"gcloud container clusters delete {C} --zone={Z} --project={P} --quiet",
        f"gsutil rm -r gs://{B}",
        f"{D}gcloud compute networks subnets delete tpu-subnet-1 --region={R} --project={P} --quiet",
        f"{D}gcloud compute networks subnets delete tpu-subnet-2 --region={R} --project={P} --quiet",
        f"{D}gcloud compute networks delete {C}-net-1 --project={P} --quiet",
        f"{D}gcloud compute networks delete {C}-net-2 --project={P} --quiet",
    ]
    assert got == expected
    assert lines(transcripts["teardown"]) == [ln for ln in expected if not ln.startswith("gsutil rm")]
    assert f"gcloud container clusters delete llm-auto --location={R} --project={P} --quiet" in\
           lines(transcripts["auto-teardown"])
