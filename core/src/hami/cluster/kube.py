"""The `Cluster` port on a real Kubernetes API server.

Owns the mapping from the port's verbs to REST calls (paths, merge patches, bindings, events), the
translation of the API's `Status` bodies into `NotFoundError` / `ConflictError` / `ClusterError`, bounded
retries of transient failures, and watches that survive disconnects and expired resourceVersions.
It must not interpret objects beyond their metadata: services own what annotations mean.

Objects travel as the JSON the API serves: requests go out on one urllib3 connection pool (TLS, keep-alive)
with raw JSON bodies, never through a client library's request layer or generated models, so field names stay
camelCase and fields a client does not know survive a read-modify-replace. Inside a pod the pool and the token
come from the service account (`in_cluster`); from a kubeconfig, the official `kubernetes` client loads it (every
kind of credential) and lends its pool. List items get the `kind` and `apiVersion` the API leaves out of them, so
every object names its kind.

Retries: reads and idempotent writes (get, list, replace, patch, delete) are retried with exponential
backoff on 429, 5xx and connection errors; creates and binds only when the server cannot have acted on
the request (429, or the connection could not be opened). A 409 is never retried: the caller re-reads
and decides again.

Concurrency: one thread per watch. It opens the watch stream from the last resourceVersion it saw,
calls the handler for each event in order on that thread (a failing handler is logged, the watch goes
on), reconnects after timeouts and disconnects, and on 410 Gone lists again, delivering a MODIFIED for
every listed object and a DELETED for every object that disappeared, so a consumer's state converges.
`stop()` shuts the stream's socket down so the thread ends at once. Every other verb runs on the
caller's thread; the client's connection pool is shared and thread-safe.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import quote, urlencode

import urllib3

from hami.cluster.port import (
    NAMESPACED,
    ClusterError,
    ConflictError,
    KubeObject,
    NotFoundError,
    Resource,
    WatchEvent,
    WatchHandler,
    meta,
)

__all__ = ["KubeCluster", "connect"]

log = logging.getLogger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
_Objects = list[KubeObject]  # `list` is a method name inside KubeCluster

_RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
_REQUEST_TIMEOUT = (10.0, 60.0)  # seconds to connect, seconds between bytes of a response
_LIST_PAGE = 500
POOL_CONNECTIONS = 32


@dataclass(frozen=True, slots=True)
class _Kind:
    prefix: str
    api_version: str
    kind: str


_KINDS: dict[str, _Kind] = {
    "nodes": _Kind("/api/v1", "v1", "Node"),
    "namespaces": _Kind("/api/v1", "v1", "Namespace"),
    "pods": _Kind("/api/v1", "v1", "Pod"),
    "resourcequotas": _Kind("/api/v1", "v1", "ResourceQuota"),
    "events": _Kind("/api/v1", "v1", "Event"),
    "leases": _Kind("/apis/coordination.k8s.io/v1", "coordination.k8s.io/v1", "Lease"),
    "resourceslices": _Kind("/apis/resource.k8s.io/v1", "resource.k8s.io/v1", "ResourceSlice"),
    "resourceclaims": _Kind("/apis/resource.k8s.io/v1", "resource.k8s.io/v1", "ResourceClaim"),
}


def _kind(resource: str) -> _Kind:
    try:
        return _KINDS[resource]
    except KeyError:
        raise ClusterError(f"unknown resource {resource!r}; expected one of {', '.join(sorted(_KINDS))}") from None


def _path(resource: str, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
    """The REST path; a namespaced resource without a namespace means all namespaces (lists and watches)."""
    k = _kind(resource)
    path = k.prefix
    if resource in NAMESPACED and namespace is not None:
        path += f"/namespaces/{quote(namespace, safe='')}"
    path += f"/{resource}"
    if name is not None:
        path += f"/{quote(name, safe='')}"
    if sub is not None:
        path += f"/{sub}"
    return path


def _namespace(resource: str, namespace: str | None) -> str | None:
    """The namespace of one object: `default` when a namespaced resource is given none, like the memory backend."""
    return (namespace or "default") if resource in NAMESPACED else None


def _where(resource: str, name: str, namespace: str | None) -> str:
    return f"{resource} {namespace}/{name}" if namespace else f"{resource} {name}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------------ errors


class _HttpError(Exception):
    """A non-2xx answer, before it becomes one of the port's errors."""

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str] | None) -> None:
        self.status = status
        self.body = body
        self.headers: Mapping[str, str] = headers or {}
        super().__init__(f"HTTP {status}")


