"""A small REST client for a real kube-apiserver, for the end-to-end tests: the test's own hands on the cluster.

Owns talking to the API server the way `kubectl` would, independently of the product's `hami.cluster.kube`
(which is under test): JSON requests with a client certificate, the API's `Status` errors as `ApiError`,
merge and server-side-apply patches, the status subresource, and a watch thread (`PodWatch`) that follows
pods through reconnects and expired resourceVersions. It interprets nothing: tests and the fake kubelet do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import ssl
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

__all__ = ["ApiError", "KubeApi", "PodWatch", "path_of"]

log = logging.getLogger(__name__)

# kind -> (API prefix, plural, namespaced) for what the tests create, read or apply.
_KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "Event": ("/api/v1", "events", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Secret": ("/api/v1", "secrets", True),
    "Service": ("/api/v1", "services", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ResourceQuota": ("/api/v1", "resourcequotas", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "PriorityClass": ("/apis/scheduling.k8s.io/v1", "priorityclasses", False),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "ResourceSlice": ("/apis/resource.k8s.io/v1", "resourceslices", False),
    "ResourceClaim": ("/apis/resource.k8s.io/v1", "resourceclaims", True),
    "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True),
    "DeviceClass": ("/apis/resource.k8s.io/v1", "deviceclasses", False),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        False,
    ),
    "ValidatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        False,
    ),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "ResourceFlavor": ("/apis/kueue.x-k8s.io/v1beta2", "resourceflavors", False),
    "ClusterQueue": ("/apis/kueue.x-k8s.io/v1beta2", "clusterqueues", False),
    "LocalQueue": ("/apis/kueue.x-k8s.io/v1beta2", "localqueues", True),
    "Workload": ("/apis/kueue.x-k8s.io/v1beta2", "workloads", True),
    "JobSet": ("/apis/jobset.x-k8s.io/v1alpha2", "jobsets", True),
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
}


def path_of(kind: str, name: str | None = None, namespace: str | None = None, sub: str | None = None) -> str:
    """The REST path of a kind (all namespaces when a namespaced kind is given none)."""
    prefix, plural, namespaced = _KINDS[kind]
    path = prefix
    if namespaced and namespace:
        path += f"/namespaces/{quote(namespace)}"
    path += f"/{plural}"
    if name is not None:
        path += f"/{quote(name)}"
    if sub is not None:
        path += f"/{sub}"
    return path


class ApiError(Exception):
    """The API server answered with an error status; `reason` and `message` come from its Status body."""

    def __init__(self, status: int, reason: str, message: str, what: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{what}: HTTP {status} {reason}: {message}")


class KubeApi:
    """A client-certificate identity on the API server at `server` (https://127.0.0.1:port)."""

    def __init__(self, server: str, ca: Path, cert: Path, key: Path, timeout: float = 30.0) -> None:
        self.server = server.rstrip("/")
        context = ssl.create_default_context(cafile=str(ca))
        context.load_cert_chain(str(cert), str(key))
        self._http = urllib3.PoolManager(ssl_context=context, maxsize=8, retries=False)
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        url = self.server + path + (f"?{urlencode(params)}" if params else "")
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        if isinstance(body, str):
            data = body.encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        response = self._http.request(method, url, body=data, headers=headers, timeout=self.timeout)
        payload = response.data
        if response.status >= 400:
            reason, message = "", payload.decode(errors="replace")
            try:
                status = json.loads(payload)
                reason, message = status.get("reason", ""), status.get("message", message)
            except ValueError:
                pass
            raise ApiError(response.status, reason, message, f"{method} {path}")
        return json.loads(payload) if payload else None

    def text(self, path: str) -> str:
        """A plain-text endpoint's body (`/metrics`), or ApiError."""
        response = self._http.request("GET", self.server + path, timeout=self.timeout)
        if response.status >= 400:
            raise ApiError(response.status, "", response.data.decode(errors="replace"), f"GET {path}")
        return str(response.data.decode())

    def ready(self, path: str = "/readyz") -> bool:
        """A health endpoint answers 200 (it answers plain text, not JSON)."""
        response = self._http.request("GET", self.server + path, timeout=5)
        return bool(response.status == 200)

    # ---------------------------------------------------------------------------------- verbs

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", path_of(kind, name, namespace))
        return result

    def list(self, kind: str, namespace: str | None = None, **params: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", path_of(kind, None, namespace), params=params or None)
        return result

    def create(self, obj: Mapping[str, Any], **params: str) -> dict[str, Any]:
        namespace = obj.get("metadata", {}).get("namespace")
        result: dict[str, Any] = self.request("POST", path_of(obj["kind"], None, namespace), obj, params=params or None)
        return result

    def refuses_for_quota(self, obj: Mapping[str, Any]) -> bool:
        """Whether creating `obj` (a dry run: nothing is stored) is refused with a message about a quota."""
        try:
            self.create(obj, dryRun="All")
        except ApiError as exc:
            return "quota" in exc.message.lower()
        return False

    def delete(
        self, kind: str, name: str, namespace: str | None = None, *, grace: int | None = None, uid: str | None = None
    ) -> None:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        self.request("DELETE", path_of(kind, name, namespace), body)

    def merge_patch(
        self, kind: str, name: str, patch: Mapping[str, Any], namespace: str | None = None, sub: str | None = None
    ) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "PATCH", path_of(kind, name, namespace, sub), patch, content_type="application/merge-patch+json"
        )
        return result

    def apply(self, obj: Mapping[str, Any], manager: str = "hami-e2e", **params: str) -> dict[str, Any]:
        """Server-side apply: the API server validates the whole object and owns the merge."""
        meta = obj["metadata"]
        result: dict[str, Any] = self.request(
            "PATCH",
            path_of(obj["kind"], meta["name"], meta.get("namespace")),
            obj,
            params={"fieldManager": manager, "force": "true", **params},
            content_type="application/apply-patch+yaml",
        )
        return result

    def events_about(self, namespace: str, name: str) -> list[dict[str, Any]]:
        found = self.list("Event", namespace, fieldSelector=f"involvedObject.name={name}")
        return list(found.get("items") or [])

    def stream(self, path: str, params: Mapping[str, str], read_timeout: float) -> Any:
        """An open streaming GET (a watch); the caller reads lines and releases it."""
        url = self.server + path + "?" + urlencode(params)
        return self._http.request(
            "GET",
            url,
            headers={"Accept": "application/json"},
            preload_content=False,
            timeout=urllib3.Timeout(connect=10, read=read_timeout),
        )


class PodWatch:
    """Follows pods (optionally one node's, through a field selector) and calls `handler(type, pod)` in order
    on its own thread: an initial ADDED for every listed pod, then the watch's events. It reconnects from the
    last resourceVersion, and lists again (delivering MODIFIED, and DELETED for pods gone) on 410 Gone."""

    def __init__(
        self, api: KubeApi, handler: Callable[[str, dict[str, Any]], None], field_selector: str | None = None
    ) -> None:
        self.api = api
        self.handler = handler
        self.selector = field_selector
        self.stopped = threading.Event()
        self._known: dict[str, dict[str, Any]] = {}
        self._response: Any = None
        self._rv = ""
        self._thread = threading.Thread(target=self._run, name=f"pod-watch-{field_selector}", daemon=True)

    def start(self) -> PodWatch:
        self._relist("ADDED")
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):  # already closed
                response.shutdown()
        self._thread.join(10)

    def _params(self) -> dict[str, str]:
        return {"fieldSelector": self.selector} if self.selector else {}

    def _relist(self, kind: str) -> None:
        listed = self.api.list("Pod", None, **self._params())
        seen = {}
        for pod in listed.get("items") or []:
            seen[pod["metadata"]["uid"]] = pod
            self._deliver(kind, pod)
        for uid, pod in list(self._known.items()):
            if uid not in seen:
                self._deliver("DELETED", pod)
        self._rv = listed["metadata"]["resourceVersion"]

    def _deliver(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if kind == "DELETED":
            self._known.pop(uid, None)
        else:
            self._known[uid] = pod
        try:
            self.handler(kind, pod)
        except Exception:
            log.exception("pod watch handler failed on %s %s", kind, pod["metadata"].get("name"))

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                self._follow()
            except Exception as exc:
                if self.stopped.is_set():
                    return
                log.debug("pod watch reconnects after %s", exc)
                self.stopped.wait(0.5)

    def _follow(self) -> None:
        params = {"watch": "true", "resourceVersion": self._rv, "allowWatchBookmarks": "true", "timeoutSeconds": "60"}
        response = self.api.stream("/api/v1/pods", {**params, **self._params()}, read_timeout=90)
        self._response = response
        try:
            if response.status == 410:
                self._relist("MODIFIED")
                return
            if response.status >= 400:
                raise ApiError(response.status, "", response.data.decode(errors="replace"), "watch pods")
            buffer = b""
            for chunk in response.stream(64 * 1024):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        self._event(json.loads(line))
                if self.stopped.is_set():
                    return
        finally:
            response.release_conn()
            self._response = None

    def _event(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                self._relist("MODIFIED")
            raise ApiError(int(obj.get("code") or 0), str(obj.get("reason", "")), str(obj.get("message", "")), "watch")
        self._rv = obj.get("metadata", {}).get("resourceVersion", self._rv)
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._deliver(str(kind), obj)
