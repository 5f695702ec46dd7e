"""The `kubernetes` Python client as a speed-up of kubectl on this machine.

Every Kubernetes read of the plays is a kubectl command line (``kubectl get
... --output=json``, ``kubectl logs ...``), the same on this machine and on a
controller host. Here, the local connector answers the ones it recognises
through the client instead (``core.connector.base.Shortcut``): no process,
no auth-plugin start per call (the client runs GKE's exec credential plugin
once and refreshes its token when it expires), and the same output kubectl
prints: the API server's JSON (a list as kubectl's ``List``), or kubectl's
``Error from server (Reason): message`` with exit code 1. A command line it
does not recognise runs as a process. ``tests`` compare both answers against
the fake API server. (The client runs GKE's exec credential plugin with this
process's environment, of which the connector's is the stated part.)

The client is imported only when a command comes (it is a heavy import).
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from playbooks.core.connector import Ran

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
    else:
        return None
    return g


def _path(kind: str, namespace: str, name: str | None) -> str:
    prefix, resource, namespaced, _ = KINDS[kind]
    where = f"{prefix}/namespaces/{namespace}/{resource}" if namespaced else f"{prefix}/{resource}"
    return f"{where}/{name}" if name else where


class ServerError(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status, self.text = status, text


class KubectlShortcut:
    """``base.Shortcut`` for `kubectl get -o json` and `kubectl logs`."""

    def __init__(self) -> None:
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def _client(self, env: dict[str, str], context: str | None) -> Any:
        from kubernetes import config
        files = env.get("KUBECONFIG") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".kube", "config")
        key = (files, context or "")
        with self._lock:
            if key not in self._clients:
                self._clients[key] = config.new_client_from_config(config_file=files, context=context)
            return self._clients[key]

    def _get(self, api: Any, path: str, query: list[tuple[str, str]], timeout: float | None) -> str:
        """A GET with the client's credentials (kubernetes 37: param_serialize
        puts the token in, call_api sends it); a status that is not 2xx is
        kubectl's "Error from server (Reason): message"."""
        method, url, headers, body, post = api.param_serialize("GET", path, query_params=query,
                                                               auth_settings=["BearerToken"])
        r = api.call_api(method, url, header_params=headers, body=body, post_params=post, _request_timeout=timeout)
        data = r.read()
        text = data.decode() if isinstance(data, bytes) else str(data or "")
        if 200 <= r.status < 300:
            return text
        try:
            doc = json.loads(text)
            said = f"Error from server ({doc.get('reason') or r.reason}): {doc.get('message') or text}"
        except (ValueError, AttributeError):
            said = f"Error from server ({r.reason}): {text or r.reason}"
        raise ServerError(int(r.status), said)

    def run(self, argv: list[str], env: dict[str, str], timeout: float | None) -> Ran | None:
        start = time.monotonic()
        if argv[:2] == ["kubectl", "logs"]:
            return self._logs(argv, env, timeout, start)
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
        if len(g.refs) == 1 and g.refs[0][1] is None:
            kind = g.refs[0][0]
            doc = json.loads(self._get(api, _path(kind, g.namespace, None), query, timeout))
            items = [dict(i, apiVersion=i.get("apiVersion") or doc.get("apiVersion"),
                          kind=i.get("kind") or KINDS[kind][3]) for i in doc.get("items") or []]
            return _dump({"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}})
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

    def _logs(self, argv: list[str], env: dict[str, str], timeout: float | None, start: float) -> Ran | None:
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
        try:
            text = self._get(self._client(env, context), _path("pod", namespace, pod) + "/log", query, timeout)
            return Ran(0, text, "", time.monotonic() - start)
        except ServerError as e:
            return Ran(1, "", e.text + "\n", time.monotonic() - start)
        except _connection_errors() as e:
            return self._unreachable(e, start)

    def stream(self, argv: list[str], env: dict[str, str], on_line: Callable[[str], None]) -> Ran | None:
        return None

    @staticmethod
    def _unreachable(e: Exception, start: float) -> Ran:
        """As kubectl says it: the server could not be reached (or the
        credentials could not be had), exit 1."""
        why = " ".join(str(e).split())[:500] or type(e).__name__
        return Ran(1, "", f"Unable to connect to the server: {type(e).__name__}: {why}\n", time.monotonic() - start)


def _connection_errors() -> tuple[type[Exception], ...]:
    """What the client raises when it cannot reach the API server or get its
    credentials: urllib3's errors (refused, TLS, timeouts), an OSError, the
    kubeconfig loader's ConfigException (a missing context, an exec plugin
    that failed). Anything else is a bug, and fails the step as one."""
    import urllib3.exceptions
    from kubernetes.config.config_exception import ConfigException
    return (urllib3.exceptions.HTTPError, OSError, ConfigException)



def _dump(doc: Any) -> str:
    return json.dumps(doc, indent=4) + "\n"
