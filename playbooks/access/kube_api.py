"""The `kubernetes` Python client as a speed-up of kubectl on this machine,
and as kubectl itself where there is none (a pod of the cluster).

Every Kubernetes read and the few node and pod writes of the plays are
kubectl command lines, the same on this machine and on a controller host.
Here, the local connector answers the ones it recognises through the client
instead (``core.connector.base.Shortcut``): no process, no auth-plugin start
per call (the client runs GKE's exec credential plugin once and refreshes
its token when it expires), and what kubectl prints, with its exit code.
The tests compare both answers against the fake API server: each write's
cases (tests/test_kube_api_writes.py), and every form of these commands
the dry runs' goldens hold (tests/test_in_process.py). The run's log says
of each command answered here that no kubectl process ran; a dry run marks
its line (``answers``). (The client
runs GKE's exec credential plugin with this process's environment, of which
the connector's is the stated part.) A client is made once per kubeconfig
and context, and made again when the kubeconfig's bytes change, as kubectl
reads the file on every call: a get-credentials of the same run that wrote
the context anew (a cluster made again: a new server and CA) is seen
(``kubeconfig_stamp``). What it answers:

- ``kubectl get ... --output=json`` (the plays' flags only): the API
  server's JSON, a list as kubectl's ``List`` (``get a,b,c``: each kind
  listed, in that order, in one ``List``, as kubectl prints them).
- ``kubectl logs POD [--namespace NS] [-c C] [--tail=N] [--previous]``.
- ``kubectl cordon NODE`` / ``uncordon NODE``: a strategic-merge PATCH of
  ``spec.unschedulable`` (``node/NODE cordoned``, or ``node/NODE already
  cordoned`` with no PATCH). As kubectl does, a PATCH the server refuses is
  ``error: unable to cordon node "NODE": MESSAGE`` with exit code 0 (the
  plays verify the node afterwards).
- ``kubectl taint nodes NODE KEY=VALUE:EFFECT|KEY:EFFECT|KEY-|KEY:EFFECT-
  ... [--overwrite]``: the node read, its new taints computed as kubectl's
  ``reorganizeTaints`` does (an added taint replaces one of the same key and
  effect, first in the list; a removal of a taint the node lacks is
  ``error: taint "KEY" not found``, exit 1, nothing sent; an existing key
  and effect without ``--overwrite`` is kubectl's "already has ... taint(s)"
  error), then one strategic-merge PATCH of ``spec.taints`` (a list the API
  server replaces whole). It prints ``node/NODE tainted``, ``untainted`` or
  ``modified`` (always ``modified`` with ``--overwrite``, as kubectl). A
  spec kubectl would refuse on its own (a bad key, value or effect, a taint
  added twice, added and removed at once) is not answered: kubectl says it.
- ``kubectl label nodes -l SELECTOR KEY=VALUE --overwrite`` (a slice's
  maintenance: started, or scheduled by chaos.maintenance): the nodes the
  selector lists, each patched (``node/NODE labeled``, or ``not labeled``
  where it has the label already), as kubectl label does.
- ``kubectl delete pod NAME [--namespace NS] [--grace-period=N]
  [--timeout=Ns]``: a DELETE (background propagation, the grace period
  given), ``pod "NAME" deleted``, then, as kubectl's default ``--wait``,
  until the pod of that uid is gone, within the command's timeout and at
  most ``--timeout`` seconds: then kubectl's ``error: timed out waiting for
  the condition on pods/NAME``, exit 1 (a pod whose node's kubelet is dead
  stays Terminating). With ``--force`` (and ``--grace-period=0`` or none):
  a DELETE with gracePeriodSeconds 0, ``pod "NAME" force deleted`` and
  kubectl's warning on stderr that it does not wait for the kubelet.

A server's refusal is kubectl's ``Error from server (Reason): message``,
exit code 1; an unreachable server (or credentials that could not be had)
``Unable to connect to the server: ...``, exit code 1. A command line with a
flag it does not know returns None: it runs as a process.

In the cluster: a process in a pod (the watch on the Ray head) has no
kubectl and no kubeconfig, only the pod's service account. With
``TPU_PLAYBOOKS_IN_CLUSTER=1`` in the connector's environment
(``IN_CLUSTER_ENV``, set by the watch's job), the client is made from the
service account as ``kubernetes.config.load_incluster_config`` makes it (its
``InClusterConfigLoader``, here with ``SERVICE_ACCOUNT_DIR``'s token and
ca.crt: it reads the projected token again a minute after each read, so a
rotated token is used), the API server at ``KUBERNETES_SERVICE_HOST`` /
``KUBERNETES_SERVICE_PORT``; ``--context=`` and KUBECONFIG are ignored. A
kubectl command it does not answer is not run (there is no kubectl): exit
code 127, and one line on stderr naming the command and saying it is not
answered in the cluster. (The connector offers a command given stdin or a
working folder to no shortcut: such a kubectl fails there as a command not
found, 127 too.)

The client is imported only when a command comes (it is a heavy import).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from playbooks.access.gcloud_credentials import GcloudCredentials
from playbooks.core.connector import NOT_FOUND, TIMED_OUT, Ran

# The connector's environment variable that says: this process runs in a pod
# of the cluster, with its service account and no kubectl ("1").
IN_CLUSTER_ENV = "TPU_PLAYBOOKS_IN_CLUSTER"
# Where Kubernetes mounts a pod's service account: its token, ca.crt.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# GKE's exec credential plugin (`gcloud container clusters get-credentials`).
PLUGIN = "gke-gcloud-auth-plugin"
ANSWERED = "get --output=json, logs, cordon, uncordon, taint nodes, label nodes, delete pod"
# Where the kubernetes client's Configuration keeps a bearer token (its
# kube_config loader's key, read first by get_api_key_with_prefix).
TOKEN_KEY = "BearerToken"

# kubectl's names for the kinds the plays read -> (API prefix, resource, namespaced, Kind)
KINDS: dict[str, tuple[str, str, bool, str]] = {}
for names, spec in (
    (("pod", "pods"), ("/api/v1", "pods", True, "Pod")),
    (("event", "events"), ("/api/v1", "events", True, "Event")),
    (("node", "nodes"), ("/api/v1", "nodes", False, "Node")),
    (("namespace", "namespaces"), ("/api/v1", "namespaces", False, "Namespace")),
    (("serviceaccount", "serviceaccounts"), ("/api/v1", "serviceaccounts", True, "ServiceAccount")),
    (("resourceclaimtemplate", "resourceclaimtemplates"),
     ("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True, "ResourceClaimTemplate")),
    (("raycluster", "rayclusters", "rayclusters.ray.io"), ("/apis/ray.io/v1", "rayclusters", True, "RayCluster")),
    (("computeclass", "computeclasses"), ("/apis/cloud.google.com/v1", "computeclasses", False, "ComputeClass")),
    # The watch's rights (manifests/ray-watch-rbac.yaml).
    (("clusterrole", "clusterroles", "clusterroles.rbac.authorization.k8s.io"),
     ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False, "ClusterRole")),
    (("clusterrolebinding", "clusterrolebindings", "clusterrolebindings.rbac.authorization.k8s.io"),
     ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False, "ClusterRoleBinding")),
    (("role", "roles", "roles.rbac.authorization.k8s.io"),
     ("/apis/rbac.authorization.k8s.io/v1", "roles", True, "Role")),
    (("rolebinding", "rolebindings", "rolebindings.rbac.authorization.k8s.io"),
     ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True, "RoleBinding")),
):
    for n in names:
        KINDS[n] = spec


class Get:
    """A parsed `kubectl get`: what, where, which flags."""

    def __init__(self) -> None:
        self.refs: list[tuple[str, str | None]] = []  # (kind, name or None for a list)
        self.namespace = "default"
        self.selector: str | None = None
        self.field_selector: str | None = None
        self.ignore_not_found = False
        self.context: str | None = None


def parse_get(argv: list[str]) -> Get | None:
    """``kubectl get`` with only the flags the plays use, ``--output=json``;
    None for anything else."""
    if argv[:2] != ["kubectl", "get"]:
        return None
    g, words, json_out = Get(), [], False
    it = iter(argv[2:])
    for a in it:
        if a in ("--namespace", "-n"):
            g.namespace = next(it, "")
        elif a.startswith("--namespace="):
            g.namespace = a.split("=", 1)[1]
        elif a in ("-l", "--selector"):
            g.selector = next(it, "")
        elif a.startswith(("--selector=", "-l=")):
            g.selector = a.split("=", 1)[1]
        elif a.startswith("--field-selector="):
            g.field_selector = a.split("=", 1)[1]
        elif a == "--ignore-not-found":
            g.ignore_not_found = True
        elif a in ("--output=json", "-ojson") or (a == "-o" and next(it, "") == "json"):
            json_out = True
        elif a.startswith("--context="):
            g.context = a.split("=", 1)[1]
        elif a.startswith("-"):
            return None
        else:
            words.append(a)
    if not json_out or not words:
        return None
    if all("/" in w for w in words):
        for w in words:
            kind, name = w.split("/", 1)
            if kind not in KINDS:
                return None
            g.refs.append((kind, name))
    elif len(words) <= 2 and "/" not in "".join(words) and words[0] in KINDS:
        g.refs.append((words[0], words[1] if len(words) == 2 else None))
    elif len(words) == 1 and all(k in KINDS for k in words[0].split(",")):
        g.refs += [(k, None) for k in words[0].split(",")]  # kubectl's `get a,b,c`: every one listed
    else:
        return None
    return g


def _path(kind: str, namespace: str, name: str | None) -> str:
    prefix, resource, namespaced, _ = KINDS[kind]
    where = f"{prefix}/namespaces/{namespace}/{resource}" if namespaced else f"{prefix}/{resource}"
    return f"{where}/{name}" if name else where


class ServerError(Exception):
    """A status that is not 2xx: ``text`` as kubectl prints it ("Error from
    server (Reason): message"), ``message`` the server's own words."""

    def __init__(self, status: int, text: str, message: str = ""):
        super().__init__(text)
        self.status, self.text, self.message = status, text, message or text


class KubectlError(Exception):
    """An error kubectl finds itself (after reading the object): its lines,
    printed as kubectl prints them, exit code 1."""

    def __init__(self, *lines: str):
        super().__init__(*lines)
        self.lines = lines

    def stderr(self) -> str:
        if len(self.lines) == 1:
            return f"error: {self.lines[0]}\n"
        return "".join(f"{line}\n" for line in self.lines)


def in_cluster(env: Mapping[str, str]) -> bool:
    """Whether the connector's environment says this runs in a pod of the cluster."""
    return env.get(IN_CLUSTER_ENV) == "1"


# -- the writes: cordon, uncordon, taint nodes, delete pod ---------------------------
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _qualified(key: str) -> bool:
    """A valid taint key (a label key: an optional DNS subdomain prefix and a name)."""
    prefix, slash, name = key.rpartition("/")
    if slash and not (prefix and "/" not in prefix and len(prefix) <= 253 and _PREFIX.fullmatch(prefix)):
        return False
    return len(name) <= 63 and re.fullmatch(_NAME, name) is not None


def _label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and re.fullmatch(_NAME, value) is not None)


