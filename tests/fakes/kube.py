"""A small fake of a GKE cluster's Kubernetes API server, over HTTPS with its
own CA, enough for kubectl: /version, legacy discovery, namespaced CRUD with
label and field selectors, client-side ``kubectl apply`` (GET, then POST or
PATCH), and a stand-in for KubeRay that makes a RayCluster ready and gives it
pods (one head, ``replicas x numOfHosts`` workers labelled
``ray.io/node-type=worker``, each multi-host replica's pods labelled
``replicaIndex: <group>-<replica>`` as GKE's TPU webhook labels them),
recreating a worker pod that is deleted. A bearer token's scheme is taken in
any case, as the real API server takes it (the kubernetes client's
in-cluster loader sends "bearer"). RBAC's four kinds are stored as given, a
binding's ``roleRef`` refused when changed, as the API server refuses it.
The clients' token is the cluster admin's: nothing is refused to it. A
service account's token (``sa_token``, what a pod of that account holds) is
authorized by the RBAC objects stored, as the API server's RBAC authorizer
does (``_authorize``), and refused in its words (403 Forbidden). A pod
KubeRay makes runs as its group template's ``serviceAccountName``.

It also decides which worker pods run, as the scheduler would: once the
cluster has TPU node pools (``set_pool_nodes``, called by the GCP fake), a
replica runs only on a pool with a whole slice of nodes (one replica per
``numOfHosts`` nodes of a pool); the others stay Pending, unschedulable
("Insufficient google.com/tpu"), until nodes come. Without TPU pools
(Autopilot makes its nodes itself) every pod runs. A running worker is
given a free node of a TPU pool (``spec.nodeName``), never a cordoned one
nor one with a NoSchedule taint (the pods tolerate none): when only such
nodes are free (or none is) it stays Pending with the scheduler's words. A pool made
again gets nodes of new names, as GKE's.
"""
from __future__ import annotations

import copy
import itertools
import json
import re
import threading
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

from .server import Fake, FakeServer, HttpError, Request, Response
from .tls import Pki

VERSION = {"major": "1", "minor": "35", "gitVersion": "v1.35.2-gke.1842000",
           "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
           "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24.4", "compiler": "gc",
           "platform": "linux/amd64"}

_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class Kind:
    group: str          # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def resource(self) -> dict:
        return {"name": self.plural, "singularName": self.kind.lower(), "namespaced": self.namespaced,
                "kind": self.kind, "verbs": _VERBS, **({"shortNames": list(self.short)} if self.short else {})}


KINDS = (
    Kind("", "v1", "namespaces", "Namespace", namespaced=False, short=("ns",)),
    Kind("", "v1", "serviceaccounts", "ServiceAccount", short=("sa",)),
    Kind("", "v1", "pods", "Pod", short=("po",)),
    Kind("", "v1", "services", "Service", short=("svc",)),
    Kind("ray.io", "v1", "rayclusters", "RayCluster"),
    Kind("ray.io", "v1", "rayjobs", "RayJob"),
    Kind("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate"),
    Kind("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim"),
    Kind("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False),
    Kind("cloud.google.com", "v1", "computeclasses", "ComputeClass", namespaced=False, short=("cc",)),
    Kind("", "v1", "events", "Event", short=("ev",)),
    Kind("", "v1", "nodes", "Node", namespaced=False, short=("no",)),
    Kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    Kind("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    Kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
)
BINDINGS = ("clusterrolebindings", "rolebindings")

# GKE Autopilot's admission webhook, as it refuses a privileged container,
# or a capability not on its list (the list as its message gives it, quoted
# in CrowdStrike/falcon-helm issue #310).
WARDEN_DENIED = ('admission webhook "warden-validating.common-webhooks.networking.gke.io" denied the request: GKE '
                 'Warden rejected the request because it violates one or more constraints. Violations details: ')
WARDEN = WARDEN_DENIED + \
    '{{"[denied by autogke-disallow-privilege]":["container {name} is privileged; not allowed in Autopilot"]}}'
WARDEN_CAPABILITIES = ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                       "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT", "SYS_PTRACE")
WARDEN_CAPABILITY = WARDEN_DENIED + (
    '{{"[denied by autogke-default-linux-capabilities]":["linux capability \'{cap}\' on container \'{name}\' not '
    'allowed; Autopilot only allows the capabilities: \'' + ",".join(WARDEN_CAPABILITIES) + '\'."]}}')


def status(code: int, reason: str, message: str, **details: Any) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "details": details, "code": code}


def not_found(kind: Kind, name: str) -> HttpError:
    what = f"{kind.plural}.{kind.group}" if kind.group else kind.plural
    return HttpError(404, status(404, "NotFound", f'{what} "{name}" not found', name=name, kind=kind.plural,
                                 **({"group": kind.group} if kind.group else {})))


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (also used, approximately, for strategic
    merge patches: lists are replaced, directives dropped)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