def _status_error(status: int, body: bytes, what: str) -> ClusterError:
    """The port's error for an API answer: message and reason from the Status body when there is one."""
    message, reason = "", ""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        message = str(parsed.get("message") or "")
        reason = str(parsed.get("reason") or "")
    if not message:
        text = body.decode("utf-8", "replace").strip()[:300]
        message = f"{what}: HTTP {status}" + (f": {text}" if text else "")
    if status == 404:
        return NotFoundError(message)
    if status == 409:
        return ConflictError(message)
    if not message.startswith(what):
        message = f"{what}: {message}"
    return ClusterError(message, status, reason)


def _connection_error(exc: BaseException, host: str, what: str) -> ClusterError:
    return ClusterError(
        f"{what}: cannot reach the Kubernetes API at {host} ({exc}); check the kubeconfig, the network and that "
        "the API server is running",
        0,
        "ConnectionError",
    )


def _never_sent(exc: BaseException) -> bool:
    """True when the request cannot have reached the server (the connection was never opened)."""
    reason = getattr(exc, "reason", None)
    return isinstance(exc, urllib3.exceptions.ConnectTimeoutError) or isinstance(
        reason, urllib3.exceptions.ConnectTimeoutError | ConnectionRefusedError
    )


_CONNECTION_ERRORS: tuple[type[Exception], ...] = (urllib3.exceptions.HTTPError, OSError)
_WATCH_ERRORS: tuple[type[Exception], ...] = (ClusterError, ValueError, *_CONNECTION_ERRORS)


# ------------------------------------------------------------------------------------------ transport


def _api_client(configuration: Any) -> Any:
    """An `ApiClient` whose connection pool does not retry on its own: `KubeCluster._call` owns retries (bounded,
    with backoff and one log line each). urllib3's default of 3 retries under each of those attempts made one
    unreachable API server cost 4 × `attempts` connections."""
    from kubernetes import client as k8s_client

    configuration.retries = False
    # Connections kept per host: the client's default (5 per CPU) is below what a scheduler uses at once (up to 16
    # binds from kube-scheduler, the background placement writes, the watches), and every request beyond it opened
    # a fresh TLS connection ("Connection pool is full, discarding connection").
    configuration.connection_pool_maxsize = max(int(configuration.connection_pool_maxsize or 0), POOL_CONNECTIONS)
    return k8s_client.ApiClient(configuration)


SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where the kubelet mounts a pod's service account: `token` and `ca.crt`."""
TOKEN_REREAD_SECONDS = 60.0
"""How long a service account token read from its file is used before the file is read again (client-go's
interval): the kubelet rotates bound tokens in place, well before they expire."""