@dataclass
class Write:
    """A parsed `kubectl cordon|uncordon|taint|delete|label`: its words, its flags."""

    verb: str
    words: list[str] = field(default_factory=list)
    namespace: str = "default"
    context: str | None = None
    overwrite: bool = False
    add: list[dict[str, str]] = field(default_factory=list)      # taints to add, as the API has them
    remove: list[dict[str, str]] = field(default_factory=list)   # taints to remove: key, maybe effect
    selector: str = ""                                            # label: the nodes' label selector (-l)
    grace: int | None = None                                      # delete: --grace-period (0 with --force)
    force: bool = False                                           # delete: --force
    wait_s: int | None = None                                     # delete: --timeout, in seconds

    @property
    def name(self) -> str:
        return self.words[-1] if self.verb in ("cordon", "uncordon", "delete") else self.words[1]


def parse_write(argv: list[str]) -> Write | None:
    """``kubectl cordon NODE``, ``uncordon NODE``, ``taint nodes NODE
    SPEC... [--overwrite]``, ``delete pod NAME [--namespace NS]
    [--grace-period=N] [--force] [--timeout=Ns]`` (each with
    ``--context=``); None for anything else (another flag, several objects,
    a taint spec kubectl itself refuses, a grace period kubectl changes or
    refuses: 0 without ``--force``, more than 0 with it)."""
    if len(argv) < 2 or argv[0] != "kubectl" or argv[1] not in ("cordon", "uncordon", "taint", "delete", "label"):
        return None
    w = Write(argv[1])
    it = iter(argv[2:])
    for a in it:
        if a.startswith("--context="):
            w.context = a.split("=", 1)[1]
        elif w.verb == "label" and a in ("-l", "--selector"):
            w.selector = next(it, "")
        elif w.verb == "label" and a == "--overwrite":
            w.overwrite = True
        elif w.verb == "delete" and a in ("--namespace", "-n"):
            w.namespace = next(it, "")
        elif w.verb == "delete" and a.startswith("--namespace="):
            w.namespace = a.split("=", 1)[1]
        elif w.verb == "delete" and re.fullmatch(r"--grace-period=\d+", a):
            w.grace = int(a.split("=", 1)[1])
        elif w.verb == "delete" and a == "--force":
            w.force = True
        elif w.verb == "delete" and re.fullmatch(r"--timeout=\d+s", a):
            w.wait_s = int(a[len("--timeout="):-1])
        elif w.verb == "taint" and a == "--overwrite":
            w.overwrite = True
        elif a.startswith("-"):
            return None
        else:
            w.words.append(a)
    if not w.namespace or any(not x or "/" in x for x in w.words[:1 if w.verb == "label" else 2]):
        return None
    if w.verb in ("cordon", "uncordon"):
        return w if len(w.words) == 1 else None
    if w.verb == "delete":
        if (w.force and w.grace) or (not w.force and w.grace == 0):
            return None   # kubectl refuses --force with a grace period; sends 1 for a 0 without it
        if w.force:
            w.grace = 0
        return w if len(w.words) == 2 and w.words[0] in ("pod", "pods", "po") else None
    if w.verb == "label":
        return w if _label_write(w) else None
    if len(w.words) < 3 or w.words[0] not in ("node", "nodes", "no"):
        return None
    return w if _taint_specs(w, w.words[2:]) else None


