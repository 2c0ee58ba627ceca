"""The `Cluster` port on a real Kubernetes API server: the port's verbs as REST calls.

Owns the mapping from the port's verbs to REST calls (paths, merge patches, bindings, events), the pages of a list,
the `kind` and `apiVersion` every object gets (the API leaves them out of list items, so every object names its
kind), and bounded retries of transient failures. It must not interpret objects beyond their metadata: services own
what annotations mean. Two modules of its own sit under it: `hami.cluster.kube_transport` reaches the API server
(the connection pool, the credentials from a kubeconfig or the pod's service account, raw JSON on the wire, the
translation of `Status` bodies into `NotFoundError` / `ConflictError` / `ClusterError`), and
`hami.cluster.kube_watch` runs each watch on a thread of its own, surviving disconnects and expired
resourceVersions.

Retries: reads and idempotent writes (get, list, replace, patch, delete) are retried with exponential
backoff on 429, 5xx and connection errors; creates and binds only when the server cannot have acted on
the request (429, or the connection could not be opened). A 409 is never retried: the caller re-reads
and decides again. This is the only retry loop: neither the transport's pool nor the `kubernetes` client retries
under it, and a watch's thread retries with this backend's backoff (`retry_delay`).

Concurrency: every verb runs on the caller's thread; the transport's connection pool is shared and thread-safe.
Each watch has its own thread (`hami.cluster.kube_watch`); `close()` stops them all.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import queue
import random
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec

from hami.cluster.kube_transport import (
    CONNECTION_ERRORS,
    REQUEST_TIMEOUT,
    SERVICE_ACCOUNT,
    HttpError,
    Transport,
    connection_error,
    kubeconfig_api_client,
    never_sent,
    read_body,
    read_json,
    status_error,
)
from hami.cluster.kube_watch import Known, KubeWatch, name_key, slim
from hami.cluster.port import (
    NAMESPACED,
    ClusterError,
    KubeObject,
    ListPages,
    Resource,
    WatchHandler,
    meta,
)

__all__ = ["KubeCluster", "connect"]

log = logging.getLogger(__name__)

_Objects = list[KubeObject]  # `list` is a method name inside KubeCluster

_RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
_LIST_PAGE = 500


class _ListMeta(msgspec.Struct):
    resourceVersion: str | None = None  # noqa: N815
    continue_: str | None = msgspec.field(default=None, name="continue")


class _ListHead(msgspec.Struct):
    """What `list_pages`' fetching thread reads of a page: its list metadata (the items are skipped unread)."""

    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)


_LIST_HEAD = msgspec.json.Decoder(_ListHead)
_PAGES_AHEAD = 4
"""Pages of a list read ahead of its caller (`KubeCluster.list_pages`): at 500 pods a page, about 4 MiB each."""


@dataclass(frozen=True, slots=True)
class _Kind:
    prefix: str
    api_version: str
    kind: str
    plural: str = ""
    """The path's resource segment, when not the port's name of the resource."""