class _ServiceAccountToken:
    """The pod's bearer token, from the file the kubelet keeps current; a failed re-read keeps the last token."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reread_seconds = TOKEN_REREAD_SECONDS
        self._lock = threading.Lock()
        self._token = self._read()
        self._read_at = time.monotonic()

    def _read(self) -> str:
        token = self.path.read_text().strip()
        if not token:
            raise ValueError(f"{self.path} is empty")
        return token

    def headers(self) -> dict[str, str]:
        now = time.monotonic()
        if now - self._read_at >= self.reread_seconds:
            with self._lock:
                if now - self._read_at >= self.reread_seconds:
                    try:
                        self._token = self._read()
                    except (OSError, ValueError) as exc:
                        log.warning("re-reading the service account token failed, keeping the last one: %s", exc)
                    self._read_at = now
        return {"Authorization": f"Bearer {self._token}"}


class _Transport:
    """Raw JSON requests on one urllib3 connection pool (TLS, client certificates, proxy, keep-alive), each with
    the credentials' current headers; nothing serialized or deserialized by a client library.

    Built from a pod's service account here (`in_cluster`: no `kubernetes` client in the process, 0.3-0.5 s and
    13 MiB fewer at start) or from a kubeconfig through the `kubernetes` client's loader (`from_api_client`: its
    pool and its refreshed credentials, exec plugins and auth providers included). The client's own request
    path (`param_serialize`, `call_api`, `RESTResponse`) cost 10-30 % more CPU per call than this in the same runs
    (`benchmarks/kube_client.py`); a scheduler makes three calls per pod, the node side three more. A 2xx answer
    is returned unread; any other raises `_HttpError`.
    """

    def __init__(
        self,
        host: str,
        manager: urllib3.PoolManager,
        credentials: Callable[[], dict[str, str]],
        close: Callable[[], None] | None = None,
    ) -> None:
        self.host = host.rstrip("/")
        self._credentials = credentials
        self._close = close or manager.clear
        self._urlopen: Callable[..., Any]
        if isinstance(manager, urllib3.ProxyManager):  # a proxy may want absolute URLs: the manager resolves each
            self._urlopen, self._prefix = manager.urlopen, self.host
        else:  # the one host's pool, found once: the manager's lookup per call cost a fifth of the client's CPU
            self._urlopen = manager.connection_from_url(self.host).urlopen
            self._prefix = urllib3.util.parse_url(self.host).path or ""

    @classmethod
    def from_api_client(cls, api_client: Any) -> _Transport:
        """The `kubernetes` client's pool manager and the configuration's credentials (a bearer token re-read as
        the client's refresh hook renews it)."""
        configuration = api_client.configuration

        def credentials() -> dict[str, str]:
            headers: dict[str, str] = {}
            for setting in configuration.auth_settings().values():
                if setting.get("in") == "header" and setting.get("value"):
                    headers[str(setting["key"])] = str(setting["value"])
            return headers

        return cls(str(configuration.host), api_client.rest_client.pool_manager, credentials, api_client.close)

    @classmethod
    def in_cluster(cls, account: Path = SERVICE_ACCOUNT) -> _Transport:
        """The API server's service address from the environment the kubelet sets, verified against the
        account's CA, with the account's token."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise ValueError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
        ca = account / "ca.crt"
        if not ca.is_file():
            raise ValueError(f"{ca} does not exist")
        try:
            token = _ServiceAccountToken(account / "token")
        except OSError as exc:
            raise ValueError(f"cannot read the service account token: {exc}") from exc
        manager = urllib3.PoolManager(maxsize=POOL_CONNECTIONS, cert_reqs="CERT_REQUIRED", ca_certs=str(ca))
        server = f"[{host}]" if ":" in host else host  # an IPv6 service address
        return cls(f"https://{server}:{port}", manager, token.headers)

    def close(self) -> None:
        self._close()

    def send(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: tuple[float, float] = _REQUEST_TIMEOUT,
    ) -> Any:
        headers = {"Accept": "application/json", **self._credentials()}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        url = self._prefix + path + (f"?{urlencode(query)}" if query else "")
        response = self._urlopen(
            method,
            url,
            body=data,
            headers=headers,
            timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
            retries=False,  # `KubeCluster._call` owns retries
            redirect=False,
            preload_content=False,
        )
        if not 200 <= int(response.status) <= 299:
            try:
                answer = response.data
            finally:
                response.release_conn()
            raise _HttpError(int(response.status), answer or b"", response.headers)
        return response


def _read_json(response: Any) -> Any:
    try:
        data = response.data
    finally:
        response.release_conn()
    return json.loads(data) if data else None


# ------------------------------------------------------------------------------------------ the backend


class KubeCluster:
    """The backend of `hami.cluster.port.Cluster` on a Kubernetes API server."""

    def __init__(
        self,
        transport: _Transport,
        *,
        component: str = "hami",
        attempts: int = 4,
        backoff_seconds: float = 0.2,
        max_backoff_seconds: float = 5.0,
        watch_timeout_seconds: int = 300,
    ) -> None:
        """`transport` reaches the API server (`from_kubeconfig`, `in_cluster`); `component` signs recorded events.

        `attempts` bounds each call (first try included); waits start at `backoff_seconds` and double up to
        `max_backoff_seconds`. Watches ask the server to end each stream after `watch_timeout_seconds` to
        `2 × watch_timeout_seconds` (randomised, like client-go) and reconnect from there.
        """
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self._transport = transport
        self.component = component
        self.attempts = attempts
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.watch_timeout_seconds = watch_timeout_seconds
        self._watches: list[_Watch] = []
        self._watches_lock = threading.Lock()
        self._listed: dict[str, tuple[str, dict[tuple[str, str], KubeObject]]] = {}
        """resource → the version and objects (`_slim`) of its last list over all namespaces."""

    # ---------------------------------------------------------------------------------- construction

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None, **options: Any) -> KubeCluster:
        """Connect as a kubeconfig says (default: $KUBECONFIG or ~/.kube/config), in `context` or the current one,
        through the `kubernetes` client's loader (every credential a kubeconfig can name)."""
        return cls(_Transport.from_api_client(cls.api_client_for(path, context)), **options)

    @staticmethod
    def api_client_for(path: str | None = None, context: str | None = None) -> Any:
        """A `kubernetes.client.ApiClient` configured from the kubeconfig (`from_kubeconfig`'s), for code that
        wants the client itself (`benchmarks/kube_client.py` compares its request path with this backend's)."""
        from kubernetes import client as k8s_client
        from kubernetes import config as k8s_config

        configuration = k8s_client.Configuration()
        try:
            k8s_config.load_kube_config(
                config_file=path, context=context, client_configuration=configuration, persist_config=False
            )
        except (k8s_config.ConfigException, OSError, ValueError) as exc:
            where = path or "the default kubeconfig ($KUBECONFIG or ~/.kube/config)"
            raise ClusterError(
                f"cannot load {where}" + (f" context {context!r}" if context else "") + f": {exc}"
            ) from exc
        return _api_client(configuration)

    @classmethod
    def in_cluster(cls, *, account: Path = SERVICE_ACCOUNT, **options: Any) -> KubeCluster:
        """Connect with the pod's service account (the token file is re-read as it rotates), without the
        `kubernetes` client: what the chart's processes run with."""
        try:
            transport = _Transport.in_cluster(account)
        except ValueError as exc:
            raise ClusterError(
                f"not running in a Kubernetes pod with a service account ({exc}); pass a kubeconfig instead"
            ) from exc
        return cls(transport, **options)

    def close(self) -> None:
        """Stop every watch and close the connection pool."""
        with self._watches_lock:
            watches, self._watches = self._watches, []
        for w in watches:
            w.stop()
        self._transport.close()

    # ---------------------------------------------------------------------------------- requests

    def _call(
        self,
        what: str,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        idempotent: bool = True,
        gone_on_retry: bool = False,
        stream: bool = False,
        attempts: int | None = None,
        timeout: tuple[float, float] = _REQUEST_TIMEOUT,
    ) -> Any:
        """One API call with bounded retries; the parsed JSON answer (or the open response when `stream`).

        `gone_on_retry`: a 404 after a failed attempt means that attempt did its work (a delete).
        """
        limit = attempts or self.attempts
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._transport.send(method, path, query, body, content_type, timeout)
                return response if stream else _read_json(response)
            except _HttpError as exc:
                if exc.status == 404 and gone_on_retry and attempt > 1:
                    return None
                retry = exc.status == 429 or (idempotent and exc.status in _RETRYABLE_STATUS)
                if not retry or attempt >= limit:
                    raise _status_error(exc.status, exc.body, what) from None
                delay = self._delay(attempt, exc.headers.get("Retry-After"))
                log.info("%s: HTTP %d, retrying in %.2f s (attempt %d/%d)", what, exc.status, delay, attempt, limit)
            except _CONNECTION_ERRORS as exc:
                if not (idempotent or _never_sent(exc)) or attempt >= limit:
                    raise _connection_error(exc, self._transport.host, what) from exc
                delay = self._delay(attempt, None)
                log.info("%s: %s, retrying in %.2f s (attempt %d/%d)", what, exc, delay, attempt, limit)
            except ValueError as exc:  # the body was not JSON
                raise ClusterError(f"{what}: the API answered with a body that is not JSON ({exc})") from exc
            time.sleep(delay)

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        delay = min(self.backoff_seconds * 2.0 ** (attempt - 1), self.max_backoff_seconds)
        if retry_after:
            with contextlib.suppress(ValueError):
                delay = max(delay, min(float(retry_after), self.max_backoff_seconds))
        return delay * random.uniform(0.8, 1.2)  # jitter

    # ---------------------------------------------------------------------------------- the port

    def list(self, resource: Resource, namespace: str | None = None) -> tuple[list[KubeObject], str]:
        items, version = self._list(resource, namespace)
        if namespace is None:  # a watch from this version starts knowing what exists, without listing again
            with self._watches_lock:
                self._listed[resource] = (version, {_key(o): _slim(o) for o in items})
        return items, version

    def _list(self, resource: str, namespace: str | None, attempts: int | None = None) -> tuple[_Objects, str]:
        """All pages of a list; a page whose continue token expired (410) starts the list again."""
        k = _kind(resource)
        path = _path(resource, namespace)
        what = f"list {resource}" + (f" in {namespace}" if namespace else "")
        items: _Objects = []
        token = ""
        version = ""
        restarts = 0
        while True:
            query = [("limit", str(_LIST_PAGE))] + ([("continue", token)] if token else [])
            try:
                answer = self._call(what, "GET", path, query=query, attempts=attempts)
            except ClusterError as exc:
                if exc.status == 410 and token and restarts < self.attempts:
                    items, token, restarts = [], "", restarts + 1
                    continue
                raise
            for item in answer.get("items") or []:
                item.setdefault("apiVersion", k.api_version)
                item.setdefault("kind", k.kind)
                items.append(item)
            list_meta = answer.get("metadata") or {}
            if not token:
                version = str(list_meta.get("resourceVersion") or "")
            token = str(list_meta.get("continue") or "")
            if not token:
                return items, version

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> KubeObject:
        ns = _namespace(resource, namespace)
        obj: KubeObject = self._call(f"get {_where(resource, name, ns)}", "GET", _path(resource, ns, name))
        return obj

    def watch(self, resource: Resource, resource_version: str, handler: WatchHandler) -> _Watch:
        _kind(resource)
        w = _Watch(self, resource, resource_version, handler)
        with self._watches_lock:
            self._watches = [x for x in self._watches if x.alive] + [w]
            listed = self._listed.pop(resource, None)
        if listed is not None and listed[0] == resource_version:
            w.seed(listed[1])
        w.start()
        return w

    def create(self, resource: Resource, obj: KubeObject) -> KubeObject:
        k = _kind(resource)
        body = copy.deepcopy(obj)
        body.setdefault("apiVersion", k.api_version)
        body.setdefault("kind", k.kind)
        m = body.setdefault("metadata", {})
        ns = _namespace(resource, m.get("namespace"))
        if ns is not None:
            m["namespace"] = ns
        name = m.get("name") or (m.get("generateName", "") + "…")
        created: KubeObject = self._call(
            f"create {_where(resource, name, ns)}", "POST", _path(resource, ns), body=body, idempotent=False
        )
        return created

    def replace(self, resource: Resource, obj: KubeObject) -> KubeObject:
        k = _kind(resource)
        body = copy.deepcopy(obj)
        body.setdefault("apiVersion", k.api_version)
        body.setdefault("kind", k.kind)
        m = meta(body)
        ns = _namespace(resource, m.get("namespace"))
        name = str(m.get("name") or "")
        if not name:
            raise ClusterError(f"replace {resource}: the object has no metadata.name")
        replaced: KubeObject = self._call(
            f"replace {_where(resource, name, ns)}", "PUT", _path(resource, ns, name), body=body
        )
        return replaced

    def delete(self, resource: Resource, name: str, namespace: str | None = None) -> None:
        ns = _namespace(resource, namespace)
        self._call(f"delete {_where(resource, name, ns)}", "DELETE", _path(resource, ns, name), gone_on_retry=True)

    def patch_metadata(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        *,
        annotations: Mapping[str, str | None] | None = None,
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> KubeObject:
        ns = _namespace(resource, namespace)
        patch_meta: dict[str, Any] = {}
        if annotations:
            patch_meta["annotations"] = dict(annotations)
        if labels:
            patch_meta["labels"] = dict(labels)
        if resource_version:
            patch_meta["resourceVersion"] = resource_version  # the API server's optimistic-concurrency check
        patched: KubeObject = self._call(
            f"patch {_where(resource, name, ns)}",
            "PATCH",
            _path(resource, ns, name),
            body={"metadata": patch_meta},
            content_type="application/merge-patch+json",
        )
        return patched

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        binding_meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            binding_meta["uid"] = uid  # precondition: a recreated pod of the same name is not bound
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": binding_meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self._call(
            f"bind pods {namespace}/{name} to node {node}",
            "POST",
            _path("pods", namespace, name, "binding"),
            body=body,
            idempotent=False,
        )

    def record_event(self, obj: KubeObject, reason: str, message: str, *, warning: bool = False) -> None:
        m = meta(obj)
        name = str(m.get("name") or "")
        namespace = str(m.get("namespace") or "default")
        involved = {
            "apiVersion": obj.get("apiVersion", ""),
            "kind": obj.get("kind", ""),
            "name": name,
            "namespace": m.get("namespace"),
            "uid": m.get("uid"),
            "resourceVersion": m.get("resourceVersion"),
        }
        now = _now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name or 'hami'}.", "namespace": namespace},
            "involvedObject": {k: v for k, v in involved.items() if v},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": socket.gethostname(),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._call(
                f"record event {reason} about {name}",
                "POST",
                _path("events", namespace),
                body=event,
                idempotent=False,
            )
        except Exception as exc:  # best effort by contract: an event never fails the caller
            log.warning("could not record event %s about %s/%s: %s", reason, namespace, name, exc)

    # ---------------------------------------------------------------------------------- watch support

    def _open_watch(self, resource: str, resource_version: str) -> Any:
        timeout = random.randint(self.watch_timeout_seconds, 2 * self.watch_timeout_seconds)
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout)),
        ]
        return self._call(
            f"watch {resource} from resourceVersion {resource_version}",
            "GET",
            _path(resource),
            query=query,
            stream=True,
            attempts=1,  # the watch thread retries, and can be stopped while it waits
            timeout=(_REQUEST_TIMEOUT[0], float(timeout + 30)),
        )