def _label_write(w: Write) -> bool:
    """``label nodes -l SELECTOR KEY=VALUE --overwrite``: the one form the
    plays write (a slice's maintenance started: plays/slice_notice.py; its
    time scheduled by chaos.maintenance: cloud/chaos_gke.py)."""
    if not w.selector or not w.overwrite or len(w.words) != 2 or w.words[0] not in ("node", "nodes", "no"):
        return False
    key, eq, value = w.words[1].partition("=")
    return bool(eq) and _qualified(key) and _label_value(value) and re.fullmatch(r"[A-Za-z0-9./_-]+=[A-Za-z0-9._-]*",
                                                                                  w.selector) is not None


def _taint_specs(w: Write, specs: list[str]) -> bool:
    """The taint specs into ``w.add`` and ``w.remove``, as kubectl's
    ParseTaints reads them; False where kubectl would refuse them."""
    for spec in specs:
        if spec.endswith("-"):
            key, _, effect = spec[:-1].partition(":")
            if not key or ":" in effect or (effect and effect not in EFFECTS):
                return False
            w.remove.append({"key": key, **({"effect": effect} if effect else {})})
            continue
        parts = spec.split(":")
        kv = parts[0].split("=")
        if len(parts) != 2 or parts[1] not in EFFECTS or len(kv) > 2 or not _qualified(kv[0]) \
                or not _label_value(kv[-1] if len(kv) == 2 else ""):
            return False
        w.add.append({"effect": parts[1], "key": kv[0], **({"value": kv[1]} if len(kv) == 2 and kv[1] else {})})
    pairs = [(t["key"], t["effect"]) for t in w.add]
    conflict = any(a["key"] == r["key"] and r.get("effect", a["effect"]) == a["effect"]
                   for a in w.add for r in w.remove)
    return len(set(pairs)) == len(pairs) and not conflict


