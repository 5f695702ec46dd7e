"""A small, stateful fake of the Google Cloud REST APIs the playbooks' gcloud
and gsutil commands call, served over HTTPS on 127.0.0.1.

One server answers every API under its own path prefix, which is how the
real clients are pointed at it (``CLOUDSDK_API_ENDPOINT_OVERRIDES_*``):

- ``/compute/v1/...``       networks, subnetworks, their operations
- ``/container/v1/...``     clusters (and their maintenance policy), nodePools, operations (v1, locations)
- ``/serviceusage/v1/...``  services list / batchEnable, operations
- ``/crm/v1/...``           projects get, getIamPolicy / setIamPolicy
- ``/storage/v1/...``       buckets, objects, bucket IAM (gsutil and gcloud storage)
- ``/compute/v1/.../aggregated/machineTypes``, ``.../zones/Z/reservations/R``
- ``/cloudquotas/v1beta/...`` quota infos (``gcloud beta quotas info describe``)
- ``/oauth2/token``         the token endpoint gsutil refreshes its access token at
- ``/cloudbilling/v1/services/S/skus``  the Cloud Billing Catalog's SKUs (``billing_skus``), in pages

Operations finish at once (``DONE``) unless ``op_polls`` asks for latency.
Every request is recorded; ``server.fail(...)`` injects HTTP errors.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import itertools
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

from playbooks.config.tpu import GENERATIONS, of_machine_type

from .server import Fake, FakeServer, HttpError, Request, Response
from .tls import Pki

_ids = itertools.count(1000)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000-00:00", time.gmtime())


def _id() -> str:
    return str(4_000_000_000_000_000 + next(_ids))


def _etag(obj: Any) -> str:
    """A base64 etag (IAM policies carry bytes)."""
    return base64.b64encode(hashlib.sha1(repr(obj).encode()).digest()[:8]).decode()


def same_etag(a: str, b: str) -> bool:
    """Etags are bytes in base64; clients may send them URL-safe encoded."""
    def raw(s: str) -> bytes:
        s = s.replace("-", "+").replace("_", "/")
        return base64.b64decode(s + "=" * (-len(s) % 4))
    try:
        return raw(a) == raw(b)
    except ValueError:
        return a == b


def gerror(code: int, message: str, status: str = "", reason: str = "") -> dict:
    """A Google API error body."""
    status = status or {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                        404: "NOT_FOUND", 409: "ALREADY_EXISTS", 412: "FAILED_PRECONDITION",
                        429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}.get(code, "UNKNOWN")
    reason = reason or {401: "authError", 403: "forbidden", 404: "notFound", 409: "alreadyExists",
                        429: "rateLimitExceeded", 503: "backendError"}.get(code, "invalid")
    return {"error": {"code": code, "message": message, "status": status,
                      "errors": [{"message": message, "domain": "global", "reason": reason}]}}


def fail(code: int, message: str, status: str = "", reason: str = "") -> HttpError:
    return HttpError(code, gerror(code, message, status, reason))


# Ready-made fault bodies for tests.
def unavailable() -> dict:
    return gerror(503, "The service is currently unavailable.", "UNAVAILABLE", "backendError")


def rate_limited() -> dict:
    return gerror(429, "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute'.",
                  "RESOURCE_EXHAUSTED", "rateLimitExceeded")


def forbidden(permission: str, resource: str) -> dict:
    return gerror(403, f"Required '{permission}' permission for '{resource}'", "PERMISSION_DENIED", "forbidden")


def unauthenticated() -> dict:
    return gerror(401, "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
                       "cookie or other valid authentication credential.", "UNAUTHENTICATED", "authError")


# Calls that are POSTs by protocol but change nothing.
READ_ONLY_POST = re.compile(r"(:getIamPolicy|:testIamPermissions|/operations/[^/]+/wait|^/oauth2/token)$")


def changes(req: Request) -> bool:
    """A request that can change state: POST/PUT/PATCH/DELETE, minus the
    read-only RPCs that happen to be POSTs (getIamPolicy, operations wait,
    the OAuth token endpoint)."""
    return req.mutating and not (req.method == "POST" and READ_ONLY_POST.search(req.path))


@dataclass
class Stockout:
    """The next create of node pool ``pool`` (of ``capacity`` only, when
    given: "spot", "on-demand", "reservation", "flex-start") leaves it in
    ERROR, like a zone out of TPU capacity. ``op_fails``: the create
    operation itself ends with the error (gcloud exits 1); otherwise the
    operation succeeds and the pool is found in ERROR afterwards."""

    pool: str
    op_fails: bool = True
    capacity: str | None = None
    code: str = "GCE_STOCKOUT"
    message: str = ("GCE_STOCKOUT: Instance 'gke-{pool}-xxxx' creation failed: The zone '{zone}' does not have "
                    "enough resources available to fulfill the request. Try a different zone, or try again later.")


@dataclass
class KubeLink:
    """What the cluster object says about its Kubernetes API: the fake
    API server's endpoint and CA, and hooks for its life cycle."""

    endpoint: str
    ca_pem: bytes
    on_create: Callable[[dict], None] = lambda c: None
    on_delete: Callable[[dict], None] = lambda c: None
    # a pool's nodes exist (or not, 0), with GKE's TPU labels
    on_pool: Callable[[str, int, dict], None] = lambda pool, nodes, labels: None


@dataclass
class State:
    project: str
    number: str
    services: set[str] = field(default_factory=lambda: {"compute.googleapis.com", "storage.googleapis.com"})
    iam: dict = field(default_factory=dict)
    networks: dict[str, dict] = field(default_factory=dict)
    subnets: dict[tuple[str, str], dict] = field(default_factory=dict)
    clusters: dict[tuple[str, str], dict] = field(default_factory=dict)
    buckets: dict[str, dict] = field(default_factory=dict)
    bucket_iam: dict[str, dict] = field(default_factory=dict)
    objects: dict[str, dict[str, dict]] = field(default_factory=dict)
    compute_ops: dict[str, dict] = field(default_factory=dict)
    # zone -> machine types it offers; (zone, name) -> reservation; quota id -> QuotaInfo
    machine_types: dict[str, list[str]] = field(default_factory=lambda: {
        z: [*TPU_MACHINE_TYPES, "n1-standard-16"] for z in ("us-east5-a", "us-east5-b", "us-east5-c")} | {
        "europe-west4-a": ["ct6e-standard-4t"], "us-central1-b": ["n1-standard-16"]})
    reservations: dict[tuple[str, str, str], dict] = field(default_factory=dict)  # (project, zone, name)
    quotas: dict[str, dict] = field(default_factory=dict)
    container_ops: dict[str, dict] = field(default_factory=dict)
    su_ops: dict[str, dict] = field(default_factory=dict)
    # service id -> its SKUs, as the Cloud Billing Catalog lists them
    skus: dict[str, list[dict]] = field(default_factory=dict)


Route = tuple[str, re.Pattern, Callable[..., Any]]

# GKE's limits on maintenance exclusions (kubernetes-engine/docs/concepts/
# maintenance-windows-and-exclusions): "No upgrades" at most 30 days; the
# other scopes up to the end of support of the minor version (here: 180 days
# from now, the fake's stand-in); at most 20 exclusions per cluster.
EXCLUSION_DAYS = {"NO_UPGRADES": 30, "NO_MINOR_UPGRADES": 180, "NO_MINOR_OR_NODE_UPGRADES": 180}
MAX_EXCLUSIONS = 20


