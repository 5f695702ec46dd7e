"""What a real TPU chip says of itself, and how fast it multiplies.

Pure JAX and the standard library, nothing of this project: it runs on a
machine with a TPU and its own JAX (the device lent to this workplace has
Python 3.11 and JAX 0.10.2, neither Ray nor MaxText nor this project's lock).
Run by hand, never by the tests (CI has no accelerator):

    python3 bench/tpu_chip.py > chip.json          # on the TPU machine
    .venv/bin/python bench/tpu_chip.py --write chip.json   # here: into docs/benchmarks.md

It prints one JSON object: JAX's version, each device's platform and kind,
the chip's HBM as the runtime reports it (``memory_stats()['bytes_limit']``),
and the wall-clock rate of square bf16 matrix products (f32 accumulation,
random data, the mean of ``--reps`` after a warm-up), the best of which is a
lower bound of the chip's bf16 peak. A TPU generation's record must hold a
peak above what its chip reaches, and HBM that agrees with what it reports.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

SIZES = (4096, 8192, 16384)
GIB = 1024 ** 3


def chip() -> dict:
    """The devices, as JAX sees them; the first one's memory."""
    import jax

    devs = jax.devices()
    first = devs[0]
    stats = first.memory_stats() or {}
    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": len(devs),
        "platform": first.platform,
        "device_kind": first.device_kind,
        "hbm_bytes": stats.get("bytes_limit"),
        "hbm_gib": round(stats["bytes_limit"] / GIB, 2) if stats.get("bytes_limit") else None,
        "cores_per_chip": getattr(first, "num_cores", None),
    }


def matmul_rate(n: int, reps: int) -> dict:
    """Seconds and TFLOP/s of an n x n x n bf16 product (2 n^3 flops)."""
    import jax
    import jax.numpy as jnp

    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(ka, (n, n), dtype=jnp.bfloat16)
    b = jax.random.normal(kb, (n, n), dtype=jnp.bfloat16)
    f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    f(a, b).block_until_ready()  # compile and warm up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        f(a, b).block_until_ready()
        times.append(time.perf_counter() - start)
    mean = sum(times) / len(times)
    return {"n": n, "reps": reps, "mean_s": mean, "best_s": min(times),
            "tflops_mean": 2 * n ** 3 / mean / 1e12, "tflops_best": 2 * n ** 3 / min(times) / 1e12}


def measure(reps: int) -> dict:
    out = chip()
    out["matmul_bf16"] = [matmul_rate(n, reps) for n in SIZES]
    out["tflops_reached"] = max(r["tflops_best"] for r in out["matmul_bf16"])
    out["when"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return out


def table(m: dict) -> list[str]:
    lines = [f"JAX {m['jax']} ({m['backend']}): {m['devices']} device(s), kind `{m['device_kind']}`, "
             f"HBM {m['hbm_gib']} GiB ({m['hbm_bytes']} bytes, `memory_stats()['bytes_limit']`).", "",
             "| bf16 product (f32 accumulation) | reps | mean | best | TFLOP/s (mean) | TFLOP/s (best) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in m["matmul_bf16"]:
        lines.append(f"| {r['n']} x {r['n']} x {r['n']} | {r['reps']} | {1000 * r['mean_s']:.2f} ms | "
                     f"{1000 * r['best_s']:.2f} ms | {r['tflops_mean']:.1f} | {r['tflops_best']:.1f} |")
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--write", metavar="JSON", help="write a measurement (this script's output) into the docs")
    a = p.parse_args(argv)
    if a.write:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from bench import doc_table

        m = json.loads(Path(a.write).read_text())
        doc_table.write("benchmarks.md", "tpu-chip", "", table(m),
                        stamp=f"Measured by `python3 bench/tpu_chip.py` on a lent TPU machine at {m['when']}; "
                              f"written by `bench/tpu_chip.py --write`")
        return 0
    print(json.dumps(measure(a.reps), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
