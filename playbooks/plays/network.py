"""§2 Networking for multislice (DCN): two VPCs with MTU 8896, a subnet each."""
from __future__ import annotations

from typing import Any

from playbooks.access.cli_clients import gcloud
from playbooks.cloud.gke import (
    network_id,
    network_name,
    networks_fact,
    subnet_id,
    subnet_name,
    subnet_range,
    subnets_fact,
)
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment
from playbooks.config.tpu import dcn_networks, generation
from playbooks.core.facts import ABSENT
from playbooks.core.step import Step, Verify, change, drift, ok, skipped

PLAY = "network"


def _last(url: Any) -> str:
    return str(url or "").rsplit("/", 1)[-1]


def network_step(env: Environment, i: int) -> Step:
    name = network_name(env, i)
    probe = networks_fact(env, name)

    def decide(look):
        net = look(probe)
        if net is ABSENT:
            return change(gcloud("compute", "networks", "create", name, "--subnet-mode=custom",
                                 f"--mtu={T.NETWORK_MTU}", project=env.project_id), reason="created")
        diffs = []
        if net.get("mtu") != T.NETWORK_MTU:
            diffs.append(f"mtu is {net.get('mtu')}, want {T.NETWORK_MTU}")
        if net.get("autoCreateSubnetworks"):
            diffs.append("subnet mode is auto, want custom")
        if diffs:
            return drift(f"network {name}: " + "; ".join(diffs))
        return ok(f"network {name} exists (mtu {T.NETWORK_MTU}, custom subnets)")

    return Step(PLAY, f"VPC {name}", decide, id=network_id(i),
                verify=Verify(probe, lambda n: None if n is not ABSENT and n.get("mtu") == T.NETWORK_MTU
                              else "network not found" if n is ABSENT else f"mtu is {n.get('mtu')}"))


def subnet_step(env: Environment, i: int) -> Step:
    name, net, rng = subnet_name(env, i), network_name(env, i), subnet_range(env, i)
    probe = subnets_fact(env, name)

    def decide(look):
        sub = look(probe)
        if sub is ABSENT:
            return change(gcloud("compute", "networks", "subnets", "create", name, f"--network={net}",
                                 f"--region={env.region}", f"--range={rng}", project=env.project_id),
                          reason="created")
        diffs = []
        if _last(sub.get("network")) != net:
            diffs.append(f"it is on network {_last(sub.get('network'))!r}, want {net!r}")
        if sub.get("ipCidrRange") != rng:
            diffs.append(f"range is {sub.get('ipCidrRange')}, want {rng}")
        if diffs:
            return drift(f"subnet {name}: " + "; ".join(diffs))
        return ok(f"subnet {name} exists ({rng} on {net})")

    return Step(PLAY, f"subnet {name}", decide, id=subnet_id(i), after=(network_id(i),),
                verify=Verify(probe, lambda s: None if s is not ABSENT and s.get("ipCidrRange") == rng
                              else "subnet not found" if s is ABSENT else f"range is {s.get('ipCidrRange')}"))


AUTOPILOT_SKIP = ("Autopilot: GKE makes and manages the TPU nodes' extra networks itself (the ComputeClass's "
                  "accelerator network profile auto); the tutorial's two VPCs would never be attached")


def no_nics(env: Environment) -> str:
    gen = generation(env)
    return (f"{env.machine_type} ({gen.title}): no DRANET two-netdev setup is documented for it (config/tpu.py "
            f"says why), so its slices reach each other over the VMs' primary network; the tutorial's two VPCs "
            f"would carry nothing")


def steps(env: Environment) -> list[Step]:
    if not env.cluster_mode.our_networks:
        return [skipped(PLAY, "DCN networks", AUTOPILOT_SKIP, id="network:autopilot")]
    if not dcn_networks(env):
        return [skipped(PLAY, "DCN networks", no_nics(env), id="network:no-dcn-nics")]
    return [network_step(env, 0), network_step(env, 1), subnet_step(env, 0), subnet_step(env, 1)]