RUNNING = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def _ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _matches(labels: dict, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        m = re.match(r"^([^!=\s]+)\s*(==|=|!=)\s*(.*)$", term)
        if m:
            k, op, v = m.groups()
            if (labels.get(k) == v) != (op != "!="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _field_matches(obj: dict, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        k, _, v = term.partition("=")
        k, v = k.rstrip("="), v.lstrip("=")
        path = {"metadata.name": obj["metadata"].get("name"),
                "metadata.namespace": obj["metadata"].get("namespace")}.get(k)
        if path != v:
            return False
    return True


# -- protobuf: kubectl sends built-in objects (``kubectl create sa``) as
# application/vnd.kubernetes.protobuf. The fake reads the envelope and the
# ObjectMeta (field 1 of every top-level object); other fields are dropped.
def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = n = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def _fields(buf: bytes) -> list[tuple[int, Any]]:
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"protobuf wire type {wire}")
        out.append((num, v))
    return out


def _object_meta(buf: bytes) -> dict:
    md: dict[str, Any] = {}
    names = {1: "name", 2: "generateName", 3: "namespace"}
    for num, v in _fields(buf):
        if num in names:
            md[names[num]] = v.decode()
        elif num in (11, 12):
            entry = dict(_fields(v))
            md.setdefault("labels" if num == 11 else "annotations", {})[entry.get(1, b"").decode()] = \
                entry.get(2, b"").decode()
    return md


def decode_protobuf(data: bytes) -> dict:
    if not data.startswith(b"k8s\x00"):
        raise ValueError("not a Kubernetes protobuf envelope")
    env = dict(_fields(data[4:]))
    tm = dict(_fields(env.get(1, b"")))
    obj = {"apiVersion": tm.get(1, b"").decode(), "kind": tm.get(2, b"").decode()}
    for num, v in _fields(env.get(2, b"")):
        if num == 1:
            obj["metadata"] = _object_meta(v)
    return obj


def openapi_v3_root() -> dict:
    gvs = sorted({k.prefix.lstrip("/") for k in KINDS})
    return {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={zlib.crc32(gv.encode()):08X}"} for gv in gvs}}


def openapi_v3_doc(gv_path: str) -> dict | None:
    """Just enough OpenAPI v3 for kubectl to see that the server validates
    fields itself (a PATCH with a fieldValidation query parameter per kind),
    so that it sends fieldValidation=Strict rather than validating locally."""
    kinds = [k for k in KINDS if k.prefix.lstrip("/") == gv_path]
    if not kinds:
        return None
    paths = {}
    for k in kinds:
        ns = "/namespaces/{namespace}" if k.namespaced else ""
        paths[f"{k.prefix}{ns}/{k.plural}/{{name}}"] = {"patch": {
            "operationId": f"patch{k.kind}",
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": k.group, "version": k.version, "kind": k.kind},
            "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                           {"name": "fieldManager", "in": "query", "schema": {"type": "string"}}],
            "responses": {"200": {"description": "OK"}}}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": VERSION["gitVersion"]},
            "paths": paths, "components": {"schemas": {}}}


class FakeKube(Fake):
    """The cluster's API server and its controllers (KubeRay's part)."""

    def __init__(self, pki: Pki, token: str):
        self.pki, self.token = pki, token
        self.lock = threading.RLock()
        self._rv = itertools.count(1000)
        self.objects: dict[tuple[str, str, str], dict] = {}   # (plural, namespace, name) -> object
        self.ray_ready = True       # KubeRay makes a RayCluster ready at once
        # For benchmarks: a RayCluster becomes ready ray_latency s after it is
        # applied, and only once ray_gate() says its TPU nodes exist.
        self.ray_latency = 0.0
        self.ray_gate = lambda: True
        self.sa_tokens: dict[str, tuple[str, str]] = {}   # a service account's token -> (namespace, name)
        self._ray_pending: dict[tuple[str, str], float] = {}
        self.autopilot = False      # set when the cluster it serves is Autopilot (its rules apply)
        self.tpu_pools: dict[str, int] = {}   # TPU node pool -> its ready nodes (set_pool_nodes)
        self.dead_kubelets: set[str] = set()  # nodes whose kubelet is gone (stop_kubelet)
        self.server = FakeServer("kube", pki, self.handle, self.check_auth)
        self.url = self.server.url
        self.endpoint = self.url.split("://", 1)[1]
        self.reset()

    def reset(self) -> None:
        """A new, empty cluster: its built-in namespaces and default service accounts."""
        with self.lock:
            self.objects.clear()
            self.autopilot = False
            self.tpu_pools = {}
            self.dead_kubelets = set()
            for ns in ("default", "kube-system", "kube-public"):
                self._put(KIND["namespaces"], {"metadata": {"name": ns}, "spec": {"finalizers": ["kubernetes"]},
                                               "status": {"phase": "Active"}})
                self._put(KIND["serviceaccounts"], {"metadata": {"name": "default", "namespace": ns}})
            self._put(KIND["deviceclasses"], {"metadata": {"name": "netdev.google.com"}, "spec": {}})
        self.server.clear_faults()

    @property
    def requests(self) -> list[Request]:
        return self.server.since(0)

    # -- store ----------------------------------------------------------------
    def _put(self, kind: Kind, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        md = obj.setdefault("metadata", {})
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        if not kind.namespaced:
            md.pop("namespace", None)
        key = (kind.plural, md.get("namespace", "") if kind.namespaced else "", md["name"])
        old = self.objects.get(key)
        md.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
        md.setdefault("creationTimestamp", old["metadata"]["creationTimestamp"] if old else
                      time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        md["resourceVersion"] = str(next(self._rv))
        if old is None or old.get("spec") != obj.get("spec"):
            md["generation"] = (old["metadata"].get("generation", 0) if old else 0) + 1
        else:
            md["generation"] = old["metadata"].get("generation", 1)
        self.objects[key] = obj
        return obj

    def get(self, plural: str, name: str, namespace: str = "") -> dict | None:
        return self.objects.get((plural, namespace if KIND[plural].namespaced else "", name))

    def list(self, plural: str, namespace: str | None = None, selector: str = "") -> list[dict]:
        return [o for (p, ns, _), o in sorted(self.objects.items())
                if p == plural and (namespace is None or ns == namespace)
                and _matches(o["metadata"].get("labels") or {}, selector)]

    def create(self, plural: str, obj: dict) -> dict:
        """Create as the API server would, then let the controllers react."""
        with self.lock:
            kind = KIND[plural]
            out = self._put(kind, obj)
            self._react(kind, out)
            return out

    def delete(self, plural: str, name: str, namespace: str = "") -> dict | None:
        with self.lock:
            kind = KIND[plural]
            obj = self.objects.pop((plural, namespace if kind.namespaced else "", name), None)
            if obj is not None:
                self._reacted_delete(kind, obj)
            return obj

    # -- HTTP -------------------------------------------------------------------
    def check_auth(self, req: Request) -> None:
        """A bearer token, the scheme's name in any case as the API server
        takes it (the kubernetes client's in-cluster loader sends "bearer")."""
        scheme, _, token = (req.headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or (token != self.token and token not in self.sa_tokens):
            raise HttpError(401, status(401, "Unauthorized", "Unauthorized"))

    def sa_token(self, namespace: str, name: str) -> str:
        """A bearer token of service account ``namespace/name``, as a pod
        running as it holds one: what it may do is what the stored RBAC
        objects grant it."""
        token = f"sa-{uuid.uuid4().hex}"
        self.sa_tokens[token] = (namespace, name)
        return token

    def _authorize(self, req: Request, kind: Kind, ns: str, name: str | None, sub: str | None) -> None:
        """A service account's request, refused in the API server's words
        (403 Forbidden) unless the stored RBAC objects grant it (``_granted``)."""
        account = self.sa_tokens.get((req.headers.get("authorization") or "").partition(" ")[2])
        if account is None:
            return
        watch = req.query.get("watch") in ("true", "True", "1")
        verb = ("watch" if watch else "get" if name else "list") if req.method == "GET" else {
            "POST": "create", "PUT": "update", "PATCH": "patch"}.get(req.method, "delete" if name else "deletecollection")
        resource, scope = f"{kind.plural}/{sub}" if sub else kind.plural, ns if kind.namespaced else ""
        with self.lock:
            if self._granted(account, verb, kind.group, resource, scope):
                return
        what = f"{kind.plural}.{kind.group}" if kind.group else kind.plural
        said = (f'User "system:serviceaccount:{account[0]}:{account[1]}" cannot {verb} resource "{resource}" in API '
                f'group "{kind.group}" ' + (f'in the namespace "{scope}"' if scope else "at the cluster scope"))
        raise HttpError(403, status(403, "Forbidden", (f'{what} "{name}"' if name else what) + f" is forbidden: {said}",
                                    **({"name": name} if name else {}), group=kind.group, kind=kind.plural))

    def _granted(self, account: tuple[str, str], verb: str, group: str, resource: str, scope: str) -> bool:
        """Whether a binding of this service account (by name, or a group
        every service account is in) grants ``verb`` on ``resource`` of API
        ``group`` in namespace ``scope`` ("": cluster-scoped): a
        ClusterRoleBinding everywhere, a RoleBinding in its own namespace
        only; a rule's apiGroups, resources and verbs each holding it or "*"
        (https://kubernetes.io/docs/reference/access-authn-authz/rbac/)."""
        ns, sa = account
        members = {("ServiceAccount", ns, sa), ("User", "", f"system:serviceaccount:{ns}:{sa}"),
                   ("Group", "", "system:serviceaccounts"), ("Group", "", f"system:serviceaccounts:{ns}"),
                   ("Group", "", "system:authenticated")}
        for b in self.list("clusterrolebindings") + self.list("rolebindings"):
            where, ref = b["metadata"].get("namespace", ""), b.get("roleRef") or {}
            if (where and where != scope) or not any(
                    (s.get("kind"), s.get("namespace", "") if s.get("kind") == "ServiceAccount" else "", s.get("name"))
                    in members for s in b.get("subjects") or []):
                continue
            role = self.get("roles", ref.get("name", ""), where) if ref.get("kind") == "Role" else \
                self.get("clusterroles", ref.get("name", ""))
            for rule in (role or {}).get("rules") or []:
                if all("*" in (rule.get(f) or []) or v in (rule.get(f) or [])
                       for f, v in (("apiGroups", group), ("resources", resource), ("verbs", verb))):
                    return True
        return False

    def handle(self, req: Request) -> Response:
        with self.lock:
            self._tick()
        path = req.path.rstrip("/") or "/"
        if req.method == "GET" and req.query.get("watch") in ("true", "True", "1") and req.query.get("resourceVersion"):
            self._wait_for_change(req)
        if path == "/version":
            return Response(200, VERSION)
        if path == "/openapi/v3":
            return Response(200, openapi_v3_root())
        if path.startswith("/openapi/v3/"):
            doc = openapi_v3_doc(path[len("/openapi/v3/"):])
            if doc is not None:
                return Response(200, doc)
        if path == "/api":
            return Response(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": self.endpoint}]})
        if path == "/apis":
            return Response(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                 "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}}
                for g, v in sorted({(k.group, k.version) for k in KINDS if k.group})]})
        for gv_path in {k.prefix for k in KINDS}:
            if path == gv_path:
                kinds = [k for k in KINDS if k.prefix == gv_path]
                resources = [k.resource() for k in kinds]
                for k in kinds:
                    if k.plural in ("rayclusters", "pods"):
                        resources.append({"name": f"{k.plural}/status", "singularName": "", "namespaced": True,
                                          "kind": k.kind, "verbs": ["get", "patch", "update"]})
                return Response(200, {"kind": "APIResourceList", "apiVersion": "v1",
                                      "groupVersion": kinds[0].api_version, "resources": resources})
        m = re.match(r"^(/api/v1|/apis/[^/]+/[^/]+)(?:/namespaces/([^/]+))?/([^/]+)(?:/([^/]+))?(?:/(status|log))?$",
                     path)
        if not m:
            raise HttpError(404, status(404, "NotFound", "the server could not find the requested resource"))
        prefix, ns, plural, name, sub = m.groups()
        kind = KIND.get(plural)
        if kind is None or kind.prefix != prefix or (ns is not None and not kind.namespaced):
            raise HttpError(404, status(404, "NotFound", "the server could not find the requested resource"))
        self._authorize(req, kind, ns or "", name, sub)
        with self.lock:
            return self._crud(req, kind, ns or "", name, sub)

    def _wait_for_change(self, req: Request) -> None:
        """A watch from a resourceVersion: hold it until an object of the
        list changes after that version (or its timeout, at most 5 s)."""
        since = int(req.query["resourceVersion"])
        deadline = time.monotonic() + min(5.0, float(req.query.get("timeoutSeconds") or 5))
        plural = req.path.rstrip("/").rsplit("/", 1)[-1]
        while time.monotonic() < deadline:
            with self.lock:
                self._tick()
                if any(int(o["metadata"].get("resourceVersion", 0)) > since
                       for (p, _, _), o in self.objects.items() if p == plural):
                    return
            time.sleep(0.05)

    @staticmethod
    def body(req: Request) -> Any:
        """A request's body, JSON or (kubectl create) protobuf, as a dict."""
        if "protobuf" in req.headers.get("content-type", ""):
            return decode_protobuf(req.raw)
        return req.body

    def _crud(self, req: Request, kind: Kind, ns: str, name: str | None, sub: str | None) -> Response:
        if kind.namespaced and ns and self.get("namespaces", ns) is None and req.method != "GET":
            raise HttpError(404, status(404, "NotFound", f'namespaces "{ns}" not found', name=ns, kind="namespaces"))
        if name is None:
            if req.method == "GET":
                return self._list(req, kind, ns)
            if req.method == "POST":
                return self._post(req, kind, ns)
            raise HttpError(405, status(405, "MethodNotAllowed", "method not allowed"))
        cur = self.get(kind.plural, name, ns)
        if req.method == "GET":
            if cur is None:
                raise not_found(kind, name)
            if sub == "log":  # a pod's log: what a test gave it
                lines = (cur.get("_log") or "").splitlines()
                tail = int(req.query.get("tailLines") or 0)
                text = "\n".join(lines[-tail:] if tail else lines)
                return Response(200, text.encode(), {"Content-Type": "text/plain"})
            return Response(200, {k: v for k, v in cur.items() if not k.startswith("_")})
        if cur is None:
            raise not_found(kind, name)
        if req.method == "DELETE":
            if kind.plural == "pods" and (cur.get("spec") or {}).get("nodeName") in self.dead_kubelets:
                kept = self._terminating(req, cur)
                if kept is not None:
                    return Response(200, kept)
            return Response(200, self.delete(kind.plural, name, ns))
        if req.method in ("PATCH", "PUT"):
            return self._update(req, kind, ns, name, sub, cur)
        raise HttpError(405, status(405, "MethodNotAllowed", "method not allowed"))

    def _list(self, req: Request, kind: Kind, ns: str) -> Response:
        items = [{k: v for k, v in o.items() if not k.startswith("_")}
                 for o in self.list(kind.plural, ns if kind.namespaced and ns else None,
                                    req.query.get("labelSelector", ""))
                 if _field_matches(o, req.query.get("fieldSelector", ""))]
        if req.query.get("watch") in ("true", "True", "1"):
            # One event per object (changed ones, from a resourceVersion), then the stream ends.
            since = int(req.query.get("resourceVersion") or 0)
            kind_of = "MODIFIED" if since else "ADDED"
            body = "".join(json.dumps({"type": kind_of, "object": o}) + "\n" for o in items
                           if int(o["metadata"].get("resourceVersion", 0)) > since)
            return Response(200, body.encode(), {"Content-Type": "application/json"})
        return Response(200, {"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                              "metadata": {"resourceVersion": str(next(self._rv))}, "items": items})

    def _post(self, req: Request, kind: Kind, ns: str) -> Response:
        obj = self.body(req)
        if not isinstance(obj, dict) or not (obj.get("metadata") or {}).get("name"):
            raise HttpError(422, status(422, "Invalid", f"{kind.kind} is invalid: metadata.name: Required value"))
        if kind.namespaced:
            obj["metadata"]["namespace"] = obj["metadata"].get("namespace") or ns
        if self.get(kind.plural, obj["metadata"]["name"], ns) is not None:
            what = f"{kind.plural}.{kind.group}" if kind.group else kind.plural
            raise HttpError(409, status(409, "AlreadyExists", f'{what} "{obj["metadata"]["name"]}" already exists',
                                        name=obj["metadata"]["name"], kind=kind.plural))
        obj.pop("status", None)
        return Response(201, self.create(kind.plural, obj))

    def _update(self, req: Request, kind: Kind, ns: str, name: str, sub: str | None, cur: dict) -> Response:
        body = self.body(req)
        if req.method == "PUT":
            new = body
        elif "json-patch" in req.headers.get("content-type", ""):
            raise HttpError(415, status(415, "UnsupportedMediaType", "json-patch is not supported by the fake"))
        else:
            new = merge_patch(cur, body)
        if kind.plural in BINDINGS and new.get("roleRef") != cur.get("roleRef"):
            # The API server's validation: a binding's roleRef never changes (delete and create it again).
            said = f'Invalid value: {json.dumps(new.get("roleRef"))}: cannot change roleRef'
            raise HttpError(422, status(422, "Invalid", f'{kind.kind}.{kind.group} "{name}" is invalid: roleRef: {said}',
                                        name=name, kind=kind.kind, group=kind.group,
                                        causes=[{"reason": "FieldValueInvalid", "message": said, "field": "roleRef"}]))
        new = copy.deepcopy(new)
        new["metadata"] = dict(new.get("metadata") or {}, name=name)
        if kind.namespaced:
            new["metadata"]["namespace"] = ns
        if sub != "status":
            new["status"] = cur.get("status")          # status is a subresource
        else:
            new["spec"] = cur.get("spec")
        for k in ("uid", "creationTimestamp"):
            new["metadata"][k] = cur["metadata"][k]
        out = self._put(kind, new)
        if sub != "status":
            self._react(kind, out)
        return Response(200, self.get(kind.plural, name, ns))

    # -- controllers --------------------------------------------------------------
    def _react(self, kind: Kind, obj: dict) -> None:
        if kind.plural == "rayclusters" and self.ray_ready:
            if self.ray_latency > 0:
                md = obj["metadata"]
                self._ray_pending[(md["namespace"], md["name"])] = time.monotonic() + self.ray_latency
                return
            self._reconcile_ray(obj)

    def _tick(self) -> None:
        for (ns, name), at in list(self._ray_pending.items()):
            rc = self.objects.get(("rayclusters", ns, name))
            if rc is None:
                del self._ray_pending[(ns, name)]
            elif at <= time.monotonic() and self.ray_gate():
                del self._ray_pending[(ns, name)]
                self._reconcile_ray(rc)

    def _reacted_delete(self, kind: Kind, obj: dict) -> None:
        md = obj["metadata"]
        if kind.plural == "rayclusters":
            for pod in self.list("pods", md.get("namespace"), f"ray.io/cluster={md['name']}"):
                self.objects.pop(("pods", md.get("namespace"), pod["metadata"]["name"]), None)
        if kind.plural == "namespaces":
            for key in [k for k in self.objects if k[1] == md["name"]]:
                del self.objects[key]
        if kind.plural == "pods":
            labels = md.get("labels") or {}
            rc = self.get("rayclusters", labels.get("ray.io/cluster", ""), md.get("namespace", ""))
            if rc is not None and labels.get("ray.io/node-type") == "worker":
                # KubeRay replaces a lost worker (the same replica and host).
                self._pod(rc, "worker", labels.get("ray.io/group", ""), obj.get("_replica", 0), obj.get("_host", 0))

    def _admit(self, rc: dict, node_type: str, group: str) -> str | None:
        """Why the pod of this group would be refused or left Pending (None:
        it runs): Autopilot's Warden denies privileged containers and
        capabilities off its list; a pod
        that selects a ComputeClass that does not exist gets no node."""
        spec = (rc.get("spec") or {})
        if node_type == "head":
            tpl = ((spec.get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
        else:
            tpl = next(((g.get("template") or {}).get("spec") or {} for g in spec.get("workerGroupSpecs") or []
                        if g.get("groupName") == group), {})
        if self.autopilot:
            for c in tpl.get("containers") or []:
                sc = c.get("securityContext") or {}
                if sc.get("privileged"):
                    return WARDEN.format(name=c.get("name"))
                for cap in (sc.get("capabilities") or {}).get("add") or []:
                    if cap not in WARDEN_CAPABILITIES:
                        return WARDEN_CAPABILITY.format(cap=cap, name=c.get("name"))
        cc = (tpl.get("nodeSelector") or {}).get("cloud.google.com/compute-class")
        if cc and self.get("computeclasses", cc) is None:
            return f'0/3 nodes are available: ComputeClass "{cc}" not found'
        return None

    def _event(self, obj: dict, reason: str, message: str) -> None:
        md = obj["metadata"]
        self._put(KIND["events"], {"metadata": {"name": f"{md['name']}.{uuid.uuid4().hex[:10]}",
                                                "namespace": md.get("namespace", "default")},
                                   "involvedObject": {"kind": obj.get("kind"), "name": md["name"],
                                                      "namespace": md.get("namespace")},
                                   "reason": reason, "message": message, "type": "Warning"})

    def _hosts(self, rc: dict, group: str) -> int:
        return next((int(g.get("numOfHosts") or 1) for g in (rc.get("spec") or {}).get("workerGroupSpecs") or []
                     if g.get("groupName") == group), 1)

    def _fits(self, hosts: int, replica: int) -> bool:
        """Replica ``replica`` has a pool of its own with a whole slice of nodes."""
        if not self.tpu_pools:
            return True
        return replica < sum(n // hosts for n in self.tpu_pools.values())

    def _unschedulable(self, why: str | None = None) -> dict:
        n = len(self.list("nodes"))
        return {"phase": "Pending", "conditions": [
            {"type": "Ready", "status": "False"},
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": why or f"0/{n} nodes are available: {n} Insufficient google.com/tpu."}]}

    def _node_for(self) -> tuple[str | None, str | None]:
        """The scheduler's choice for a TPU worker pod: a node of a TPU pool
        that no pod holds, not cordoned and without a NoSchedule taint (the
        pods tolerate none): (node, None); (None, why) when the only free
        nodes are refused or every one is taken; (None, None) without TPU
        pool nodes (the pod runs as before: the pools' counts decide)."""
        nodes = [n for n in self.list("nodes")
                 if (n["metadata"].get("labels") or {}).get("cloud.google.com/gke-nodepool") in self.tpu_pools]
        taken = {(p.get("spec") or {}).get("nodeName") for p in self.list("pods")}
        free = [n for n in nodes if n["metadata"]["name"] not in taken]
        good = [n for n in free if not (n.get("spec") or {}).get("unschedulable") and not any(
            t.get("effect") in ("NoSchedule", "NoExecute") for t in (n.get("spec") or {}).get("taints") or [])]
        if good:
            return good[0]["metadata"]["name"], None
        if nodes:
            return None, (f"0/{len(nodes)} nodes are available: {len(free)} node(s) were unschedulable or had "
                          f"untolerated taints, {len(nodes) - len(free)} node(s) were taken.")
        return None, None

    def _pod(self, rc: dict, node_type: str, group: str = "", replica: int = 0, host: int = 0) -> dict | None:
        why = self._admit(rc, node_type, group)
        if why is not None:
            self._event(rc, "FailedCreateWorkerPod" if node_type == "worker" else "FailedCreateHeadPod", why)
            return None
        md = rc["metadata"]
        suffix = uuid.uuid4().hex[:5]
        name = f"{md['name']}-head-{suffix}" if node_type == "head" else f"{md['name']}-{group}-worker-{suffix}"
        labels = {"ray.io/cluster": md["name"], "ray.io/node-type": node_type, "ray.io/is-ray-node": "yes",
                  "ray.io/group": group or "headgroup", "app.kubernetes.io/created-by": "kuberay-operator"}
        hosts = self._hosts(rc, group) if node_type == "worker" else 1
        if node_type == "worker" and hosts > 1:
            labels["replicaIndex"] = f"{group}-{replica}"   # GKE's TPU webhook, on a multi-host replica's pods
        fits = node_type == "head" or self._fits(hosts, replica)
        node, refused = self._node_for() if fits and node_type == "worker" else (None, None)
        pod = {"metadata": {"name": name, "namespace": md["namespace"], "labels": labels,
                            "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster",
                                                 "name": md["name"], "uid": md["uid"], "controller": True}]},
               "spec": {"containers": [{"name": f"ray-{node_type}", "image": "rayproject/ray"}],
                        "serviceAccountName": self._template(rc, node_type, group).get("serviceAccountName") or "default"},
               "status": copy.deepcopy(RUNNING) if fits and not refused else self._unschedulable(refused)}
        if node:
            pod["spec"]["nodeName"] = node
        if node_type == "worker":
            pod.update({"_replica": replica, "_host": host})
            if not fits or refused:
                pod["_unscheduled"] = True
        return self._put(KIND["pods"], pod)

    @staticmethod
    def _template(rc: dict, node_type: str, group: str) -> dict:
        """The pod spec of the RayCluster's head or of its worker group ``group``."""
        spec = rc.get("spec") or {}
        groups = [spec.get("headGroupSpec") or {}] if node_type == "head" else [
            g for g in spec.get("workerGroupSpecs") or [] if g.get("groupName") == group]
        return ((next(iter(groups), {}).get("template") or {}).get("spec")) or {}

    def _reconcile_ray(self, rc: dict) -> None:
        md, spec = rc["metadata"], rc.get("spec") or {}
        ns, name = md["namespace"], md["name"]
        pods = self.list("pods", ns, f"ray.io/cluster={name}")
        if not any((p["metadata"]["labels"] or {}).get("ray.io/node-type") == "head" for p in pods):
            self._pod(rc, "head")
        desired = made = 0
        for g in spec.get("workerGroupSpecs") or []:
            group = g.get("groupName", "")
            replicas, hosts = int(g.get("replicas") or 0), int(g.get("numOfHosts") or 1)
            desired += replicas * hosts
            have = list(self.list("pods", ns, f"ray.io/cluster={name},ray.io/group={group},"
                                                     f"ray.io/node-type=worker"))
            taken = {(p.get("_replica", 0), p.get("_host", 0)) for p in have}
            for r in range(replicas):
                for h in range(hosts):
                    if (r, h) not in taken:
                        self._pod(rc, "worker", group, r, h)
            for p in have:
                if p.get("_replica", 0) >= replicas:
                    self.objects.pop(("pods", ns, p["metadata"]["name"]), None)
                elif p.get("_unscheduled") and self._fits(hosts, p.get("_replica", 0)):
                    # Nodes came: the scheduler places the pending pod.
                    node, refused = self._node_for()
                    if refused:
                        continue
                    if node:
                        p["spec"]["nodeName"] = node
                    p["status"] = copy.deepcopy(RUNNING)
                    del p["_unscheduled"]
                    p["metadata"]["resourceVersion"] = str(next(self._rv))
            made += len([p for p in self.list("pods", ns, f"ray.io/cluster={name},ray.io/group={group},"
                                                          f"ray.io/node-type=worker") if _ready(p)])
        cur = self.objects[("rayclusters", ns, name)]
        head = any((p["metadata"]["labels"] or {}).get("ray.io/node-type") == "head" and _ready(p)
                   for p in self.list("pods", ns, f"ray.io/cluster={name}"))
        # KubeRay sets state "ready" once every pod is; before, none (its
        # "suspended" is for spec.suspend).
        cur["status"] = {**({"state": "ready"} if made == desired and head else {}),
                         "desiredWorkerReplicas": desired, "availableWorkerReplicas": made,
                         "readyWorkerReplicas": made, "minWorkerReplicas": 0, "maxWorkerReplicas": desired,
                         "desiredTPU": str(desired * 4), "observedGeneration": md.get("generation", 1),
                         "head": {"podName": f"{name}-head", "serviceName": f"{name}-head-svc"},
                         "conditions": [{"type": "RayClusterProvisioned", "status": str(made == desired and head),
                                         "reason": "AllPodRunningAndReadyFirstTime"},
                                        {"type": "HeadPodReady", "status": str(head), "reason": "HeadPodRunningAndReady"}],
                         "lastUpdateTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        cur["metadata"]["resourceVersion"] = str(next(self._rv))

    def set_pool_nodes(self, pool: str, count: int, labels: dict | None = None) -> None:
        """The nodes of a node pool (made by the GCP fake with the pool): Ready,
        with GKE's TPU labels (accelerator, topology). Pending workers that
        now fit are scheduled."""
        with self.lock:
            self.tpu_pools[pool] = count
            made = uuid.uuid4().hex[:8]   # as GKE names a pool's nodes: new names for a pool made again
            for key in [k for k, o in self.objects.items() if k[0] == "nodes" and
                        (o["metadata"].get("labels") or {}).get("cloud.google.com/gke-nodepool") == pool]:
                del self.objects[key]
            for i in range(count):
                self._put(KIND["nodes"], {"metadata": {"name": f"gke-{pool}-{made}-{i:04d}", "labels": {
                    **(labels or {}), "cloud.google.com/gke-nodepool": pool}}, "spec": {},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
            for rc in self.list("rayclusters"):
                if self.ray_ready and (rc["metadata"]["namespace"], rc["metadata"]["name"]) not in self._ray_pending:
                    self._reconcile_ray(rc)

    def _terminating(self, req: Request, pod: dict) -> dict | None:
        """A graceful DELETE of a pod whose node's kubelet is gone: the API
        server marks it (deletionTimestamp) and keeps it, Terminating, since
        only its kubelet would confirm its end; a DELETE with
        gracePeriodSeconds=0 (``kubectl delete --grace-period=0 --force``)
        removes it: None."""
        body = req.body if isinstance(req.body, dict) else {}
        grace = body.get("gracePeriodSeconds", req.query.get("gracePeriodSeconds"))
        if grace is not None and int(grace) == 0:
            return None
        md = pod["metadata"]
        if "deletionTimestamp" not in md:
            seconds = int(grace) if grace is not None else 30   # the pod's terminationGracePeriodSeconds' default
            md["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))
            md["deletionGracePeriodSeconds"] = seconds
            md["resourceVersion"] = str(next(self._rv))
        return {k: v for k, v in pod.items() if not k.startswith("_")}

    # -- views and faults for tests ---------------------------------------------------
    def snapshot(self) -> tuple:
        """The cluster's state (its objects, its pools' nodes, the dead
        kubelets, the RayClusters not yet ready), for ``restore``: a test
        runs one write two ways from the same state."""
        with self.lock:
            return copy.deepcopy((self.objects, self.tpu_pools, self.dead_kubelets, self._ray_pending,
                                  self.autopilot))

    def restore(self, saved: tuple) -> None:
        """The state ``snapshot`` took, back (resource versions go on rising)."""
        with self.lock:
            objects, self.tpu_pools, self.dead_kubelets, self._ray_pending, self.autopilot = copy.deepcopy(saved)
            self.objects.clear()
            self.objects.update(objects)

    def stop_kubelet(self, node: str) -> None:
        """The node's kubelet dead, as a sick host leaves it: the node
        NotReady (its Ready condition Unknown, as the node controller sets
        it), and a pod there deleted gracefully stays Terminating (it is
        never confirmed gone) until a delete with grace period 0."""
        with self.lock:
            self.dead_kubelets.add(node)
            n = self.get("nodes", node)
            n.setdefault("status", {})["conditions"] = [{"type": "Ready", "status": "Unknown",
                                                         "reason": "NodeStatusUnknown",
                                                         "message": "Kubelet stopped posting node status."}]
            n["metadata"]["resourceVersion"] = str(next(self._rv))

    def worker_pods(self, namespace: str) -> list[str]:
        return [p["metadata"]["name"] for p in self.list("pods", namespace, "ray.io/node-type=worker")]

    def break_pod(self, namespace: str, name: str, *, phase: str = "Pending", scheduled: str | None = None,
                  waiting: tuple[str, str] | None = None, restarts: int = 0, log: str = "",
                  events: tuple[tuple[str, str], ...] = ()) -> dict:
        """A pod in trouble, as the kubelet and scheduler leave it: not
        ready, maybe unschedulable (the scheduler's message), a container
        waiting (reason, message), its log, its events (reason, message).
        The RayCluster's status counts it out."""
        with self.lock:
            pod = self.get("pods", name, namespace)
            st = pod["status"] = {"phase": phase, "conditions": [{"type": "Ready", "status": "False"}]}
            if scheduled is not None:
                st["conditions"].append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                         "message": scheduled})
            if waiting is not None:
                c = pod["spec"]["containers"][0]
                st["containerStatuses"] = [{"name": c["name"], "image": c.get("image", ""), "ready": False,
                                            "restartCount": restarts, "imageID": "", "started": False,
                                            "state": {"waiting": {"reason": waiting[0], "message": waiting[1]}}}]
            if log:
                pod["_log"] = log
            for reason, message in events:
                self._event(pod, reason, message)
            pod["metadata"]["resourceVersion"] = str(next(self._rv))
            rc = self.get("rayclusters", pod["metadata"]["labels"]["ray.io/cluster"], namespace)
            if rc is not None:
                self._reconcile_ray(rc)
            return pod


KIND = {k.plural: k for k in KINDS}