class FakeGcp(Fake):
    """The fake's state and its HTTP handlers."""

    def __init__(self, pki: Pki, project: str, number: str = "123456789012", token: str = "fake-access-token",
                 kube: KubeLink | None = None):
        self.project, self.number, self.token, self.kube = project, number, token, kube
        self.lock = threading.RLock()
        self.op_polls = 0          # GETs of an operation before it is DONE (latency)
        # Wall-clock latency of operations, in seconds, by kind ("network",
        # "subnet", "cluster", "nodepool", "delete"): the operation stays
        # RUNNING (its resource PROVISIONING) that long. For benchmarks.
        self.latency: dict[str, float] = {}
        self._pending: list[dict] = []
        self.stockouts: list[Stockout] = []
        # Flex-start pools that find no capacity: they stay empty (the others
        # get their nodes at once, as if GKE found the chips when the
        # workers asked for them).
        self.flex_start_empty: set[str] = set()
        self.st = State(project, number)
        self._default_quotas()
        self.routes: list[Route] = []
        self._routes()
        self.server = FakeServer("gcp", pki, self.handle, self.check_auth)
        self.url = self.server.url

    # -- life cycle ---------------------------------------------------------
    def reset(self) -> None:
        with self.lock:
            self.st = State(self.project, self.number)
            self._default_quotas()
            self.stockouts.clear()
            self.flex_start_empty = set()
            self.op_polls = 0
            self.latency = {}
            self._pending = []
        self.server.clear_faults()

    # -- views for tests ----------------------------------------------------
    @property
    def requests(self) -> list[Request]:
        return self.server.since(0)

    def endpoints(self) -> dict[str, str]:
        """CLOUDSDK_API_ENDPOINT_OVERRIDES_* values."""
        u = self.url
        return {"COMPUTE": f"{u}/compute/v1/", "CONTAINER": f"{u}/container/", "STORAGE": f"{u}/storage/v1/",
                "CLOUDRESOURCEMANAGER": f"{u}/crm/", "SERVICEUSAGE": f"{u}/serviceusage/",
                "CLOUDQUOTAS": f"{u}/cloudquotas/", "CLOUDBILLING": f"{u}/cloudbilling/"}

    # -- routing ------------------------------------------------------------
    def check_auth(self, req: Request) -> None:
        if req.path == "/oauth2/token":
            return
        if req.headers.get("authorization") != f"Bearer {self.token}":
            raise HttpError(401, unauthenticated())

    def route(self, method: str, pattern: str):
        def deco(fn):
            self.routes.append((method, re.compile("^" + pattern + "$"), fn))
            return fn
        return deco

    def handle(self, req: Request) -> Response:
        for method, rx, fn in self.routes:
            m = rx.match(req.path)
            if m and method == req.method:
                with self.lock:
                    self._tick()
                    out = fn(req, *m.groups())
                return out if isinstance(out, Response) else Response(200, out)
        raise fail(404, f"fake gcp: no route for {req.method} {req.path}")

    def _later(self, op: dict, key: str, resource: dict | None = None) -> dict:
        """Leave ``op`` RUNNING (and ``resource`` PROVISIONING) for latency[key] s."""
        delay = self.latency.get(key, 0.0)
        if delay > 0:
            op["status"], op["endTime"] = "RUNNING", None
            op["_done_at"] = time.monotonic() + delay
            if resource is not None and resource.get("status") == "RUNNING":
                resource["status"] = "PROVISIONING"
            self._pending.append({"op": op, "resource": resource})
        return op

    def _tick(self) -> None:
        now = time.monotonic()
        for item in list(self._pending):
            op = item["op"]
            if op["_done_at"] <= now:
                op["status"], op["endTime"] = "DONE", _now()
                res = item["resource"]
                if res is not None and res.get("status") == "PROVISIONING":
                    res["status"] = "RUNNING"
                self._pending.remove(item)

    def _project(self, p: str) -> None:
        if p not in (self.project, self.number):
            raise fail(403, f"The caller does not have permission (project {p})")

    def _routes(self) -> None:
        P = r"([^/]+)"
        r = self.route
        # compute
        c = "/compute/v1/projects/" + P
        r("GET", c + "/global/networks")(self.networks_list)
        r("POST", c + "/global/networks")(self.network_insert)
        r("GET", c + "/global/networks/" + P)(self.network_get)
        r("DELETE", c + "/global/networks/" + P)(self.network_delete)
        r("GET", c + "/regions/" + P + "/subnetworks")(self.subnets_list)
        r("POST", c + "/regions/" + P + "/subnetworks")(self.subnet_insert)
        r("GET", c + "/regions/" + P + "/subnetworks/" + P)(self.subnet_get)
        r("DELETE", c + "/regions/" + P + "/subnetworks/" + P)(self.subnet_delete)
        r("GET", c + "/aggregated/subnetworks")(self.subnets_aggregated)
        r("GET", c + "/aggregated/machineTypes")(self.machine_types_aggregated)
        r("GET", c + "/zones/" + P + "/reservations/" + P)(self.reservation_get)
        r("GET", "/cloudquotas/v1beta/projects/" + P + "/locations/global/services/" + P + "/quotaInfos/" + P)(
            self.quota_info)
        r("GET", "/cloudbilling/v1/services/" + P + "/skus")(self.billing_skus)
        r("POST", c + "/global/operations/" + P + "/wait")(lambda q, p, o: self.compute_op(p, o, wait=True))
        r("GET", c + "/global/operations/" + P)(lambda q, p, o: self.compute_op(p, o))
        r("POST", c + "/regions/" + P + "/operations/" + P + "/wait")(
            lambda q, p, reg, o: self.compute_op(p, o, wait=True))
        r("GET", c + "/regions/" + P + "/operations/" + P)(lambda q, p, reg, o: self.compute_op(p, o))
        self._other_routes(P)

    def _other_routes(self, P: str) -> None:
        r = self.route
        # container
        k = "/container/v1/projects/" + P + "/locations/" + P
        r("GET", k + "/clusters")(self.clusters_list)
        r("POST", k + "/clusters")(self.cluster_create)
        r("GET", k + "/clusters/" + P)(self.cluster_get)
        r("POST", k + "/clusters/([^/:]+):setMaintenancePolicy")(self.cluster_set_maintenance)
        r("DELETE", k + "/clusters/" + P)(self.cluster_delete)
        r("GET", k + "/clusters/" + P + "/nodePools")(self.pools_list)
        r("POST", k + "/clusters/" + P + "/nodePools")(self.pool_create)
        r("GET", k + "/clusters/" + P + "/nodePools/" + P)(self.pool_get)
        r("DELETE", k + "/clusters/" + P + "/nodePools/" + P)(self.pool_delete)
        r("GET", k + "/operations/" + P)(self.container_op)
        r("GET", k + "/serverConfig")(self.server_config)
        # serviceusage
        r("GET", "/serviceusage/v1/projects/" + P + "/services")(self.services_list)
        r("GET", "/serviceusage/v1/projects/" + P + "/services/" + P)(self.service_get)
        r("POST", "/serviceusage/v1/projects/" + P + "/services:batchEnable")(self.services_enable)
        r("POST", "/serviceusage/v1/projects/" + P + "/services/" + P + ":enable")(
            lambda q, p, s: self.services_enable(q, p, [s]))
        r("GET", "/serviceusage/v1/operations/" + P)(self.su_op)
        # resource manager
        r("GET", "/crm/v1/projects/" + P)(self.project_get)
        r("POST", "/crm/v1/projects/" + P + ":getIamPolicy")(self.project_get_iam)
        r("POST", "/crm/v1/projects/" + P + ":setIamPolicy")(self.project_set_iam)
        # storage
        r("GET", "/storage/v1/b")(self.buckets_list)
        r("POST", "/storage/v1/b")(self.bucket_insert)
        r("GET", "/storage/v1/b/" + P)(self.bucket_get)
        r("DELETE", "/storage/v1/b/" + P)(self.bucket_delete)
        r("GET", "/storage/v1/b/" + P + "/iam")(self.bucket_get_iam)
        r("PUT", "/storage/v1/b/" + P + "/iam")(self.bucket_set_iam)
        r("GET", "/storage/v1/b/" + P + "/o")(self.objects_list)
        r("GET", "/storage/v1/b/" + P + "/o/(.+)")(self.object_get)
        r("DELETE", "/storage/v1/b/" + P + "/o/(.+)")(self.object_delete)
        # oauth (gsutil)
        r("POST", "/oauth2/token")(lambda q: {"access_token": self.token, "token_type": "Bearer",
                                              "expires_in": 3600})

    # == compute ==============================================================
    def _c(self, p: str, *parts: str) -> str:
        return "/".join([f"{self.url}/compute/v1/projects/{p}", *parts])

    def _compute_op(self, p: str, kind: str, target: str, region: str | None = None,
                    error: dict | None = None, latency: str = "") -> dict:
        name = f"operation-{int(time.time() * 1000)}-{_id()[-8:]}"
        where = f"regions/{region}" if region else "global"
        op = {"kind": "compute#operation", "id": _id(), "name": name, "operationType": kind,
              "targetLink": target, "targetId": _id(), "status": "DONE", "user": "tester@example.com",
              "progress": 100, "insertTime": _now(), "startTime": _now(), "endTime": _now(),
              "selfLink": self._c(p, where, "operations", name)}
        if region:
            op["region"] = self._c(p, "regions", region)
        if error:
            op["error"] = error
            op["httpErrorStatusCode"] = 400
        self.st.compute_ops[name] = op
        if latency and not error:
            self._later(op, latency)
            return {k: v for k, v in op.items() if not k.startswith("_")}
        return op

    def compute_op(self, p: str, name: str, wait: bool = False) -> dict:
        """Get or wait: operations are DONE when made, unless latency is set;
        a wait blocks until DONE (at most 2 minutes), as the real API's does."""
        op = self.st.compute_ops.get(name)
        if op is None:
            raise fail(404, f"The resource 'projects/{p}/global/operations/{name}' was not found")
        if wait and op.get("status") != "DONE" and "_done_at" in op:
            left = min(max(0.0, op["_done_at"] - time.monotonic()), 120.0)
            self.lock.release()
            try:
                time.sleep(left)
            finally:
                self.lock.acquire()
            self._tick()
        return {k: v for k, v in op.items() if not k.startswith("_")}

    @staticmethod
    def _list(kind: str, self_link: str, items: list) -> dict:
        out = {"kind": kind, "id": self_link, "selfLink": self_link}
        if items:
            out["items"] = items
        return out

    def networks_list(self, req: Request, p: str) -> dict:
        self._project(p)
        return self._list("compute#networkList", self._c(p, "global/networks"),
                          [copy.deepcopy(n) for n in self.st.networks.values()])

    def network_get(self, req: Request, p: str, name: str) -> dict:
        self._project(p)
        n = self.st.networks.get(name)
        if n is None:
            raise fail(404, f"The resource 'projects/{p}/global/networks/{name}' was not found")
        return n

    def add_network(self, name: str, mtu: int = 8896, auto: bool = False) -> dict:
        p = self.project
        n = {"kind": "compute#network", "id": _id(), "creationTimestamp": _now(), "name": name,
             "selfLink": self._c(p, "global/networks", name), "autoCreateSubnetworks": auto, "mtu": mtu,
             "subnetworks": [], "routingConfig": {"routingMode": "REGIONAL"},
             "networkFirewallPolicyEnforcementOrder": "AFTER_CLASSIC_FIREWALL"}
        self.st.networks[name] = n
        return n

    def network_insert(self, req: Request, p: str) -> dict:
        self._project(p)
        body = req.body or {}
        name = body.get("name", "")
        if name in self.st.networks:
            raise fail(409, f"The resource 'projects/{p}/global/networks/{name}' already exists",
                       reason="alreadyExists")
        n = self.add_network(name, int(body.get("mtu") or 1460), bool(body.get("autoCreateSubnetworks")))
        return self._compute_op(p, "insert", n["selfLink"], latency="network")

    def network_delete(self, req: Request, p: str, name: str) -> dict:
        self._project(p)
        n = self.network_get(req, p, name)
        users = [s["name"] for s in self.st.subnets.values() if s["network"].rsplit("/", 1)[-1] == name]
        if users:
            raise fail(400, f"The network resource 'projects/{p}/global/networks/{name}' is already being used "
                            f"by 'projects/{p}/regions/.../subnetworks/{users[0]}'", reason="resourceInUseByAnotherResource")
        del self.st.networks[name]
        return self._compute_op(p, "delete", n["selfLink"], latency="delete")

    def subnets_list(self, req: Request, p: str, region: str) -> dict:
        self._project(p)
        items = [copy.deepcopy(s) for (reg, _), s in self.st.subnets.items() if reg == region]
        return self._list("compute#subnetworkList", self._c(p, "regions", region, "subnetworks"), items)

    def subnets_aggregated(self, req: Request, p: str) -> dict:
        self._project(p)
        items: dict[str, dict] = {}
        for (reg, _), s in self.st.subnets.items():
            items.setdefault(f"regions/{reg}", {"subnetworks": []})["subnetworks"].append(copy.deepcopy(s))
        return {"kind": "compute#subnetworkAggregatedList", "items": items,
                "selfLink": self._c(p, "aggregated/subnetworks")}

    def subnet_get(self, req: Request, p: str, region: str, name: str) -> dict:
        self._project(p)
        s = self.st.subnets.get((region, name))
        if s is None:
            raise fail(404, f"The resource 'projects/{p}/regions/{region}/subnetworks/{name}' was not found")
        return s

    def add_subnet(self, region: str, name: str, network: str, cidr: str) -> dict:
        p = self.project
        s = {"kind": "compute#subnetwork", "id": _id(), "creationTimestamp": _now(), "name": name,
             "network": self._c(p, "global/networks", network), "ipCidrRange": cidr,
             "gatewayAddress": cidr.split("/")[0][:-1] + "1", "region": self._c(p, "regions", region),
             "selfLink": self._c(p, "regions", region, "subnetworks", name), "privateIpGoogleAccess": False,
             "fingerprint": _etag(name), "stackType": "IPV4_ONLY", "purpose": "PRIVATE"}
        self.st.subnets[(region, name)] = s
        if network in self.st.networks:
            self.st.networks[network]["subnetworks"].append(s["selfLink"])
        return s

    def subnet_insert(self, req: Request, p: str, region: str) -> dict:
        self._project(p)
        body = req.body or {}
        name = body.get("name", "")
        if (region, name) in self.st.subnets:
            raise fail(409, f"The resource 'projects/{p}/regions/{region}/subnetworks/{name}' already exists",
                       reason="alreadyExists")
        net = str(body.get("network", "")).rsplit("/", 1)[-1]
        if net not in self.st.networks:
            raise fail(404, f"The resource 'projects/{p}/global/networks/{net}' was not found")
        cidr = body.get("ipCidrRange", "")
        for s in self.st.subnets.values():
            if s["network"].rsplit("/", 1)[-1] == net and s["ipCidrRange"] == cidr:
                raise fail(400, f"Invalid IPCidrRange: {cidr} conflicts with existing subnetwork '{s['name']}'")
        s = self.add_subnet(region, name, net, cidr)
        return self._compute_op(p, "insert", s["selfLink"], region=region, latency="subnet")

    def subnet_delete(self, req: Request, p: str, region: str, name: str) -> dict:
        self._project(p)
        s = self.subnet_get(req, p, region, name)
        del self.st.subnets[(region, name)]
        net = self.st.networks.get(s["network"].rsplit("/", 1)[-1])
        if net and s["selfLink"] in net["subnetworks"]:
            net["subnetworks"].remove(s["selfLink"])
        return self._compute_op(p, "delete", s["selfLink"], region=region, latency="delete")

    def machine_types_aggregated(self, req: Request, p: str) -> dict:
        """Every zone's machine types (gcloud filters them itself)."""
        self._project(p)
        items = {}
        for z, (zone, names) in enumerate(self.st.machine_types.items()):
            # ids stable from one list to the next, as Compute Engine's are
            items[f"zones/{zone}"] = {"machineTypes": [
                {"kind": "compute#machineType", "id": str(5_000_000_000_000_000 + 1000 * z + i), "name": n, "zone": zone, "guestCpus": 180,
                 "memoryMb": 737280, "selfLink": self._c(p, "zones", zone, "machineTypes", n)}
                for i, n in enumerate(names)]}
        return {"kind": "compute#machineTypeAggregatedList", "items": items,
                "selfLink": self._c(p, "aggregated/machineTypes")}

    def add_reservation(self, zone: str, name: str, count: int, in_use: int = 0,
                        machine_type: str = "ct6e-standard-4t", status: str = "READY", project: str = "") -> dict:
        """A specific reservation (``project``: another project's, shared)."""
        owner = project or self.project
        r = {"kind": "compute#reservation", "id": _id(), "name": name, "zone": self._c(owner, "zones", zone),
             "status": status, "specificReservationRequired": True,
             "specificReservation": {"count": str(count), "inUseCount": str(in_use), "assuredCount": str(count),
                                     "instanceProperties": {"machineType": machine_type}},
             "selfLink": self._c(owner, "zones", zone, "reservations", name)}
        self.st.reservations[(owner, zone, name)] = r
        return r

    def reservation_get(self, req: Request, p: str, zone: str, name: str) -> dict:
        r = self.st.reservations.get((p, zone, name))
        if r is None:
            raise fail(404, f"The resource 'projects/{p}/zones/{zone}/reservations/{name}' was not found")
        return copy.deepcopy(r)

    def _default_quotas(self) -> None:
        """A project granted quota for every TPU generation in us-east5 (64
        chips each, on-demand and preemptible: each generation's quota ids,
        playbooks/config/tpu.py); 0 elsewhere, as new projects start."""
        families = {g.on_demand_quota[1]["tpu_family"] for g in GENERATIONS.values()}
        self.set_quota("TPUS-PER-TPU-FAMILY-per-project-region",
                       [*(({"region": "us-east5", "tpu_family": f}, 64) for f in sorted(families)), ({}, 0)])
        for g in GENERATIONS.values():
            self.set_quota(g.preemptible_quota[0], [({"region": "us-east5"}, 64), ({}, 0)])

    def set_quota(self, quota_id: str, values: list[tuple[dict, int]]) -> dict:
        """A QuotaInfo as Cloud Quotas shows it: one entry per dimensions
        (the empty one is the default for the rest)."""
        info = {"name": f"projects/{self.number}/locations/global/services/compute.googleapis.com/quotaInfos/"
                        f"{quota_id}",
                "quotaId": quota_id, "metric": "compute.googleapis.com/" + quota_id.split("-per-")[0].lower(),
                "service": "compute.googleapis.com", "isPrecise": True, "refreshInterval": "day",
                "containerType": "PROJECT", "dimensions": ["region"], "isConcurrent": False,
                "dimensionsInfos": [{"dimensions": dims, "details": {"value": str(value)},
                                     "applicableLocations": [dims["region"]] if "region" in dims else ["global"]}
                                    for dims, value in values]}
        self.st.quotas[quota_id] = info
        return info

    def quota_info(self, req: Request, p: str, service: str, quota_id: str) -> dict:
        self._project(p)
        info = self.st.quotas.get(quota_id)
        if info is None:
            raise fail(404, f"QuotaInfo {quota_id} of service {service} was not found.", "NOT_FOUND")
        return copy.deepcopy(info)

    # == the Cloud Billing Catalog ================================================
    def billing_skus(self, req: Request, service: str) -> dict:
        """A page of a service's SKUs, as the API pages them: ``pageSize``
        (default and most 5000), ``pageToken`` from the previous page, and
        ``nextPageToken`` "" on the last."""
        skus = self.st.skus.get(service)
        if skus is None:
            raise fail(404, f"Service {service} was not found.", "NOT_FOUND")
        if req.query.get("currencyCode", "USD") != "USD":
            raise fail(400, "the fake prices in USD only")
        size = min(int(req.query.get("pageSize") or 5000), 5000)
        start = int(req.query.get("pageToken") or 0)
        page = skus[start:start + size]
        more = start + size < len(skus)
        return {"skus": copy.deepcopy(page), "nextPageToken": str(start + size) if more else ""}

    # == container ============================================================
    def _k(self, p: str, loc: str, *parts: str) -> str:
        return "/".join([f"{self.url}/container/v1/projects/{p}/locations/{loc}", *parts])

    def _container_op(self, p: str, loc: str, kind: str, target: str, error: str | None = None,
                      latency: str = "", resource: dict | None = None) -> dict:
        name = f"operation-{int(time.time() * 1000)}-{_id()[-8:]}"
        op = {"name": name, "zone": loc, "operationType": kind, "status": "DONE",
              "selfLink": self._k(p, loc, "operations", name), "targetLink": target,
              "startTime": _now(), "endTime": _now(), "location": loc}
        if error:
            op["statusMessage"] = error
            op["error"] = {"code": 9, "message": error}
        if self.op_polls:
            op = dict(op, status="RUNNING", endTime=None)
            op["_polls_left"] = self.op_polls
            op["_final"] = "DONE"
        self.st.container_ops[name] = op
        if latency and not error:
            self._later(op, latency, resource)
        return self._public(op)

    @staticmethod
    def _public(obj: dict) -> dict:
        return {k: v for k, v in obj.items() if not k.startswith("_") and v is not None}

    def container_op(self, req: Request, p: str, loc: str, name: str) -> dict:
        op = self.st.container_ops.get(name)
        if op is None:
            raise fail(404, f"Operation \"projects/{p}/locations/{loc}/operations/{name}\" not found.")
        if op.get("_polls_left"):
            op["_polls_left"] -= 1
            if not op["_polls_left"]:
                op["status"], op["endTime"] = op["_final"], _now()
        return self._public(op)

    def server_config(self, req: Request, p: str, loc: str) -> dict:
        v = "1.35.2-gke.1842000"
        return {"defaultClusterVersion": v, "validMasterVersions": [v, "1.34.1-gke.1829001"],
                "validNodeVersions": [v, "1.34.1-gke.1829001"], "defaultImageType": "COS_CONTAINERD",
                "channels": [{"channel": "RAPID", "defaultVersion": v, "validVersions": [v]},
                             {"channel": "REGULAR", "defaultVersion": v, "validVersions": [v]}]}

    def _clusters_in(self, loc: str) -> list[dict]:
        return [c for (ln, _), c in self.st.clusters.items() if loc in ("-", ln)]

    def clusters_list(self, req: Request, p: str, loc: str) -> dict:
        self._project(p)
        return {"clusters": [self._public_cluster(c) for c in self._clusters_in(loc)]}

    def _public_cluster(self, c: dict) -> dict:
        out = self._public(c)
        out["nodePools"] = [self._public(np) for np in c.get("nodePools", [])]
        return copy.deepcopy(out)

    def _cluster(self, p: str, loc: str, name: str) -> dict:
        self._project(p)
        c = self.st.clusters.get((loc, name))
        if c is None and loc == "-":
            c = next((x for (ln, n), x in self.st.clusters.items() if n == name), None)
        if c is None:
            raise fail(404, f"Not found: projects/{p}/locations/{loc}/clusters/{name}.")
        return c

    def cluster_get(self, req: Request, p: str, loc: str, name: str) -> dict:
        return self._public_cluster(self._cluster(p, loc, name))

    def add_cluster(self, loc: str, spec: dict) -> dict:
        """A cluster as the API shows it once made: the request's fields plus
        the server's (status, endpoint and CA of the fake Kubernetes API,
        versions, links)."""
        p = self.project
        c = copy.deepcopy(spec)
        name = c["name"]
        regional = loc.count("-") == 1
        version = c.get("initialClusterVersion") or "1.35.2-gke.1842000"
        c.update({
            "id": _id()[:16], "selfLink": self._k(p, loc, "clusters", name), "zone": loc, "location": loc,
            "locations": c.get("locations") or ([f"{loc}-a", f"{loc}-b", f"{loc}-c"] if regional else [loc]),
            "status": "RUNNING", "createTime": _now(), "currentMasterVersion": version,
            "currentNodeVersion": version, "initialClusterVersion": version,
            "endpoint": self.kube.endpoint if self.kube else "127.0.0.1",
            "masterAuth": {"clusterCaCertificate": _b64(self.kube.ca_pem) if self.kube else ""},
            "network": c.get("network") or "default", "subnetwork": c.get("subnetwork") or "default",
            "clusterIpv4Cidr": "10.100.0.0/14", "servicesIpv4Cidr": "34.118.224.0/20",
            "labelFingerprint": "a9dc16a7", "etag": _etag(name),
            "maintenancePolicy": {"resourceVersion": _etag(name + "-policy")},
            "loggingService": "logging.googleapis.com/kubernetes",
            "monitoringService": "monitoring.googleapis.com/kubernetes",
        })
        region = loc if regional else loc.rsplit("-", 1)[0]
        c.setdefault("addonsConfig", {})
        c.setdefault("networkConfig", {}).update({"network": f"projects/{p}/global/networks/default",
                                                  "subnetwork": f"projects/{p}/regions/{region}/subnetworks/default"})
        pools = []
        for np in c.pop("nodePools", None) or []:
            pools.append(self._make_pool(p, loc, name, np, version))
        if (c.get("autopilot") or {}).get("enabled"):
            pools = [self._make_pool(p, loc, name, {"name": "default-pool", "initialNodeCount": 1,
                                                    "config": {"machineType": "ek-standard-8"}}, version)]
        c["nodePools"] = pools
        self.st.clusters[(loc, name)] = c
        if self.kube:
            self.kube.on_create(c)
        return c

    def cluster_create(self, req: Request, p: str, loc: str) -> dict:
        self._project(p)
        spec = (req.body or {}).get("cluster") or {}
        name = spec.get("name", "")
        if "container.googleapis.com" not in self.st.services:
            raise fail(403, f"Kubernetes Engine API has not been used in project {self.number} before or it is "
                            f"disabled. Enable it by visiting ...", reason="accessNotConfigured")
        if (loc, name) in self.st.clusters:
            raise fail(409, f"Already exists: projects/{p}/locations/{loc}/clusters/{name}.")
        c = self.add_cluster(loc, spec)
        return self._container_op(p, loc, "CREATE_CLUSTER", c["selfLink"], latency="cluster", resource=c)

    def cluster_set_maintenance(self, req: Request, p: str, loc: str, name: str) -> dict:
        """clusters.setMaintenancePolicy, as `clusters update --add-/--remove-
        maintenance-exclusion` sends it: the whole policy, with the
        resourceVersion it read (another's change in between is refused)."""
        c = self._cluster(p, loc, name)
        policy = copy.deepcopy((req.body or {}).get("maintenancePolicy") or {})
        have = c.get("maintenancePolicy") or {}
        if have.get("resourceVersion") and policy.get("resourceVersion") != have["resourceVersion"]:
            raise fail(400, "Cluster maintenance policy was modified since it was read: resourceVersion "
                            f"{policy.get('resourceVersion')!r} is not the current {have['resourceVersion']!r}.",
                       "FAILED_PRECONDITION", "failedPrecondition")
        window = policy.setdefault("window", {})
        exclusions = window.get("maintenanceExclusions") or {}
        if len(exclusions) > MAX_EXCLUSIONS:
            raise fail(400, f"At most {MAX_EXCLUSIONS} maintenance exclusions are allowed per cluster.")
        now = datetime.now(UTC)
        for ex_name, w in exclusions.items():
            start, end = _rfc3339(w.get("startTime")), _rfc3339(w.get("endTime"))
            if start is None or end is None or end <= start:
                raise fail(400, f"Maintenance exclusion {ex_name}: end time must be after start time.")
            scope = (w.get("maintenanceExclusionOptions") or {}).get("scope") or "NO_UPGRADES"
            days = EXCLUSION_DAYS.get(scope)
            if days is None:
                raise fail(400, f"Maintenance exclusion {ex_name}: unknown scope {scope}.")
            if end - max(start, now) > timedelta(days=days):
                raise fail(400, f"Maintenance exclusion {ex_name} of scope {scope} exceeds the maximum of {days} "
                                f"days.")
            w["startTime"], w["endTime"] = (t.strftime("%Y-%m-%dT%H:%M:%SZ") for t in (start, end))
        window["maintenanceExclusions"] = exclusions
        policy["resourceVersion"] = _etag(repr(sorted(exclusions.items())) + _id())
        c["maintenancePolicy"] = policy
        return self._container_op(p, c["location"], "SET_MAINTENANCE_POLICY", c["selfLink"])

    def add_exclusion(self, loc: str, cluster: str, name: str, days: float, scope: str = "NO_MINOR_OR_NODE_UPGRADES",
                      started_days_ago: float = 0.0) -> dict:
        """A maintenance exclusion already on the cluster (from another run,
        or a user's), as GKE shows it."""
        c = self.st.clusters[(loc, cluster)]
        now = datetime.now(UTC) - timedelta(days=started_days_ago)
        window = c.setdefault("maintenancePolicy", {}).setdefault("window", {})
        w = {"startTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
             "endTime": (now + timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ"),
             "maintenanceExclusionOptions": {"scope": scope}}
        window.setdefault("maintenanceExclusions", {})[name] = w
        c["maintenancePolicy"]["resourceVersion"] = _etag(name + _id())
        return w

    def cluster_delete(self, req: Request, p: str, loc: str, name: str) -> dict:
        c = self._cluster(p, loc, name)
        del self.st.clusters[(c["location"], name)]
        for np in c.get("nodePools") or []:
            self._release(np)
        if self.kube:
            self.kube.on_delete(c)
        return self._container_op(p, c["location"], "DELETE_CLUSTER", c["selfLink"])

    def _make_pool(self, p: str, loc: str, cluster: str, spec: dict, version: str) -> dict:
        np = copy.deepcopy(spec)
        name = np["name"]
        np.update({"selfLink": self._k(p, loc, "clusters", cluster, "nodePools", name), "version": version,
                   "status": "RUNNING", "etag": _etag(name),
                   "instanceGroupUrls": [f"{self.url}/compute/v1/projects/{p}/zones/{loc}/instanceGroupManagers/"
                                         f"gke-{cluster}-{name}-grp"]})
        np.setdefault("locations", [loc])
        np.setdefault("podIpv4CidrSize", 24)
        return np

    def add_pool(self, loc: str, cluster: str, spec: dict, status: str = "RUNNING", message: str = "") -> dict:
        c = self.st.clusters[(loc, cluster)]
        np = self._make_pool(self.project, loc, cluster, spec, c["currentNodeVersion"])
        np["status"] = status
        if message:
            np["statusMessage"] = message
        c["nodePools"].append(np)
        if self.kube and np["name"] != "default-pool":
            nodes = int(np.get("initialNodeCount") or 0)
            if (np.get("config") or {}).get("flexStart") and np["name"] not in self.flex_start_empty:
                nodes = int((np.get("autoscaling") or {}).get("maxNodeCount") or nodes)
            self.kube.on_pool(np["name"], nodes if status == "RUNNING" else 0, tpu_labels(np))
        return np

    def pools_list(self, req: Request, p: str, loc: str, cluster: str) -> dict:
        c = self._cluster(p, loc, cluster)
        return {"nodePools": [copy.deepcopy(self._public(np)) for np in c["nodePools"]]}

    def _pool(self, c: dict, name: str) -> dict:
        for np in c["nodePools"]:
            if np["name"] == name:
                return np
        raise fail(404, f"Not found: projects/{self.project}/locations/{c['location']}/clusters/{c['name']}/"
                        f"nodePools/{name}.")

    def pool_get(self, req: Request, p: str, loc: str, cluster: str, name: str) -> dict:
        return self._public(self._pool(self._cluster(p, loc, cluster), name))

    def pool_create(self, req: Request, p: str, loc: str, cluster: str) -> dict:
        c = self._cluster(p, loc, cluster)
        spec = (req.body or {}).get("nodePool") or {}
        name = spec.get("name", "")
        if any(np["name"] == name for np in c["nodePools"]):
            raise fail(409, f"Already exists: projects/{p}/locations/{loc}/clusters/{cluster}/nodePools/{name}.")
        for net in ((spec.get("networkConfig") or {}).get("additionalNodeNetworkConfigs") or []):
            n, s = str(net.get("network")).rsplit("/", 1)[-1], str(net.get("subnetwork")).rsplit("/", 1)[-1]
            if n not in self.st.networks or not any(k[1] == s for k in self.st.subnets):
                raise fail(400, f"Additional node network {n}/{s} does not exist.")
        if why := kubelet_refusal(spec):
            raise fail(400, why)
        capacity = pool_capacity(spec)
        so = next((s for s in self.stockouts if s.pool == name and s.capacity in (None, capacity)), None)
        if so is not None:
            self.stockouts.remove(so)
            refusal: tuple[str, str, bool] | None = (so.code, so.message.format(pool=name, zone=loc), so.op_fails)
        else:
            refusal = self._refusal(c, spec)
        if refusal is not None:
            code, msg, op_fails = refusal
            np = self.add_pool(c["location"], cluster, spec, status="ERROR", message=msg)
            np["conditions"] = [{"code": code, "message": msg, "canonicalCode": "RESOURCE_EXHAUSTED"}]
            return self._container_op(p, loc, "CREATE_NODE_POOL", np["selfLink"], error=msg if op_fails else None)
        np = self.add_pool(c["location"], cluster, spec)
        self._hold_reservation(np)
        return self._container_op(p, loc, "CREATE_NODE_POOL", np["selfLink"], latency="nodepool", resource=np)

    # What a TPU pool's create meets besides a stockout: a reservation with
    # too few free hosts (its hosts are held while the pool lives), a quota
    # its chips would exceed (QUOTA_OF; counted over every pool of the region).
    def _refusal(self, c: dict, spec: dict) -> tuple[str, str, bool] | None:
        chips = pool_chips(spec)
        if not chips:
            return None
        capacity, region = pool_capacity(spec), _region(c["location"])
        instance = f"Instance 'gke-{c['name']}-{spec.get('name')}-{_id()[-4:]}' creation failed"
        if capacity == "reservation":
            key = self._reservation_key(c, spec)
            r = self.st.reservations.get(key) if key else None
            spec_r = (r or {}).get("specificReservation") or {}
            free = int(spec_r.get("count", 0)) - int(spec_r.get("inUseCount", 0))
            if r is None or r.get("status") != "READY" or free < int(spec.get("initialNodeCount") or 0):
                return ("GCE_STOCKOUT", f"TPU: the nodes cannot be created now due to lack of capacity in your "
                                        f"reservation {key[2] if key else '?'}. {instance}.", True)
            return None
        quota = quota_of(capacity, spec)
        if quota is None:
            return None
        qid, metric, dims = quota
        limit = self.quota_limit(qid, region, dims)
        used = sum(pool_chips(np) for (loc, _), cl in self.st.clusters.items()
                   for np in cl["nodePools"] if np.get("status") != "ERROR" and pool_capacity(np) == capacity
                   and quota_of(capacity, np) == quota and _region(loc) == region)
        if limit is not None and 0 <= limit < used + chips:
            return ("GCE_QUOTA_EXCEEDED", f"{instance}: Quota '{metric}' exceeded. Limit: {limit}.0 in region "
                                          f"{region}.", True)
        return None

    def quota_limit(self, quota_id: str, region: str, want: dict | None = None) -> int | None:
        """The value in force for a region (and the other dimensions asked,
        a tpu_family): its own entry, else the default."""
        info = self.st.quotas.get(quota_id)
        if info is None:
            return None
        best = None
        for d in info["dimensionsInfos"]:
            dims = d.get("dimensions") or {}
            if any(dims.get(k, v) != v for k, v in {"region": region, **(want or {})}.items()):
                continue
            if best is None or len(dims) > len(best[0]):
                best = (dims, int(d["details"]["value"]))
        return None if best is None else best[1]

    def _reservation_key(self, c: dict, spec: dict) -> tuple[str, str, str] | None:
        values = ((spec.get("config") or {}).get("reservationAffinity") or {}).get("values") or []
        if not values:
            return None
        m = re.match(r"^projects/([^/]+)/reservations/([^/]+)$", values[0])
        owner, name = (m.group(1), m.group(2)) if m else (self.project, values[0])
        zone = (c.get("locations") or [c["location"]])[0]
        return (owner, zone, name)

    def _hold_reservation(self, np: dict) -> None:
        """A pool that consumes a reservation holds its hosts until it goes."""
        if pool_capacity(np) != "reservation":
            return
        c = next(cl for cl in self.st.clusters.values() if np in cl["nodePools"])
        key = self._reservation_key(c, np)
        r = self.st.reservations.get(key) if key else None
        if r is not None:
            spec = r["specificReservation"]
            hosts = int(np.get("initialNodeCount") or 0)
            spec["inUseCount"] = str(int(spec["inUseCount"]) + hosts)
            np["_reservation"] = (key, hosts)

    def _release(self, np: dict) -> None:
        key, hosts = np.pop("_reservation", (None, 0))
        r = self.st.reservations.get(key) if key else None
        if r is not None:
            spec = r["specificReservation"]
            spec["inUseCount"] = str(max(0, int(spec["inUseCount"]) - hosts))

    def pool_delete(self, req: Request, p: str, loc: str, cluster: str, name: str) -> dict:
        c = self._cluster(p, loc, cluster)
        np = self._pool(c, name)
        c["nodePools"].remove(np)
        self._release(np)
        if self.kube:
            self.kube.on_pool(name, 0, {})
        return self._container_op(p, loc, "DELETE_NODE_POOL", np["selfLink"])

    # == serviceusage =========================================================
    def services_list(self, req: Request, p: str) -> dict:
        self._project(p)
        want = req.query.get("filter", "")
        items = []
        for s in sorted(self.st.services):
            items.append({"name": f"projects/{self.number}/services/{s}", "parent": f"projects/{self.number}",
                          "config": {"name": s, "title": s.split(".")[0].title() + " API"}, "state": "ENABLED"})
        if want and want not in ("state:ENABLED",):
            raise fail(400, f"fake gcp: unsupported filter {want!r}")
        return {"services": items} if items else {}

    def service_get(self, req: Request, p: str, name: str) -> dict:
        self._project(p)
        return {"name": f"projects/{self.number}/services/{name}", "parent": f"projects/{self.number}",
                "config": {"name": name, "title": name.split(".")[0].title() + " API"},
                "state": "ENABLED" if name in self.st.services else "DISABLED"}

    def services_enable(self, req: Request, p: str, ids: list[str] | None = None) -> dict:
        self._project(p)
        ids = ids if ids is not None else list((req.body or {}).get("serviceIds") or [])
        self.st.services.update(ids)
        name = f"operations/acf.p2-{self.number}-{_id()[-8:]}"
        op = {"name": name, "done": True, "metadata": {"@type": "type.googleapis.com/google.protobuf.Empty"},
              "response": {"@type": "type.googleapis.com/google.api.serviceusage.v1.BatchEnableServicesResponse",
                           "services": [{"name": f"projects/{self.number}/services/{s}", "state": "ENABLED",
                                         "config": {"name": s}} for s in ids]}}
        self.st.su_ops[name.split("/", 1)[1]] = op
        return op

    def su_op(self, req: Request, name: str) -> dict:
        op = self.st.su_ops.get(name)
        if op is None:
            raise fail(404, f"Operation operations/{name} not found")
        return op

    # == resource manager =====================================================
    def project_get(self, req: Request, p: str) -> dict:
        self._project(p)
        return {"projectNumber": self.number, "projectId": self.project, "lifecycleState": "ACTIVE",
                "name": self.project, "createTime": "2024-01-01T00:00:00.000Z",
                "parent": {"type": "organization", "id": "1"}}

    def _policy(self) -> dict:
        if not self.st.iam:
            self.st.iam = {"version": 1, "bindings": [
                {"role": "roles/owner", "members": ["user:owner@example.com"]}]}
            self.st.iam["etag"] = _etag(self.st.iam["bindings"])
        return self.st.iam

    def project_get_iam(self, req: Request, p: str) -> dict:
        self._project(p)
        return copy.deepcopy(self._policy())

    def project_set_iam(self, req: Request, p: str) -> dict:
        self._project(p)
        policy = (req.body or {}).get("policy") or {}
        cur = self._policy()
        if policy.get("etag") and not same_etag(policy["etag"], cur["etag"]):
            raise fail(409, "There were concurrent policy changes. Please retry the whole read-modify-write "
                            "with exponential backoff.", "ABORTED", "aborted")
        new = {"version": policy.get("version", 1), "bindings": policy.get("bindings") or []}
        new["etag"] = _etag(new["bindings"])
        self.st.iam = new
        return copy.deepcopy(new)

    # == storage ==============================================================
    def _s(self, *parts: str) -> str:
        return "/".join([f"{self.url}/storage/v1", *parts])

    def _bucket(self, name: str) -> dict:
        b = self.st.buckets.get(name)
        if b is None:
            raise fail(404, "The specified bucket does not exist.")
        return b

    def add_bucket(self, name: str, location: str, storage_class: str = "STANDARD") -> dict:
        b = {"kind": "storage#bucket", "selfLink": self._s("b", name), "id": name, "name": name,
             "projectNumber": self.number, "generation": _id(), "metageneration": "1", "location": location.upper(),
             "storageClass": storage_class.upper(), "etag": "CAE=", "timeCreated": _now(), "updated": _now(),
             "locationType": "region", "rpo": "DEFAULT",
             "iamConfiguration": {"bucketPolicyOnly": {"enabled": False},
                                  "uniformBucketLevelAccess": {"enabled": False},
                                  "publicAccessPrevention": "inherited"},
             "softDeletePolicy": {"retentionDurationSeconds": "604800", "effectiveTime": _now()}}
        self.st.buckets[name] = b
        self.st.objects[name] = {}
        self.st.bucket_iam[name] = {
            "kind": "storage#policy", "resourceId": f"projects/_/buckets/{name}", "version": 1, "etag": "CAE=",
            "bindings": [
                {"role": "roles/storage.legacyBucketOwner",
                 "members": [f"projectEditor:{self.project}", f"projectOwner:{self.project}"]},
                {"role": "roles/storage.legacyBucketReader", "members": [f"projectViewer:{self.project}"]}]}
        return b

    def add_object(self, bucket: str, name: str, size: int = 3) -> dict:
        o = {"kind": "storage#object", "id": f"{bucket}/{name}/1", "name": name, "bucket": bucket,
             "generation": "1", "metageneration": "1", "size": str(size), "contentType": "text/plain",
             "timeCreated": _now(), "updated": _now(), "storageClass": "STANDARD", "md5Hash": "rL0Y20zC+Fzt72VPzMSk2A==",
             "crc32c": "AAAAAA==", "etag": "CAE=", "selfLink": self._s("b", bucket, "o", name)}
        self.st.objects[bucket][name] = o
        return o

    def buckets_list(self, req: Request) -> dict:
        return {"kind": "storage#buckets", "items": [copy.deepcopy(b) for b in self.st.buckets.values()]}

    def bucket_get(self, req: Request, name: str) -> dict:
        return copy.deepcopy(self._bucket(name))

    def bucket_insert(self, req: Request) -> dict:
        self._project(req.query.get("project", ""))
        body = req.body or {}
        name = body.get("name", "")
        if name in self.st.buckets:
            raise fail(409, "Your previous request to create the named bucket succeeded and you already own it.",
                       "CONFLICT", "conflict")
        return copy.deepcopy(self.add_bucket(name, body.get("location") or "US", body.get("storageClass") or "STANDARD"))

    def bucket_delete(self, req: Request, name: str) -> Response:
        self._bucket(name)
        if self.st.objects.get(name):
            raise fail(409, "The bucket you tried to delete is not empty.", "CONFLICT", "conflict")
        del self.st.buckets[name]
        self.st.bucket_iam.pop(name, None)
        self.st.objects.pop(name, None)
        return Response(204)

    def bucket_get_iam(self, req: Request, name: str) -> dict:
        self._bucket(name)
        return copy.deepcopy(self.st.bucket_iam[name])

    def bucket_set_iam(self, req: Request, name: str) -> dict:
        self._bucket(name)
        body = req.body or {}
        cur = self.st.bucket_iam[name]
        if body.get("etag") and not same_etag(body["etag"], cur["etag"]):
            raise fail(412, "Precondition Failed", "FAILED_PRECONDITION", "conditionNotMet")
        new = dict(cur, bindings=body.get("bindings") or [], version=body.get("version", 1))
        new["etag"] = _etag(new["bindings"])
        self.st.bucket_iam[name] = new
        return copy.deepcopy(new)

    def objects_list(self, req: Request, name: str) -> dict:
        self._bucket(name)
        prefix, delim = req.query.get("prefix", ""), req.query.get("delimiter", "")
        items, prefixes = [], []
        for n, o in sorted(self.st.objects[name].items()):
            if not n.startswith(prefix):
                continue
            rest = n[len(prefix):]
            if delim and delim in rest:
                p = prefix + rest.split(delim, 1)[0] + delim
                if p not in prefixes:
                    prefixes.append(p)
                continue
            items.append(copy.deepcopy(o))
        out: dict[str, Any] = {"kind": "storage#objects"}
        if items:
            out["items"] = items
        if prefixes:
            out["prefixes"] = prefixes
        return out

    def object_get(self, req: Request, bucket: str, name: str) -> dict:
        name = unquote(name)
        self._bucket(bucket)
        o = self.st.objects[bucket].get(name)
        if o is None:
            raise fail(404, "No such object: " + f"{bucket}/{name}")
        return o

    def object_delete(self, req: Request, bucket: str, name: str) -> Response:
        name = unquote(name)
        self.object_get(req, bucket, name)
        del self.st.objects[bucket][name]
        return Response(204)


def _rfc3339(text: Any) -> datetime | None:
    """A time as clients send it (RFC 3339: Z or an offset, fractions)."""
    try:
        t = datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", str(text)).replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


# The quota (Cloud Quotas id, Compute Engine metric) a pool of each capacity
# consumes: Spot the preemptible v6e quota, on-demand TPUS_PER_TPU_FAMILY.
TPU_MACHINE_TYPES = tuple(m for g in GENERATIONS.values() for m in g.machine_types if m.endswith("-4t"))


def quota_of(capacity: str, spec: dict) -> tuple[str, str, dict] | None:
    """The quota a pool of this capacity and machine type consumes (its
    generation's ids), its metric and dimensions; None: none (a reservation,
    flex-start here, a machine type that is not a TPU's)."""
    gen = of_machine_type(str((spec.get("config") or {}).get("machineType", "")))
    if gen is None or capacity not in ("spot", "on-demand"):
        return None
    qid, dims = gen.preemptible_quota if capacity == "spot" else gen.on_demand_quota
    return qid, qid.split("-per-")[0].replace("-", "_"), dict(dims)


def tpu_labels(np: dict) -> dict:
    """GKE's labels on a TPU pool's nodes: its accelerator and topology."""
    gen = of_machine_type(str((np.get("config") or {}).get("machineType", "")))
    top = (np.get("placementPolicy") or {}).get("tpuTopology")
    if gen is None:
        return {}
    return {"cloud.google.com/gke-tpu-accelerator": gen.accelerator_label,
            **({"cloud.google.com/gke-tpu-topology": top} if top else {})}


def _region(location: str) -> str:
    """us-east5-b -> us-east5; a region is itself."""
    return location.rsplit("-", 1)[0] if location.count("-") > 1 else location


def kubelet_refusal(spec: dict) -> str | None:
    """What GKE's API reference says of a pool's graceful node shutdown
    fields (NodeKubeletConfig: shutdownGracePeriodSeconds "only valid for
    Spot VMs. Allowed values: 0, 30, 120"; the critical pods' part "<="
    it, "only valid if" it "is set", "Range: [0, 120]"), refused as the
    fake words it (GKE's own error text is not known here). The pool's
    config keeps what was sent (config.kubeletConfig), as GKE returns it."""
    cfg = spec.get("config") or {}
    k = cfg.get("kubeletConfig") or {}
    total, critical = k.get("shutdownGracePeriodSeconds"), k.get("shutdownGracePeriodCriticalPodsSeconds")
    if total is None:
        return None if critical is None else "shutdownGracePeriodCriticalPodsSeconds is only valid if " \
                                               "shutdownGracePeriodSeconds is set"
    if total not in (0, 30, 120):
        return f"shutdownGracePeriodSeconds {total}: allowed values: 0, 30, 120"
    if not (cfg.get("spot") or cfg.get("preemptible")):
        return "shutdownGracePeriodSeconds is only valid for Spot VMs"
    if critical is not None and not 0 <= critical <= total:
        return f"shutdownGracePeriodCriticalPodsSeconds {critical}: must be 0 to shutdownGracePeriodSeconds ({total})"
    return None


def pool_capacity(spec: dict) -> str:
    """The capacity option of a node pool (as asked of the API, or as it shows)."""
    cfg = spec.get("config") or {}
    if cfg.get("flexStart"):
        return "flex-start"
    if cfg.get("spot") or cfg.get("preemptible"):
        return "spot"
    if (cfg.get("reservationAffinity") or {}).get("consumeReservationType") == "SPECIFIC_RESERVATION":
        return "reservation"
    return "on-demand"


def pool_chips(spec: dict) -> int:
    """The TPU chips a pool's nodes hold (ct6e-standard-4t: 4 per node)."""
    mt = str((spec.get("config") or {}).get("machineType", ""))
    gen = of_machine_type(mt)
    return gen.machine_types[mt].chips * int(spec.get("initialNodeCount") or 0) if gen else 0


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