def _matches(taint: dict, key: str, effect: str | None) -> bool:
    return taint.get("key") == key and (effect is None or taint.get("effect") == effect)


def new_taints(node: str, old: list[dict], w: Write) -> tuple[str, list[dict]]:
    """The node's taints after ``w``, and kubectl's word for it (tainted,
    untainted, modified), as kubectl's updateTaints and reorganizeTaints
    compute them; KubectlError where kubectl refuses."""
    if not w.overwrite:
        exists = [t["key"] for t in w.add for o in old if _matches(o, t["key"], t["effect"])]
        if exists:
            raise KubectlError(f"node {node} already has {','.join(exists)} taint(s) with same effect(s) "
                               "and --overwrite is false")
    taints = list(w.add) + [o for o in old if not any(_matches(o, t["key"], t["effect"]) for t in w.add)]
    added = len(old) != len(taints)
    errors, removed = [], False
    for r in w.remove:
        kept = [t for t in taints if not _matches(t, r["key"], r.get("effect"))]
        removed = len(kept) != len(taints)
        taints = kept
        if not removed:
            errors.append(f'taint "{r["key"]}{":" + r["effect"] if r.get("effect") else ""}" not found')
    if errors:
        raise KubectlError(*errors)
    if (added and removed) or w.overwrite:
        return "modified", taints
    return ("tainted" if added else "untainted"), taints


