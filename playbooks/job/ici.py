"""The job's ICI parallelism on its slice: the devices of one slice, the
mesh axes a job's settings give, the ICI values the slice's topology takes
when the user set none, and the value that makes a mesh rule hold.

The tutorial's flags (``ici_fsdp_parallelism=4 ici_tensor_parallelism=4``,
``config/tutorial.py``) are for its slice, a v6e-16 (4x4: 16 chips). On a
slice of other devices, and when the user set no ``ici_*_parallelism``
(neither ``--set`` nor the inventory's ``train_overrides``), the job keeps
the tutorial's tensor axis (the largest divisor of the slice's devices not
above it) and puts FSDP over the rest of the slice's devices: on a v5e-64
(8x8), ``ici_fsdp_parallelism=16 ici_tensor_parallelism=4``. A value the
user set is theirs: a product that does not match is refused by the static
checks (``fit.py``), naming the value that does (``matching``).
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from math import gcd

import yaml

from playbooks.config import tutorial as T
from playbooks.config.project import ROOT
from playbooks.config.schema import Environment
from playbooks.config.tpu import chips, generation

FSDP, TENSOR = "ici_fsdp_parallelism", "ici_tensor_parallelism"


@cache
def base() -> dict:
    """trainer/base.yml, read once (callers only read it)."""
    return yaml.safe_load((ROOT / "trainer" / T.BASE_CONFIG).read_text())


def slice_devices(env: Environment) -> int:
    """Devices in one slice: the JAX devices of its TPU chips on GKE (one a
    chip, two on a TPU7x chip: MaxText's devices_per_slice), JAX CPU devices
    locally."""
    if env.platform.simulated:
        return env.hosts_per_slice * env.devices_per_host
    return chips(env.topology) * generation(env).devices_per_chip


def is_axis(key: str, prefix: str = "ici_") -> bool:
    return key.startswith(prefix) and key.endswith("_parallelism")


def axes(args: Mapping[str, str], prefix: str) -> dict[str, int]:
    """Each mesh axis of ``prefix`` (ici_, dcn_) as the job has it: its
    argument, else base.yml's."""
    return {k: int(args.get(k, v)) for k, v in base().items() if is_axis(k, prefix) and isinstance(v, int)}


def product_of(values: Mapping[str, int]) -> int:
    out = 1
    for v in values.values():
        out *= v
    return out


def holds(ici: Mapping[str, int], target: int) -> bool:
    """Whether the axes make ``target``: their product, or one -1 axis
    filling what the others leave."""
    auto = [k for k, v in ici.items() if v == -1]
    fixed = product_of({k: v for k, v in ici.items() if v not in (-1, 1)})
    return fixed == target if not auto else len(auto) == 1 and target % fixed == 0


def user_set(env: Environment, sets: tuple[tuple[str, str], ...]) -> bool:
    """Whether the user set an ICI axis: by --set or in train_overrides."""
    return any(is_axis(k) for k in (*dict(sets), *(env.train_overrides or {})))


def derived(args: Mapping[str, str], devices: int) -> tuple[tuple[str, str], ...]:
    """The ICI settings of a slice of ``devices`` for a job whose ICI axes
    do not make them: the job's tensor axis kept where it divides the
    devices (else their largest common divisor), FSDP over the rest. ()
    where the job's axes already hold."""
    ici = axes(args, "ici_")
    if holds(ici, devices):
        return ()
    tensor = gcd(max(1, ici.get(TENSOR, 1)), devices)
    out = {k: "1" for k, v in ici.items() if v not in (-1, 1) and k not in (FSDP, TENSOR)}
    return ((FSDP, str(devices // tensor)), (TENSOR, str(tensor)), *out.items())


def matching(fixed: Mapping[str, int], target: int, prefix: str) -> str:
    """The value that makes the fixed axes ``fixed`` (of ``prefix``) make
    ``target``: the FSDP axis first, then each axis set, whichever the
    others' product divides."""
    for k in dict.fromkeys((f"{prefix}fsdp_parallelism", *fixed)):
        others = product_of({a: v for a, v in fixed.items() if a != k})
        if target % others == 0:
            return f"--set {k}={target // others} matches"
    return f"--set {prefix}fsdp_parallelism=-1 with the other {prefix}* axes 1 matches"
