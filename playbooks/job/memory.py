"""Each chip's HBM for one training step, estimated in an instant: the static
check that says a job does not fit before anything is compiled or paid for.
``fit.py`` feeds it (MaxText's settings as the job would have them: base.yml,
the model's config, the job's arguments) and the AOT compile stays the proof.

What it counts, per chip, from the model's shape (layers, embedding, heads,
MLP, vocabulary), the mesh, the dtypes and the flags:

- parameters: every weight in ``weight_dtype``, sharded over every axis
  but the data ones (data, diloco: replicas);
- optimizer state: AdamW's two moments (mu in ``mu_dtype``, else the
  weights' dtype; nu in the weights' dtype), sharded as the parameters;
- gradients: one per weight in ``grad_dtype``, sharded as the parameters
  (a second copy, the accumulator, with gradient_accumulation_steps > 1);
- activations kept for the backward pass: per layer, what the remat
  policy saves (``full``: the layer's input only), in ``dtype``, for the
  chip's tokens (per_device_batch_size x max_target_length);
- logits: the chip's tokens x the vocabulary, in float32 (divided by
  num_vocab_tiling);
- the working set: 7 copies of one layer's weights as one tensor shard
  holds them once gathered over FSDP, 2.7 MLP-sized activations of one
  layer, and 0.45 GiB (libtpu's reserve and the program's code).
``optimizer_memory_host_offload`` moves the optimizer state to host memory,
``parameter_memory_host_offload`` the parameters, ``decoder_layer_input:
offload`` the layers' inputs.

Accuracy. The working set's 7 and 2.7 are fitted to the two compiles that
fit (bench/fit_compiles.py, 2 x v6e-16, docs/preflight.md); the rest is
arithmetic. Against the compiler's own figures, per chip:

  job on 2 x v6e-16                    compile                      estimate
  llama3-8b, the tutorial's flags      22.35 GiB: fits              22.36 GiB: likely fits
  llama3-70b, the tutorial's flags     49.82 GiB of temporaries     53.98 GiB: does not fit
                                       alone: does not fit
  llama3-70b --preset=fits             30.01 GiB (16.43 on host)    30.00 GiB (16.43 on host): too close
  llama3-70b per_device_batch_size=1   no figure kept (the preset   46.43 GiB: does not fit
  llama3-70b optimizer offload alone   is recorded as the smallest  37.55 GiB: does not fit
                                       change that fits)

Two points fit two constants; the error on jobs they did not see is
measured out of sample (bench/fit_compiles.py --out-of-sample, the
hbm-error table of docs/preflight.md, 2026-12-07): within 2.5 % on other
batch sizes, a longer sequence and another remat policy on v6e, and -16.8 %
(22.36 GiB estimated, 26.86 compiled) for the 8B job on 2 x v5p-32. The
verdict's band is that largest error and a stated margin (3 points) either
way: over 119.8 % of the HBM it does not fit (a confident misfit stops
`train`: a false one would refuse a job that runs); at most 80.2 % it
likely fits; between, it is too close to call and the compile decides.
tests/test_bench_figures.py holds the band to the table.

Only dense llama-like models are estimated (decoder_block llama2,
mistral or default; no experts, pipeline, quantization or custom remat);
for the others it says why not, and the compile decides.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 1024 ** 3
# The estimate's largest error out of sample, as a share of the compile's
# figure (docs/preflight.md, hbm-error: the 8B job on 2 x v5p-32, -16.8 %),
# and the margin kept over it; the band between a fit and a misfit is both.
OUT_OF_SAMPLE_ERROR = 0.168
BAND_MARGIN = 0.03
MISFIT = 1 + OUT_OF_SAMPLE_ERROR + BAND_MARGIN  # over this share of the HBM: does not fit
FITS = 1 - OUT_OF_SAMPLE_ERROR - BAND_MARGIN    # at most this share: likely fits

# The working set, fitted to the two compiles that fit (the module's docstring).
LAYER_COPIES = 7.0
MLP_ACTIVATIONS = 2.7
RESERVED_GIB = 0.45

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DENSE_BLOCKS = ("llama2", "mistral", "default")
REPLICA_AXES = ("data", "diloco")  # mesh axes that hold whole copies of the weights
TENSOR_AXES = ("tensor", "tensor_transpose", "tensor_sequence")  # axes a gathered layer stays split over
# What each remat policy saves per layer and token, by the names MaxText
# checkpoints (maxtext/layers/nnx_decoders.py, get_remat_policy): E the
# embedding, Q the query heads x head_dim, K the KV heads x head_dim, M the MLP.
MINIMAL = ("E", "Q", "K", "K", "E", "M", "M", "E")
SAVED = {
    "full": ("E",),
    "save_qkv_proj": ("E", "Q", "K", "K"),
    "save_out_proj": ("E", "E"),
    "save_dot_except_mlp": ("E", "Q", "K", "K", "E"),
    "save_dot_except_mlpwi": ("E", "Q", "K", "K", "E", "E"),
    "save_dot_with_context_except_mlp": ("E", "Q", "K", "K", "Q", "E"),
    "minimal": MINIMAL,
    "minimal_with_quantization": MINIMAL,
    "minimal_with_context": MINIMAL + ("Q",),
    "minimal_flash": MINIMAL + ("Q",),
    "minimal_with_context_and_quantization": MINIMAL + ("Q",),
    "qkv_proj_offloaded": ("E",),
    "minimal_offloaded": ("E",),
    "none": MINIMAL + ("Q", "M", "M"),
}


@dataclass(frozen=True)
class Estimate:
    """GiB per chip in HBM, each part; ``host``: what the offload flags move
    to host memory."""

    parameters: float
    optimizer: float
    gradients: float
    activations: float
    logits: float
    working: float
    host: float
    capacity: float

    @property
    def total(self) -> float:
        return self.parameters + self.optimizer + self.gradients + self.activations + self.logits + self.working

    @property
    def verdict(self) -> str:
        """"fits", "close" (the compile decides) or "misfit"."""
        if self.total > MISFIT * self.capacity:
            return "misfit"
        return "fits" if self.total <= FITS * self.capacity else "close"

    def words(self) -> str:
        return {"fits": "likely fits", "close": "too close to call: the compile decides",
                "misfit": "does not fit"}[self.verdict]

    def parts(self) -> str:
        named = (("parameters", self.parameters), ("optimizer state", self.optimizer), ("gradients", self.gradients),
                 ("activations", self.activations), ("logits", self.logits), ("working set", self.working))
        out = ", ".join(f"{name} {gib:.2f}" for name, gib in named if gib)
        return out + (f"; {self.host:.2f} GiB on host" if self.host else "")

    def line(self) -> str:
        return f"{self.total:.2f} of {self.capacity:.2f} GiB per chip ({self.parts()})"


def _int(s: Mapping[str, Any], key: str, default: int = 1) -> int:
    v = s.get(key, default)
    return default if v is None else int(v)


def _true(s: Mapping[str, Any], key: str) -> bool:
    return str(s.get(key, False)).lower() == "true"


def mesh(s: Mapping[str, Any], devices: int, slices: int) -> dict[str, int]:
    """Each mesh axis's size (ICI times DCN), the -1 axes filled: ``devices``
    per slice, ``slices`` slices (the mesh rules were checked first)."""
    out: dict[str, int] = {}
    for prefix, total in (("ici_", devices), ("dcn_", slices)):
        axes = {k[len(prefix):-len("_parallelism")]: _int(s, k) for k in s
                if k.startswith(prefix) and k.endswith("_parallelism")}
        fixed = 1
        for v in axes.values():
            fixed *= v if v > 0 else 1
        for name, v in axes.items():
            out[name] = out.get(name, 1) * (max(1, total // fixed) if v == -1 else v)
    return out


def unsupported(s: Mapping[str, Any]) -> str | None:
    """Why the estimate does not know this job (None: it does)."""
    if str(s.get("decoder_block", "llama2")) not in DENSE_BLOCKS:
        return f"decoder_block {s.get('decoder_block')} (it knows the dense {', '.join(DENSE_BLOCKS)} blocks)"
    if _int(s, "num_experts") > 1:
        return "mixture of experts (num_experts > 1)"
    if _int(s, "ici_pipeline_parallelism") > 1 or _int(s, "dcn_pipeline_parallelism") > 1:
        return "pipeline parallelism"
    if s.get("quantization"):
        return f"quantization {s.get('quantization')}"
    if str(s.get("remat_policy", "full")) not in SAVED:
        return f"remat_policy {s.get('remat_policy')} (it knows {', '.join(SAVED)})"
    if str(s.get("opt_type", "adamw")) not in ("adamw", "adam_pax", "sgd"):
        return f"opt_type {s.get('opt_type')} (it knows adamw, adam_pax, sgd)"
    for k in ("weight_dtype", "dtype", "grad_dtype"):
        if str(s.get(k, "float32")) not in DTYPE_BYTES:
            return f"{k} {s.get(k)}"
    return None


def _shape(s: Mapping[str, Any]) -> dict[str, float]:
    """The model's sizes: per-layer and total weights, and E, Q, K, M, V."""
    e, heads, kv, d = (_int(s, k) for k in ("base_emb_dim", "base_num_query_heads", "base_num_kv_heads", "head_dim"))
    m, vocab = _int(s, "base_mlp_dim"), _int(s, "vocab_size")
    mlp_mats = len(s.get("mlp_activations") or ("silu", "linear")) + 1
    layer = 2 * e * heads * d + 2 * e * kv * d + mlp_mats * e * m + 2 * e
    embeddings = vocab * e * (1 if _true(s, "logits_via_embedding") else 2)
    total = _int(s, "base_num_decoder_layers") * layer + embeddings + e
    return {"layer": layer, "total": total, "E": e, "Q": heads * d, "K": kv * d, "M": m, "V": vocab}