_KINDS: dict[str, _Kind] = {
    "nodes": _Kind("/api/v1", "v1", "Node"),
    "namespaces": _Kind("/api/v1", "v1", "Namespace"),
    "pods": _Kind("/api/v1", "v1", "Pod"),
    "resourcequotas": _Kind("/api/v1", "v1", "ResourceQuota"),
    "events": _Kind("/api/v1", "v1", "Event"),
    "leases": _Kind("/apis/coordination.k8s.io/v1", "coordination.k8s.io/v1", "Lease"),
    "resourceslices": _Kind("/apis/resource.k8s.io/v1", "resource.k8s.io/v1", "ResourceSlice"),
    "resourceclaims": _Kind("/apis/resource.k8s.io/v1", "resource.k8s.io/v1", "ResourceClaim"),
    "poddisruptionbudgets": _Kind("/apis/policy/v1", "policy/v1", "PodDisruptionBudget"),
    "podgroups": _Kind("/apis/scheduling.x-k8s.io/v1alpha1", "scheduling.x-k8s.io/v1alpha1", "PodGroup"),
    "volcanopodgroups": _Kind(
        "/apis/scheduling.volcano.sh/v1beta1", "scheduling.volcano.sh/v1beta1", "PodGroup", "podgroups"
    ),
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
    path += f"/{k.plural or resource}"
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


# ------------------------------------------------------------------------------------------ the backend


class KubeCluster:
    """The backend of `hami.cluster.port.Cluster` on a Kubernetes API server."""

    def __init__(
        self,
        transport: Transport,
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
        self._watches: list[KubeWatch] = []
        self._watches_lock = threading.Lock()
        self._listed: dict[str, tuple[str, Known]] = {}
        """resource → the version and objects (`slim`) of its last list over all namespaces."""

    # ---------------------------------------------------------------------------------- construction

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None, **options: Any) -> KubeCluster:
        """Connect as a kubeconfig says (default: $KUBECONFIG or ~/.kube/config), in `context` or the current one,
        through the `kubernetes` client's loader (every credential a kubeconfig can name)."""
        return cls(Transport.from_api_client(kubeconfig_api_client(path, context)), **options)

    @classmethod
    def in_cluster(cls, *, account: Path = SERVICE_ACCOUNT, **options: Any) -> KubeCluster:
        """Connect with the pod's service account (the token file is re-read as it rotates), without the
        `kubernetes` client: what the chart's processes run with."""
        try:
            transport = Transport.in_cluster(account)
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
        raw: bool = False,
        attempts: int | None = None,
        timeout: tuple[float, float] = REQUEST_TIMEOUT,
    ) -> Any:
        """One API call with bounded retries; the parsed JSON answer (the open response when `stream`, the body's
        bytes when `raw`).

        `gone_on_retry`: a 404 after a failed attempt means that attempt did its work (a delete).
        """
        limit = attempts or self.attempts
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._transport.send(method, path, query, body, content_type, timeout, stream=stream)
                if stream:
                    return response
                return read_body(response) if raw else read_json(response)
            except HttpError as exc:
                if exc.status == 404 and gone_on_retry and attempt > 1:
                    return None
                retry = exc.status == 429 or (idempotent and exc.status in _RETRYABLE_STATUS)
                if not retry or attempt >= limit:
                    raise status_error(exc.status, exc.body, what) from None
                delay = self._delay(attempt, exc.headers.get("retry-after"))
                log.info("%s: HTTP %d, retrying in %.2f s (attempt %d/%d)", what, exc.status, delay, attempt, limit)
            except CONNECTION_ERRORS as exc:
                if not (idempotent or never_sent(exc)) or attempt >= limit:
                    raise connection_error(exc, self._transport.host, what) from exc
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
                self._listed[resource] = (version, {name_key(o): slim(o) for o in items})
        return items, version

    def list_pages(self, resource: Resource, namespace: str | None = None) -> ListPages:
        """`list` a page at a time: each page's bytes are fetched on a thread of its own while the caller decodes
        and uses the ones before (at most `_PAGES_AHEAD` pages ahead), so the API server serves the next pages
        while the caller works, and the caller need never hold the whole list. The fetching thread reads only the
        page's list metadata (its continue token), so that the caller's work is not interleaved with the decoding
        of another page. A page whose continue token expired raises `ClusterError` (410) from the iteration: the
        pages given cannot be taken back, the caller lists again. A caller that stops iterating early stops the
        fetching."""
        k = _kind(resource)
        path = _path(resource, namespace)
        what = f"list {resource}" + (f" in {namespace}" if namespace else "")
        ahead: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=_PAGES_AHEAD)
        stopped = threading.Event()
        version = [""]

        def hand_over(item: bytes | BaseException | None) -> bool:
            while not stopped.is_set():
                try:
                    ahead.put(item, timeout=0.5)
                    return True
                except queue.Full:
                    continue
            return False

        def fetch() -> None:
            token = ""
            try:
                while True:
                    query = [("limit", str(_LIST_PAGE))] + ([("continue", token)] if token else [])
                    body = self._call(what, "GET", path, query=query, raw=True)
                    try:
                        head = _LIST_HEAD.decode(body).metadata
                    except msgspec.DecodeError as exc:
                        raise ClusterError(f"{what}: the API answered with a body that is not a list ({exc})") from exc
                    if not token:
                        version[0] = head.resourceVersion or ""
                    token = head.continue_ or ""
                    if not hand_over(body) or not token:
                        break
                hand_over(None)
            except BaseException as exc:  # handed to the caller's thread, which raises it
                hand_over(exc)

        def pages() -> Iterator[_Objects]:
            known: Known = {}
            fetcher = threading.Thread(target=fetch, name=f"list-{resource}", daemon=True)
            fetcher.start()
            try:
                while (body := ahead.get()) is not None:
                    if isinstance(body, BaseException):
                        raise body
                    try:
                        items: _Objects = json.loads(body).get("items") or []
                    except ValueError as exc:
                        raise ClusterError(f"{what}: the API answered with a body that is not JSON ({exc})") from exc
                    del body
                    for item in items:
                        item.setdefault("apiVersion", k.api_version)
                        item.setdefault("kind", k.kind)
                    if namespace is None:
                        known.update((name_key(o), slim(o)) for o in items)
                    yield items
                    del items
            finally:
                stopped.set()
            if namespace is None:  # a watch from this version starts knowing what exists, as after `list`
                with self._watches_lock:
                    self._listed[resource] = (version[0], known)

        return ListPages(pages(), lambda: version[0])

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

    def get(self, resource: Resource, name: str, namespace: str | None = None, *, recent: bool = False) -> KubeObject:
        ns = _namespace(resource, namespace)
        obj: KubeObject = self._call(
            f"get {_where(resource, name, ns)}",
            "GET",
            _path(resource, ns, name),
            query=[("resourceVersion", "0")] if recent else None,
        )
        return obj

    def watch(self, resource: Resource, resource_version: str, handler: WatchHandler) -> KubeWatch:
        k = _kind(resource)
        w = KubeWatch(self, resource, resource_version, handler, api_version=k.api_version, kind=k.kind)
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

    def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        *,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        binding_meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            binding_meta["uid"] = uid  # precondition: a recreated pod of the same name is not bound
        if annotations:
            binding_meta["annotations"] = dict(annotations)
        if labels:
            binding_meta["labels"] = dict(labels)
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

    def evict(self, namespace: str, name: str, uid: str = "") -> None:
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}  # a recreated pod of the same name stays
        self._call(
            f"evict pods {namespace}/{name}", "POST", _path("pods", namespace, name, "eviction"), body=body,
            idempotent=False,
        )  # fmt: skip

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

    # ---------------------------------------------------------------------------------- what its watches ask of it

    def list_once(self, resource: str) -> tuple[_Objects, str]:
        """`KubeWatch`'s list (all namespaces): one attempt, the watch's thread retries."""
        return self._list(resource, None, attempts=1)

    def retry_delay(self, failures: int) -> float:
        """`KubeWatch`'s wait after `failures` attempts that got nowhere: this backend's backoff."""
        return self._delay(failures, None)

    def open_stream(self, resource: str, resource_version: str) -> Any:
        """`KubeWatch`'s stream: the server ends it after a randomised timeout; one attempt."""
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
            timeout=(REQUEST_TIMEOUT[0], float(timeout + 30)),
        )


def connect(kubeconfig: str | None) -> KubeCluster:
    """The cluster a service runs against: the kubeconfig at `kubeconfig` when one is given, else the pod's
    service account."""
    if kubeconfig:
        return KubeCluster.from_kubeconfig(kubeconfig)
    return KubeCluster.in_cluster()