STRATEGIC = "application/strategic-merge-patch+json"


def kubeconfig_stamp(files: str) -> str:
    """What the kubeconfig files (``os.pathsep``-separated) say now, as a
    hash of their bytes: a client is made again once it changes (a
    get-credentials of this run wrote a context anew, with another server
    and CA), not used on with what the files said when it was made."""
    h = hashlib.sha256()
    for path in files.split(os.pathsep):
        try:
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
        except OSError as e:
            h.update(f"{type(e).__name__}:{e.errno}".encode())
    return h.hexdigest()


class KubectlShortcut:
    """``base.Shortcut`` for `kubectl get -o json`, `kubectl logs` and the
    plays' node and pod writes (and, in the cluster, kubectl itself)."""

    name = "kubernetes client"

    def __init__(self, credentials: GcloudCredentials | None = None) -> None:
        self._clients: dict[tuple[str, ...], Any] = {}
        self._lock = threading.Lock()
        self.credentials = credentials

    def answers(self, argv: list[str], env: dict[str, str], streamed: bool) -> str | None:
        """The command lines ``run`` answers (``parse_get``, ``parse_write``,
        ``parse_logs``), none streamed; in the cluster, every kubectl."""
        if argv[:1] != ["kubectl"]:
            return None
        if in_cluster(env):
            return "kubernetes client in the cluster, which has no kubectl"
        if streamed or (parse_get(argv) is None and parse_write(argv) is None and parse_logs(argv) is None):
            return None
        return "kubernetes client, no kubectl process"

    def _client(self, env: dict[str, str], context: str | None) -> Any:
        if in_cluster(env):
            return self._in_cluster_client(env)
        from kubernetes import config
        files = env.get("KUBECONFIG") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".kube", "config")
        key = ("kubeconfig", files, context or "", kubeconfig_stamp(files))
        with self._lock:
            if key not in self._clients:
                for old in [k for k in self._clients if k[:3] == key[:3]]:  # made from what the files said before
                    del self._clients[old]
                self._clients[key] = self._gcloud_token_client(env, files, context) or \
                    config.new_client_from_config(config_file=files, context=context)
            return self._clients[key]

    def _gcloud_token_client(self, env: dict[str, str], files: str, context: str | None) -> Any:
        """A client whose user is GKE's exec credential plugin as `gcloud
        container clusters get-credentials` writes it (no arguments, no
        environment of its own), given the token that plugin would get: it
        runs `gcloud config config-helper` and hands on its access token,
        which the run already holds (``gcloud_credentials``), renewed as
        gcloud's expiry says. None otherwise (another kind of user, several
        kubeconfig files, no gcloud token): the kubeconfig is used as it is."""
        if self.credentials is None or os.pathsep in files:
            return None
        import yaml
        from kubernetes import config
        try:
            with open(files) as f:
                doc = yaml.safe_load(f)
        except (OSError, yaml.YAMLError):
            return None
        if not isinstance(doc, dict):
            return None
        name = context or doc.get("current-context")
        ctx = next((c.get("context") or {} for c in doc.get("contexts") or [] if c.get("name") == name), None)
        users = [u for u in doc.get("users") or [] if isinstance(u, dict) and u.get("name") == (ctx or {}).get("user")]
        run = ((users[0].get("user") or {}).get("exec") or {}) if len(users) == 1 else {}
        if os.path.basename(str(run.get("command") or "")) != PLUGIN or run.get("args") or run.get("env"):
            return None
        credentials = self.credentials
        held = credentials.get(env)
        if held is None:
            return None
        users[0]["user"] = {"token": held.token}
        client = config.new_client_from_config_dict(doc, context=name, persist_config=False)

        # kubernetes 37's loader keeps the token under "BearerToken", which
        # its Configuration.get_api_key_with_prefix reads before the
        # "authorization" alias: a token put under the alias is never sent.
        def renew(configuration: Any) -> None:
            again = credentials.get(env)
            if again is not None:
                configuration.api_key[TOKEN_KEY] = f"Bearer {again.token}"

        def refused() -> bool:
            """The API server answered 401: the token in use dropped and
            renewed once (``GcloudCredentials.renew``); False: none new."""
            used = str(client.configuration.api_key.get(TOKEN_KEY, "")).removeprefix("Bearer ")
            fresh = credentials.renew(env, used)
            if fresh is None:
                return False
            client.configuration.api_key[TOKEN_KEY] = f"Bearer {fresh.token}"
            return True

        client.configuration.refresh_api_key_hook = renew
        client.renew_refused_token = refused
        return client

    def _in_cluster_client(self, env: dict[str, str]) -> Any:
        """The pod's service account, as ``load_incluster_config`` loads it
        (its loader, with this module's folder): the token read again a
        minute after each read, so a rotated one is used."""
        from kubernetes import client
        from kubernetes.config.incluster_config import InClusterConfigLoader
        where = (SERVICE_ACCOUNT_DIR, env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", ""))
        key = ("in-cluster", *where)
        with self._lock:
            if key not in self._clients:
                configuration = type.__call__(client.Configuration)
                InClusterConfigLoader(token_filename=os.path.join(SERVICE_ACCOUNT_DIR, "token"),
                                      cert_filename=os.path.join(SERVICE_ACCOUNT_DIR, "ca.crt"),
                                      try_refresh_token=True, environ=env).load_and_set(configuration)
                self._clients[key] = client.ApiClient(configuration)
            return self._clients[key]

    def _call(self, api: Any, method: str, path: str, query: list[tuple[str, str]] | None = None,
              body: Any = None, content_type: str | None = None, timeout: float | None = None) -> str:
        """One request with the client's credentials (kubernetes 37:
        param_serialize puts the token in, call_api sends it, a dict body as
        JSON of ``content_type``); a status that is not 2xx is kubectl's
        "Error from server (Reason): message"."""
        for attempt in range(2):  # a token refused (401) renewed once, where gcloud's token is the client's
            headers = {"Content-Type": content_type or "application/json"} if body is not None else None
            verb, url, sent, payload, post = api.param_serialize(method, path, query_params=query or [],
                                                              header_params=headers, body=body,
                                                              auth_settings=["BearerToken"])
            r = api.call_api(verb, url, header_params=sent, body=payload, post_params=post, _request_timeout=timeout)
            renew = getattr(api, "renew_refused_token", None)
            data = r.read()
            if r.status != 401 or attempt or renew is None or not renew():
                break
        text = data.decode() if isinstance(data, bytes) else str(data or "")
        if 200 <= r.status < 300:
            return text
        try:
            doc = json.loads(text)
            message = doc.get("message") or text
            said = f"Error from server ({doc.get('reason') or r.reason}): {message}"
        except (ValueError, AttributeError):
            message = text or r.reason
            said = f"Error from server ({r.reason}): {message}"
        raise ServerError(int(r.status), said, message)

    def _get(self, api: Any, path: str, query: list[tuple[str, str]], timeout: float | None) -> str:
        return self._call(api, "GET", path, query, timeout=timeout)

    def run(self, argv: list[str], env: dict[str, str], timeout: float | None) -> Ran | None:
        start = time.monotonic()
        answer = self._run(argv, env, timeout, start)
        if answer is None and in_cluster(env) and argv[:1] == ["kubectl"]:
            return _not_answered(argv, start)
        return answer

    def _run(self, argv: list[str], env: dict[str, str], timeout: float | None, start: float) -> Ran | None:
        if argv[:2] == ["kubectl", "logs"]:
            return self._logs(argv, env, timeout, start)
        w = parse_write(argv)
        if w is not None:
            return self._write(w, env, timeout, start)
        g = parse_get(argv)
        if g is None:
            return None
        try:
            api = self._client(env, g.context)
            return Ran(0, self._answer(api, g, timeout), "", time.monotonic() - start)
        except ServerError as e:
            return Ran(1, "", e.text + "\n", time.monotonic() - start)
        except _connection_errors() as e:  # the connection, the credentials (the exec plugin), the kubeconfig
            return self._unreachable(e, start)

    def _answer(self, api: Any, g: Get, timeout: float | None) -> str:
        query = [(k, v) for k, v in (("labelSelector", g.selector), ("fieldSelector", g.field_selector)) if v]
        found: list[dict] = []
        if all(name is None for _, name in g.refs):  # lists, in the order asked, as one List
            for kind, _ in g.refs:
                doc = json.loads(self._get(api, _path(kind, g.namespace, None), query, timeout))
                found += [dict(i, apiVersion=i.get("apiVersion") or doc.get("apiVersion"),
                               kind=i.get("kind") or KINDS[kind][3]) for i in doc.get("items") or []]
            return _dump({"apiVersion": "v1", "items": found, "kind": "List", "metadata": {"resourceVersion": ""}})
        for kind, name in g.refs:
            try:
                found.append(json.loads(self._get(api, _path(kind, g.namespace, name), [], timeout)))
            except ServerError as e:
                if e.status == 404 and g.ignore_not_found:
                    continue
                raise
        if not found:
            return ""
        if len(g.refs) == 1:
            return _dump(found[0])
        return _dump({"apiVersion": "v1", "items": found, "kind": "List", "metadata": {"resourceVersion": ""}})

    # -- writes -------------------------------------------------------------------
    def _write(self, w: Write, env: dict[str, str], timeout: float | None, start: float) -> Ran:
        try:
            api = self._client(env, w.context)
            if w.verb == "delete":
                return self._delete(api, w, timeout, start)
            if w.verb == "label":
                return self._label(api, w, timeout, start)
            node = json.loads(self._get(api, _path("node", "", w.name), [], timeout))
            if w.verb == "taint":
                word, taints = new_taints(w.name, (node.get("spec") or {}).get("taints") or [], w)
                self._call(api, "PATCH", _path("node", "", w.name),
                           [("fieldManager", "kubectl-taint"), ("fieldValidation", "Strict")],
                           {"spec": {"taints": taints or None}}, STRATEGIC, timeout)
                return Ran(0, f"node/{w.name} {word}\n", "", time.monotonic() - start)
            return self._cordon(api, w, bool((node.get("spec") or {}).get("unschedulable")), timeout, start)
        except KubectlError as e:
            return Ran(1, "", e.stderr(), time.monotonic() - start)
        except ServerError as e:
            return Ran(1, "", e.text + "\n", time.monotonic() - start)
        except _connection_errors() as e:
            return self._unreachable(e, start)

    def _cordon(self, api: Any, w: Write, cordoned: bool, timeout: float | None, start: float) -> Ran:
        """kubectl's RunCordonOrUncordon: nothing sent when the node is as
        asked; a refused PATCH is an error line and exit code 0, as kubectl's."""
        desired = w.verb == "cordon"
        if cordoned == desired:
            return Ran(0, f"node/{w.name} already {w.verb}ed\n", "", time.monotonic() - start)
        try:
            self._call(api, "PATCH", _path("node", "", w.name), [],
                       {"spec": {"unschedulable": True if desired else None}}, STRATEGIC, timeout)
        except ServerError as e:
            return Ran(0, "", f'error: unable to {w.verb} node "{w.name}": {e.message}\n', time.monotonic() - start)
        return Ran(0, f"node/{w.name} {w.verb}ed\n", "", time.monotonic() - start)

    def _label(self, api: Any, w: Write, timeout: float | None, start: float) -> Ran:
        """kubectl label's: the nodes the selector lists, each patched
        unless it has the label already ("not labeled")."""
        key, _, value = w.words[1].partition("=")
        nodes = json.loads(self._get(api, _path("node", "", None), [("labelSelector", w.selector)], timeout))
        out, errors = [], []
        for n in nodes.get("items") or []:
            name = (n.get("metadata") or {}).get("name")
            had = ((n.get("metadata") or {}).get("labels") or {}).get(key) == value
            try:  # kubectl patches each node, also one that has the label (then "not labeled")
                self._call(api, "PATCH", _path("node", "", name), [("fieldManager", "kubectl-label")],
                           {"metadata": {"labels": {key: value}}}, "application/merge-patch+json", timeout)
            except ServerError as e:  # kubectl goes on with the next, and says each error after
                errors.append(e.text)
                continue
            out.append(f"node/{name} {'not labeled' if had else 'labeled'}")
        return Ran(1 if errors else 0, "".join(line + "\n" for line in out), "".join(e + "\n" for e in errors),
                   time.monotonic() - start)

    def _delete(self, api: Any, w: Write, timeout: float | None, start: float) -> Ran:
        """The DELETE (with its grace period, 0 for --force), then kubectl's
        default --wait: until no pod of that uid is left (a graceful
        deletion takes the pod's grace period; a pod on a node whose kubelet
        is dead stays Terminating), at most --timeout, within ``timeout``."""
        path = _path("pod", w.namespace, w.name)
        options: dict[str, Any] = {"propagationPolicy": "Background"}
        if w.grace is not None:
            options["gracePeriodSeconds"] = w.grace
        # kubectl's words before a force delete's DELETE (as kubectl 1.32 prints them)
        warned = ("Warning: Immediate deletion does not wait for confirmation that the running resource has been "
                  "terminated. The resource may continue to run on the cluster indefinitely.\n") if w.force else ""
        try:
            gone = json.loads(self._call(api, "DELETE", path, [], options, "application/json", timeout) or "{}")
        except ServerError as e:
            return Ran(1, "", warned + e.text + "\n", time.monotonic() - start)
        said = f'pod "{w.name}" {"force deleted" if w.force else "deleted"}\n'
        uid = (gone.get("metadata") or {}).get("uid")
        until = time.monotonic() + w.wait_s if w.wait_s else None   # --timeout=0s: kubectl's week
        while True:
            try:
                now = json.loads(self._get(api, path, [], timeout))
            except ServerError as e:
                if e.status == 404:
                    return Ran(0, said, warned, time.monotonic() - start)
                return Ran(1, said, warned + e.text + "\n", time.monotonic() - start)
            if (now.get("metadata") or {}).get("uid") != uid:
                return Ran(0, said, warned, time.monotonic() - start)
            if until is not None and time.monotonic() > until:
                return Ran(1, said, f"{warned}error: timed out waiting for the condition on pods/{w.name}\n",
                           time.monotonic() - start)
            if timeout is not None and time.monotonic() - start > timeout:
                return Ran(TIMED_OUT, said, f"{warned}timed out after {timeout:.0f}s", time.monotonic() - start)
            time.sleep(0.5)

    def _logs(self, argv: list[str], env: dict[str, str], timeout: float | None, start: float) -> Ran | None:
        logs = parse_logs(argv)
        if logs is None:
            return None
        pod, namespace, context, query = logs
        try:
            text = self._get(self._client(env, context), _path("pod", namespace, pod) + "/log", query, timeout)
            return Ran(0, text, "", time.monotonic() - start)
        except ServerError as e:
            return Ran(1, "", e.text + "\n", time.monotonic() - start)
        except _connection_errors() as e:
            return self._unreachable(e, start)

    def stream(self, argv: list[str], env: dict[str, str], on_line: Callable[[str], None]) -> Ran | None:
        if in_cluster(env) and argv[:1] == ["kubectl"]:
            return _not_answered(argv, time.monotonic())
        return None

    @staticmethod
    def _unreachable(e: Exception, start: float) -> Ran:
        """As kubectl says it: the server could not be reached (or the
        credentials could not be had), exit 1."""
        why = " ".join(str(e).split())[:500] or type(e).__name__
        return Ran(1, "", f"Unable to connect to the server: {type(e).__name__}: {why}\n", time.monotonic() - start)


def parse_logs(argv: list[str]) -> tuple[str, str, str | None, list[tuple[str, str]]] | None:
    """``kubectl logs POD [--namespace NS] [-c C] [--tail=N] [--previous]
    [--context=X]``: (pod, namespace, context, the log's query); None for
    anything else."""
    if argv[:2] != ["kubectl", "logs"]:
        return None
    pod, namespace, container, tail, previous, context = None, "default", None, None, False, None
    it = iter(argv[2:])
    for a in it:
        if a in ("--namespace", "-n"):
            namespace = next(it, "")
        elif a == "-c":
            container = next(it, "")
        elif a.startswith("--tail="):
            tail = a.split("=", 1)[1]
        elif a == "--previous":
            previous = True
        elif a.startswith("--context="):
            context = a.split("=", 1)[1]
        elif a.startswith("-") or pod is not None:
            return None
        else:
            pod = a
    if pod is None:
        return None
    query = [(k, v) for k, v in (("container", container), ("tailLines", tail),
                                 ("previous", "true" if previous else None)) if v]
    return pod, namespace, context, query


def _not_answered(argv: list[str], start: float) -> Ran:
    """In the cluster, a kubectl command the client does not answer: there
    is no kubectl to run it. One line, exit code 127 (not found)."""
    return Ran(NOT_FOUND, "", f"{shlex.join(argv)}: not answered in the cluster ({IN_CLUSTER_ENV}=1: no kubectl "
                              f"here; the kubernetes client answers kubectl {ANSWERED} only)\n",
               time.monotonic() - start)


def _connection_errors() -> tuple[type[Exception], ...]:
    """What the client raises when it cannot reach the API server or get its
    credentials: urllib3's errors (refused, TLS, timeouts), an OSError, the
    kubeconfig loader's ConfigException (a missing context, an exec plugin
    that failed; in the cluster, a missing token, CA or service address).
    Anything else is a bug, and fails the step as one."""
    import urllib3.exceptions
    from kubernetes.config.config_exception import ConfigException
    return (urllib3.exceptions.HTTPError, OSError, ConfigException)


def _dump(doc: Any) -> str:
    return json.dumps(doc, indent=4) + "\n"