def estimate(s: Mapping[str, Any], devices: int, slices: int, capacity: float) -> Estimate:
    """The estimate for settings ``s`` (MaxText's, as the job has them) on
    ``slices`` slices of ``devices`` chips each."""
    size, axes = _shape(s), mesh(s, devices, slices)
    replicas = 1
    for a in REPLICA_AXES:
        replicas *= axes.get(a, 1)
    shards = max(1, devices * slices // replicas)
    tensor = 1
    for a in TENSOR_AXES:
        tensor *= axes.get(a, 1)
    wb, ab, gb = (DTYPE_BYTES[str(s.get(k, "float32"))] for k in ("weight_dtype", "dtype", "grad_dtype"))
    mu = DTYPE_BYTES.get(str(s.get("mu_dtype") or s.get("weight_dtype", "float32")), wb)
    moments = 0 if str(s.get("opt_type", "adamw")) == "sgd" else mu + wb
    accumulate = max(1, _int(s, "gradient_accumulation_steps"))
    tokens = float(s.get("per_device_batch_size", 1)) * _int(s, "max_target_length", 2048) / accumulate
    saved = [size[k] for k in SAVED[str(s.get("remat_policy", "full"))]]
    inputs_on_host = str(s.get("decoder_layer_input", "device")) == "offload"
    layers = _int(s, "base_num_decoder_layers")
    kept = layers * tokens * ab * (sum(saved) - (size["E"] if inputs_on_host else 0))
    params = size["total"] * wb / shards
    optimizer = size["total"] * moments / shards
    param_host, opt_host = _true(s, "parameter_memory_host_offload"), _true(s, "optimizer_memory_host_offload")
    working = (LAYER_COPIES * size["layer"] * wb / tensor + MLP_ACTIVATIONS * tokens * size["M"] * ab) / GIB
    return Estimate(
        parameters=0.0 if param_host else params / GIB,
        optimizer=0.0 if opt_host else optimizer / GIB,
        gradients=size["total"] * gb * (2 if accumulate > 1 else 1) / shards / GIB,
        activations=kept / GIB,
        logits=tokens * size["V"] * 4 / max(1, _int(s, "num_vocab_tiling")) / GIB,
        working=working + RESERVED_GIB,
        host=((params if param_host else 0) + (optimizer if opt_host else 0)
              + (layers * tokens * ab * size["E"] if inputs_on_host else 0)) / GIB,
        capacity=capacity)


def parameters(s: Mapping[str, Any]) -> int:
    """The model's weights, counted as ``estimate`` counts them."""
    return int(_shape(s)["total"])


def checkpoint_bytes(s: Mapping[str, Any]) -> float:
    """What a checkpoint of the training state holds: every weight in
    ``weight_dtype`` and AdamW's two moments (as ``estimate`` counts the
    optimizer state), once, whatever the mesh (the data-parallel replicas
    save one copy)."""
    wb = DTYPE_BYTES[str(s.get("weight_dtype", "float32"))]
    mu = DTYPE_BYTES.get(str(s.get("mu_dtype") or s.get("weight_dtype", "float32")), wb)
    moments = 0 if str(s.get("opt_type", "adamw")) == "sgd" else mu + wb
    return float(parameters(s) * (wb + moments))