# ------------------------------------------------------------------------------------------ watches


class _Expired(Exception):
    """The watch's resourceVersion is older than the server keeps (410 Gone)."""


def _key(obj: KubeObject) -> tuple[str, str]:
    m = meta(obj)
    return (str(m.get("namespace") or ""), str(m.get("name") or ""))


def _slim(obj: KubeObject) -> KubeObject:
    """What a watch keeps of an object it has reported: enough for the DELETED event a re-list delivers when the
    object is gone (kind, name, namespace, uid, resourceVersion), not the whole object for every pod and node."""
    m = meta(obj)
    kept = {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in m}
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": kept}


def _lines(response: Any) -> Iterator[bytes]:
    """The newline-delimited JSON documents of a watch stream, each as soon as its line is complete."""
    if getattr(response, "chunked", False) or not hasattr(response, "read1"):
        chunks: Iterator[bytes] = response.stream(None, decode_content=True)
    else:
        chunks = iter(lambda: bytes(response.read1(65536)), b"")
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


class _Watch:
    """One watch: its thread, its position (resourceVersion) and the objects it has reported as present."""

    def __init__(self, cluster: KubeCluster, resource: str, resource_version: str, handler: WatchHandler) -> None:
        self.cluster = cluster
        self.resource = resource
        self.handler = handler
        self.resource_version = resource_version
        self._k = _kind(resource)
        self._known: dict[tuple[str, str], KubeObject] = {}
        self._seeded = False
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"kube-watch-{resource}", daemon=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopped.is_set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the watch: no event is delivered after this returns (unless called from the handler itself)."""
        self._stopped.set()
        with self._lock:
            response, self._response = self._response, None
        if response is not None:
            _shutdown(response)
        if threading.current_thread() is not self._thread and self._thread.is_alive():
            self._thread.join(timeout=5.0)
            if self._thread.is_alive():
                log.warning("watch of %s did not end within 5 s (a handler is still running)", self.resource)

    # ---------------------------------------------------------------------------------- the thread

    def _run(self) -> None:
        failures = 0  # consecutive attempts that got nowhere: the backoff grows with them
        relist = False
        while not self._stopped.is_set():
            try:
                if not self._seeded:
                    self._seed()
                if relist:
                    self._relist()
                    relist = False
                started = time.monotonic()
                delivered = self._stream()
                # The server ended the stream (its timeout, or a restart): go on from the last version.
                failures = 0 if delivered or time.monotonic() - started > 1.0 else failures + 1
            except _Expired:
                log.info("watch of %s: resourceVersion %s expired, listing again", self.resource, self.resource_version)
                failures += 1 if relist else 0  # expired again before the re-list: back off
                relist = True
                if failures == 0:
                    continue
            except _WATCH_ERRORS as exc:
                if self._stopped.is_set():
                    break
                failures += 1
                log.warning("watch of %s broke (%s); reconnecting from %s", self.resource, exc, self.resource_version)
            except Exception:  # a bug must not end the watch silently
                if self._stopped.is_set():
                    break
                failures += 1
                log.exception("watch of %s failed unexpectedly; reconnecting", self.resource)
            if failures:
                self._stopped.wait(self.cluster._delay(min(failures, 8), None))

    def seed(self, known: dict[tuple[str, str], KubeObject]) -> None:
        """Start knowing these objects (from the list the watch's version came from): no list of its own."""
        self._known = known
        self._seeded = True

    def _seed(self) -> None:
        """Learn which objects exist, so a later re-list can tell the consumer which ones disappeared."""
        items, _ = self.cluster._list(self.resource, None, attempts=1)
        self._known = {_key(o): _slim(o) for o in items}
        self._seeded = True

    def _stream(self) -> bool:
        """Deliver one stream's events; True when any arrived. Raises `_Expired` on 410."""
        try:
            response = self.cluster._open_watch(self.resource, self.resource_version)
        except ClusterError as exc:
            if exc.status == 410:
                raise _Expired from exc
            raise
        with self._lock:
            if self._stopped.is_set():
                _shutdown(response)
                return False
            self._response = response
        delivered = False
        try:
            for line in _lines(response):
                if self._stopped.is_set():
                    break
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        raise _Expired
                    raise _status_error(int(code or 500), json.dumps(obj).encode(), f"watch {self.resource}")
                version = meta(obj).get("resourceVersion")
                if version:
                    self.resource_version = str(version)
                if kind == "BOOKMARK" or kind not in ("ADDED", "MODIFIED", "DELETED"):
                    continue
                obj.setdefault("apiVersion", self._k.api_version)
                obj.setdefault("kind", self._k.kind)
                if kind == "DELETED":
                    self._known.pop(_key(obj), None)
                else:
                    self._known[_key(obj)] = _slim(obj)
                delivered = True
                self._deliver(WatchEvent(cast(EventType, kind), obj))
        finally:
            with self._lock:
                if self._response is response:
                    self._response = None
            with contextlib.suppress(Exception):
                response.close()  # a stream cut short must not go back to the pool half read
                response.release_conn()
        return delivered

    def _relist(self) -> None:
        items, version = self.cluster._list(self.resource, None, attempts=1)
        listed = {_key(o): o for o in items}
        gone = [o for key, o in self._known.items() if key not in listed]
        self._known = {key: _slim(o) for key, o in listed.items()}
        self.resource_version = version
        for obj in items:
            self._deliver(WatchEvent("MODIFIED", obj))
        for obj in gone:
            self._deliver(WatchEvent("DELETED", obj))

    def _deliver(self, event: WatchEvent) -> None:
        if self._stopped.is_set():
            return
        try:
            self.handler(event)
        except Exception:  # a failing handler must not stop the watch
            log.exception("watch handler for %s failed on %s %s", self.resource, event.type, _key(event.object))


def _shutdown(response: Any) -> None:
    """Unblock a thread reading `response` by shutting its socket down, then close it."""
    with contextlib.suppress(Exception):
        if hasattr(response, "shutdown"):  # urllib3 >= 2.3
            response.shutdown()
        else:
            sock = getattr(getattr(response, "connection", None), "sock", None)
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        response.close()


def connect(kubeconfig: str | None) -> KubeCluster:
    """The cluster a service runs against: the kubeconfig at `kubeconfig` when one is given, else the pod's
    service account."""
    if kubeconfig:
        return KubeCluster.from_kubeconfig(kubeconfig)
    return KubeCluster.in_cluster()
