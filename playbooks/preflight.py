"""Preflight: prove a training job fits the chips before anyone pays for TPUs.

1. Static checks, instant: the model config exists in the pinned MaxText; the
   ICI parallelisms multiply to the chips of a slice, the DCN ones to the
   slices; hosts, chips and workers agree; the manifest's
   MEGASCALE_NUM_SLICES equals its slice replicas; heads split over the
   tensor axis.
2. Fit, by ahead-of-time compiling the exact job for the TPU topology with
   MaxText's train_compile (same MaxText, flags and libtpu as the workers):
   per-chip arguments, outputs, temporaries and total against the chip's HBM.
3. When it does not fit, a small stated list of changes is compiled in turn
   and the first that fits is printed as a ready `--set` line.
Results are cached by everything that changes the compile.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from . import tutorial as T
from .core.command import Command, quote
from .core.inventory import Env
from .core.play import Outcome, StepContext
from .core.recap import CHANGED, FAILED, OK, SKIPPED
from .core.render import render
from .core.runner import ABSENT, Fact
from .core.step import Step
from .settings import ROOT, chips

PLAY = "preflight"
GIB = 1024 ** 3


def _base() -> dict:
    return yaml.safe_load((ROOT / "trainer" / T.BASE_CONFIG).read_text())


def _model(name: str) -> dict | None:
    p = ROOT / "trainer" / "models" / f"{name}.yml"
    return yaml.safe_load(p.read_text()) if p.exists() else None


def slice_devices(env: Env) -> int:
    """Devices in one slice: TPU chips on GKE, JAX CPU devices locally."""
    if env.kind == "local":
        return env.hosts_per_slice * env.devices_per_host
    return chips(env.topology)


def _axes(args: dict[str, str], base: dict, prefix: str) -> dict[str, int]:
    out = {}
    for k, v in base.items():
        if k.startswith(prefix) and k.endswith("_parallelism") and isinstance(v, int):
            out[k] = int(args.get(k, v))
    return out


def _mesh_rule(axes: dict[str, int], target: int, what: str) -> str | None:
    auto = [k for k, v in axes.items() if v == -1]
    fixed = {k: v for k, v in axes.items() if v not in (-1, 1)}
    product = 1
    for v in fixed.values():
        product *= v
    shown = " x ".join(f"{k}={v}" for k, v in fixed.items()) or "all 1"
    if len(auto) > 1:
        return f"{what}: more than one axis is -1 ({', '.join(auto)}); MaxText fills only one"
    if auto:
        if target % product:
            return (f"{what}: {shown} = {product} does not divide the {target} to fill "
                    f"({auto[0]}=-1 gets the rest)")
        return None
    if product != target:
        return f"{what}: {shown} = {product}, but there are {target}"
    return None


def static_checks(env: Env, job) -> list[str]:
    """Each violation: one line with the numbers."""
    out: list[str] = []
    args = dict(job.args)
    model = args.get("model_name", job.model)
    cfg = _model(model)
    if cfg is None:
        out.append(f"model config models/{model}.yml is not in the pinned MaxText "
                   f"(maxtext {_version('maxtext')}: see trainer/models/)")
        cfg = {}
    base = _base()
    devices = slice_devices(env)
    unit = "CPU devices in a simulated slice" if env.kind == "local" else f"chips in a {env.topology} slice"
    why = _mesh_rule(_axes(args, base, "ici_"), devices, f"ICI parallelism (per slice, {devices} {unit})")
    if why:
        out.append(why)
    if job.elastic:
        dcn = _axes(args, base, "dcn_")
        fixed = {k: v for k, v in dcn.items() if v not in (1, -1)}
        if fixed:
            out.append(f"DCN parallelism: {fixed} fixes the slice count, but the elastic job runs on 1 to "
                       f"{env.slices} slices; use -1")
    else:
        why = _mesh_rule(_axes(args, base, "dcn_"), env.slices, f"DCN parallelism (across slices, {env.slices} slices)")
        if why:
            out.append(why)
    if env.kind != "local":
        per_host = env.chips_per_host
        if per_host * env.hosts_per_slice != chips(env.topology):
            out.append(f"hosts: {env.hosts_per_slice} hosts x {per_host} chips = "
                       f"{env.hosts_per_slice * per_host}, but topology {env.topology} has {chips(env.topology)} chips")
        workers = env.slices * env.hosts_per_slice
        if workers % env.hosts_per_slice:
            out.append(f"workers: {workers} is not a multiple of {env.hosts_per_slice} hosts per slice")
        why = _megascale(env)
        if why:
            out.append(why)
    ov = args.get("override_model_config", "").lower() == "true"
    q = int(args["base_num_query_heads"]) if ov and "base_num_query_heads" in args else cfg.get("base_num_query_heads")
    kv = int(args["base_num_kv_heads"]) if ov and "base_num_kv_heads" in args else cfg.get("base_num_kv_heads")
    tensor = int(args.get("ici_tensor_parallelism", base.get("ici_tensor_parallelism", 1)))
    if q and tensor > 0 and q % tensor:
        out.append(f"attention: {q} query heads do not split over ici_tensor_parallelism={tensor}")
    if kv and tensor > 0 and kv % tensor and tensor % kv:
        out.append(f"attention: {kv} KV heads and ici_tensor_parallelism={tensor}: neither divides the other")
    return out


def _megascale(env: Env) -> str | None:
    from .raycluster import manifest_values
    text = render((ROOT / T.RAYCLUSTER_MANIFEST).read_text(), manifest_values(env))
    for doc in yaml.safe_load_all(text):
        if (doc or {}).get("kind") != "RayCluster":
            continue
        for g in doc["spec"].get("workerGroupSpecs") or []:
            for c in g["template"]["spec"].get("containers") or []:
                env_vars = {e["name"]: e.get("value") for e in c.get("env") or []}
                if str(env_vars.get("MEGASCALE_NUM_SLICES")) != str(g.get("replicas")):
                    return (f"manifest: MEGASCALE_NUM_SLICES={env_vars.get('MEGASCALE_NUM_SLICES')} but the worker "
                            f"group has {g.get('replicas')} slice replicas")
    return None


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"
