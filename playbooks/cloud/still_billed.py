"""What bills while the TPUs are off (`invoke stop-tpus`), and what a
teardown keeps: the bucket's bytes (`gcloud storage du --summarize`, the
sum of its objects' sizes), whether the environment has TPU nodes now (its
pools of a TPU machine type, from `clusters list`, and their nodes, as the
environment's cost reads them: ``env_cost``), and every other part of it
that bills (the cluster's other node pools, its management fee, the
bucket).

Cloud Storage bills a bucket by its bytes stored, per GiB-month, at its
storage class's price in its location
(https://cloud.google.com/storage/pricing). That price is not read here
(the Billing Catalog reader of ``prices`` takes the TPU SKUs only): a line
gives the bytes, the class and the location, and says so.

Pure but for ``bytes_fact`` (the read)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from playbooks.access.cli_clients import fact, gcloud, gcs_describe
from playbooks.cloud.env_cost import EnvCost
from playbooks.config.schema import Environment
from playbooks.config.tpu import of_machine_type
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import Completed, Fact

STORAGE_PRICE = ("Cloud Storage bills it per GiB-month at its class's price in its location (not read here: "
                 "https://cloud.google.com/storage/pricing)")
DELETE_BUCKET = "`invoke teardown --delete-bucket` deletes it"


def bytes_fact(env: Environment) -> Fact:
    """The bucket's bytes (an int), ABSENT where it does not exist (a 404);
    a dry run assumes None (not read)."""
    where = f"gs://{env.gs_bucket}"

    def parse(c: Completed) -> Any:
        if not c.ok:
            return gcs_describe(f"bytes in {where}")(c)  # a 404 is absent; anything else could not look
        words = c.stdout.split()
        if not words or not words[0].isdigit():
            raise ProbeFailed(f"bytes in {where}", c.line, c.rc, c.stdout, c.stderr,
                              why=f"output is not `<bytes> {where}`")
        return int(words[0])

    return fact(f"bytes in {where}", gcloud("storage", "du", "--summarize", where), parse, assumed=None,
                describe=lambda n: "not read" if n is None else size(n))


def size(n: int) -> str:
    for unit, scale in (("TiB", 1024 ** 4), ("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def bucket_line(env: Environment, bucket: Any, n: int | None, why: str = "",
                unread: str = "its size is read when it runs") -> str:
    """The bucket, what it holds and what bills it, in one line (``n``: its
    bytes; None: not read, ``why`` says why where it could not be, else
    ``unread`` says when it is)."""
    where = f"gs://{env.gs_bucket}"
    b = bucket if isinstance(bucket, dict) else {}
    cls = b.get("storageClass") or b.get("default_storage_class")
    kind = f" ({', '.join(str(x) for x in (b.get('location'), cls) if x)})" if b.get("location") or cls else ""
    held = (f"its size could not be read: {why}" if why else unread) if n is None else size(n)
    return f"bucket {where}{kind}: {held}; {STORAGE_PRICE}"


@dataclass(frozen=True)
class Bills:
    """The environment's TPU pools with their nodes now, and the other parts that bill."""

    tpus: dict[str, int]        # TPU node pool -> its nodes now
    others: list[str]           # "default-pool (3 nodes x n1-standard-16, $2.28/h)", "cluster fee (...)"
    bucket: str                 # bucket_line, or "" where there is no bucket
    unknown: str = ""           # the cluster could not be read: why
    absent: str = ""            # no cluster: why nothing of it bills

    @property
    def off(self) -> bool:
        return not self.unknown and not any(self.tpus.values())

    def doc(self) -> dict[str, Any]:
        state = "unknown" if self.unknown else "off" if self.off else "on"
        return {"tpus": state, "tpu_nodes": self.tpus, "still_billed": self.others + ([self.bucket] if self.bucket
                                                                                      else []),
                **({"unknown": self.unknown} if self.unknown else {})}


def bills(cluster: Any, cost: EnvCost, bucket_text: str) -> Bills:
    """From the cluster (``clusters list``'s, or ABSENT), its cost as read
    (each pool's nodes now) and the bucket's line."""
    if cost.unknown or cost.absent:
        return Bills({}, [], bucket_text, unknown=cost.unknown, absent=cost.absent)
    pools = (cluster.get("nodePools") or []) if isinstance(cluster, dict) else []
    tpu = {str(p.get("name")) for p in pools if of_machine_type(str((p.get("config") or {}).get("machineType")))}
    tpus = {p.name: p.units for p in cost.parts if p.name in tpu}
    others = [f"{p.name} ({p.what}" + (f", ${p.per_hour:,.2f}/h" if p.per_hour is not None else ", no price") + ")"
              for p in cost.parts if p.name not in tpu and p.units]
    return Bills(tpus, others, bucket_text)


def lines(b: Bills) -> list[str]:
    """Whether the TPUs bill, and what bills besides them (`invoke status`)."""
    rest = "; ".join(b.others + ([b.bucket] if b.bucket else [])) or "nothing"
    if b.unknown:
        return [f"TPUs: unknown ({b.unknown}); billed besides them: {rest}"]
    if b.off:
        where = b.absent or ("no TPU node" if b.tpus else "no TPU node pool")
        return [f"TPUs: off ({where}): `invoke up` makes them again, and `invoke train` resumes a run from its "
                f"last finalized checkpoint", f"still billed: {rest}"]
    on = ", ".join(f"{name} {n} nodes" for name, n in sorted(b.tpus.items()) if n)
    return [f"TPUs: on ({on}): `invoke stop-tpus` stops their bill and keeps the cluster, the bucket and its "
            f"checkpoints", f"billed besides them: {rest}"]
