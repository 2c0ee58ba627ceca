"""A small Kubernetes API server on loopback, backed by `MemoryCluster`: the demo's cluster, and the tests'.

Testing equipment, not a production part: no service (scheduler, webhook, node daemon) imports it; they reach it
only as they reach kube-apiserver, through a kubeconfig. `hami demo` runs on it, as on the fake kubelet
(`hami.testing.kubelet`), and so does the image's smoke check.

It serves the REST paths `hami.cluster.kube.KubeCluster` uses, the way kube-apiserver answers them, so that
separate processes (`hami scheduler`, `hami node`, `hami status`) can talk to an in-memory cluster through a
kubeconfig exactly as they talk to a real one:

* nodes, namespaces, pods, resourcequotas, events (`/api/v1`) and leases (`/apis/coordination.k8s.io/v1`):
  list, get, create (with `generateName`), replace, delete, merge patches of metadata (annotations, labels,
  with a resourceVersion precondition) and the `pods/binding` subresource;
* JSON objects with `kind`/`apiVersion` (list items without), `Status` bodies for errors (404 NotFound,
  409 Conflict or AlreadyExists, 401 without the bearer token);
* discovery as kube-apiserver serves it (`/version`, `/api`, `/apis`, `/api/v1`, `/apis/coordination.k8s.io/v1`), so
  `kubectl` and the Kubernetes clients' discovery work against it;
* watches as chunked newline-delimited JSON from any resourceVersion the server recorded; a watch from an
  older one than `compact()` kept gets 410 Gone (an ERROR event, or an HTTP 410 when `expired_as_http`).

Semantics (versions, conflicts, not-found) are the memory backend's, so both backends are held to one
behaviour. The server records every event of the store (through the memory backend's own watches) for as
long as it runs; that is the watch history. `close_watches()` ends every open stream (cleanly, or by dropping
the connection) and `refuse_watches` answers new ones with 503 while it is set.

`ClusterApiServer.intercept` is the seam for tests: it sees every request before it is served and may answer
it differently (an injected error, a dropped connection); `tests/support/fake_apiserver.py` uses it.

Not a general API server: no field or label selectors, no pagination (`limit` is ignored), no strategic
merge or JSON patches, no graceful deletion, no admission (the demo calls the webhook itself), no server-side
tables (kubectl prints its own columns). It listens on loopback by default and checks one bearer token, over HTTPS
when given a certificate (the demo's, so that kubectl sends the token); it is not meant to be exposed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import socket
import ssl
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

from hami.cluster.memory import MemoryCluster
from hami.cluster.port import ClusterError, ConflictError, NotFoundError, Resource, Subscription, WatchEvent, meta

log = logging.getLogger(__name__)

__all__ = ["API_VERSION", "KIND", "ApiError", "ApiRequest", "ClusterApiServer", "Override", "status_body"]

CORE = {"nodes": "Node", "namespaces": "Namespace", "pods": "Pod", "resourcequotas": "ResourceQuota", "events": "Event"}
COORDINATION = {"leases": "Lease"}
NAMESPACED = frozenset({"pods", "resourcequotas", "events", "leases"})
API_VERSION = {**dict.fromkeys(CORE, "v1"), **dict.fromkeys(COORDINATION, "coordination.k8s.io/v1")}
"""Resource (plural) → the apiVersion its objects carry."""
KIND = {**CORE, **COORDINATION}
"""Resource (plural) → the kind of its objects."""


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    """A `Status` object as kube-apiserver answers errors with."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 300 else "Success",
        "message": message,
        "reason": reason,
        "code": code,
    }


class ApiError(Exception):
    """An error answer: HTTP status, the Status reason, and the message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        self.code, self.reason, self.message = code, reason, message
        super().__init__(message)


@dataclass(frozen=True)
class ApiRequest:
    """One request as the server received it (the body decoded from JSON, None when empty)."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any
    watch: bool = False


@dataclass(frozen=True)
class Override:
    """How `ClusterApiServer.intercept` answers a request instead of the server.

    `status` 0 drops the connection without answering. With `after`, the request is carried out first and only
    its answer is replaced (a success whose answer was lost)."""

    status: int
    reason: str = "InternalError"
    message: str = "injected failure"
    after: bool = False


@dataclass
class _Route:
    resource: str
    namespace: str | None = None
    name: str | None = None
    sub: str | None = None


@dataclass
class _History:
    events: list[tuple[int, WatchEvent]] = field(default_factory=list)


class _Server(ThreadingHTTPServer):
    """A connection that breaks (a client gone mid-request, a TLS handshake a stopping client abandons) is the
    client's business: logged at debug, not printed as a traceback on the demo's terminal."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            log.debug("connection from %s ended: %s", client_address, error)
            return
        log.exception("serving a request from %s failed", client_address)


class ClusterApiServer:
    """`with ClusterApiServer() as api:` a loopback API server over `api.cluster` (a `MemoryCluster`).

    `port` 0 picks a free port; `token` None makes a random one (the kubeconfig carries it). `tls` (certificate and
    key files) serves HTTPS; `ca`, the file that verifies that certificate, goes into the kubeconfig."""

    def __init__(
        self,
        cluster: MemoryCluster | None = None,
        token: str | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: tuple[Path, Path] | None = None,
        ca: Path | None = None,
    ) -> None:
        self.cluster = cluster or MemoryCluster()
        self.token = token if token is not None else secrets.token_hex(16)
        self.expired_as_http = False
        self.refuse_watches = False
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._history: dict[str, _History] = {r: _History() for r in KIND}
        self._compacted = 0
        self._generation = 0  # bumped by close_watches(): streams of an older generation end
        self._abrupt = False
        self._stopping = False
        self._open_streams = 0
        self._subs: list[Subscription] = [self._record(r) for r in KIND]
        self._httpd = _Server((host, port), _handler(self))
        self._httpd.daemon_threads = True
        self._tls = tls is not None
        self._ca = ca
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            # The handshake happens on the connection's first read, in its own thread, not in the accept loop.
            self._httpd.socket = context.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name="api-server"
        )

    # ---------------------------------------------------------------------------------- control

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{'https' if self._tls else 'http'}://{host!s}:{port}"

    def start(self) -> ClusterApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()
        for sub in self._subs:
            sub.stop()

    def __enter__(self) -> ClusterApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kubeconfig(self, context: str = "hami") -> dict[str, Any]:
        """A kubeconfig for this server with its bearer token."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": context,
                    "cluster": {"server": self.url, **({"certificate-authority": str(self._ca)} if self._ca else {})},
                }
            ],
            "users": [{"name": context, "user": {"token": self.token}}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
            "current-context": context,
        }

    def write_kubeconfig(self, path: Path, context: str = "hami") -> Path:
        """Write `kubeconfig()` to `path` (JSON, which is YAML), readable by the owner only; returns `path`."""
        path.write_text(json.dumps(self.kubeconfig(context), indent=2) + "\n")
        with contextlib.suppress(OSError):
            path.chmod(0o600)
        return path

    def intercept(self, request: ApiRequest) -> Override | None:
        """Called for every request before it is served; None serves it. A subclass may answer otherwise."""
        return None

    def compact(self) -> str:
        """Forget the watch history: a watch from an older resourceVersion now gets 410 Gone."""
        self.cluster.flush()
        with self._lock:
            self._compacted = int(self.cluster.resource_version())
            for h in self._history.values():
                h.events.clear()
            return str(self._compacted)

    def close_watches(self, *, abrupt: bool = False) -> None:
        """End every open watch stream: cleanly (the final chunk) or by dropping the connection."""
        with self._changed:
            self._generation += 1
            self._abrupt = abrupt
            self._changed.notify_all()

    @property
    def open_streams(self) -> int:
        with self._lock:
            return self._open_streams

    def wait_for_streams(self, count: int, timeout: float = 5.0) -> None:
        """Wait until `count` watch streams are open (a client connected or reconnected)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._open_streams < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self._open_streams} watch streams open, expected {count}")
                self._changed.wait(left)

    def flush(self) -> None:
        """Wait until the store's events are in the watch history (they are then streamed at once)."""
        self.cluster.flush()

    # ---------------------------------------------------------------------------------- internals

    def _record(self, resource: str) -> Subscription:
        def on_event(event: WatchEvent) -> None:
            version = int(meta(event.object)["resourceVersion"])
            with self._changed:
                if version > self._compacted:
                    self._history[resource].events.append((version, event))
                self._changed.notify_all()

        return self.cluster.watch(cast(Resource, resource), self.cluster.resource_version(), on_event)


def _typed(resource: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"kind": KIND[resource], "apiVersion": API_VERSION[resource], **obj}


_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def _resources(group: Mapping[str, str]) -> list[dict[str, Any]]:
    found = [
        {
            "name": plural,
            "singularName": kind.lower(),
            "namespaced": plural in NAMESPACED,
            "kind": kind,
            "verbs": _VERBS,
        }
        for plural, kind in group.items()
    ]
    if "pods" in group:
        found.append(
            {"name": "pods/binding", "singularName": "", "namespaced": True, "kind": "Binding", "verbs": ["create"]}
        )
        found.append(
            {
                "name": "pods/eviction", "singularName": "", "namespaced": True, "group": "policy", "version": "v1",
                "kind": "Eviction", "verbs": ["create"],
            }
        )  # fmt: skip
    return found


def _discovery(path: str, address: Any) -> dict[str, Any] | None:
    """The discovery document kube-apiserver serves at `path` (for what this server serves), or None."""
    host, port = address[:2]
    if path == "/version":
        return {"major": "1", "minor": "35", "gitVersion": "v1.35.0+hami-memory", "platform": "linux/amd64"}
    if path == "/api":
        cidr = {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{host}:{port}"}
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [cidr]}
    if path == "/apis":
        version = {"groupVersion": "coordination.k8s.io/v1", "version": "v1"}
        group = {"name": "coordination.k8s.io", "versions": [version], "preferredVersion": version}
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}
    if path == "/api/v1":
        return {"kind": "APIResourceList", "groupVersion": "v1", "resources": _resources(CORE)}
    if path == "/apis/coordination.k8s.io/v1":
        resources = _resources(COORDINATION)
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": "coordination.k8s.io/v1",
            "resources": resources,
        }
    return None


def _route(path: str) -> _Route:
    parts = [unquote(p) for p in path.strip("/").split("/")]
    if parts[:2] == ["api", "v1"]:
        rest, group = parts[2:], CORE
    elif parts[:3] == ["apis", "coordination.k8s.io", "v1"]:
        rest, group = parts[3:], COORDINATION
    else:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    else:
        namespace = None
    if not rest or rest[0] not in group or len(rest) > 3:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    route = _Route(rest[0], namespace, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None)
    if route.resource in NAMESPACED and route.name is not None and namespace is None:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    if route.sub is not None and (route.resource, route.sub) not in (("pods", "binding"), ("pods", "eviction")):
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    return route


def _handler(api: ClusterApiServer) -> type[BaseHTTPRequestHandler]:
    cluster = api.cluster

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no delayed-ACK stalls

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        # ------------------------------------------------------------------------------ plumbing

        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _drop(self) -> None:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            content_type = self.headers.get("Content-Type") or ""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                self._send(400, status_body(400, "BadRequest", "the body is not JSON"))
                return
            watch = query.get("watch") in ("true", "1")
            override = api.intercept(ApiRequest(method, url.path, query, content_type, body, watch))
            if override is not None and override.after:
                with contextlib.suppress(ApiError, NotFoundError, ConflictError):
                    self._dispatch(method, _route(url.path), query, content_type, body)
            if override is not None:
                if override.status == 0:
                    self._drop()
                    return
                self._send(override.status, status_body(override.status, override.reason, override.message))
                return
            if self.headers.get("Authorization") != f"Bearer {api.token}":
                self._send(401, status_body(401, "Unauthorized", "Unauthorized"))
                return
            if method == "GET" and (document := _discovery(url.path.rstrip("/") or "/", self.server.server_address)):
                self._send(200, document)
                return
            try:
                route = _route(url.path)
                if method == "GET" and route.name is None and watch:
                    if api.refuse_watches:
                        raise ApiError(503, "ServiceUnavailable", "watches are refused for now")
                    self._watch(route, query)
                    return
                code, answer = self._dispatch(method, route, query, content_type, body)
            except ApiError as exc:
                self._send(exc.code, status_body(exc.code, exc.reason, exc.message))
                return
            except NotFoundError as exc:
                self._send(404, status_body(404, "NotFound", str(exc)))
                return
            except ConflictError as exc:
                reason = "AlreadyExists" if "already exists" in str(exc) else "Conflict"
                what = f'{route.resource} "{route.name}"' if route.name else route.resource
                message = str(exc) if reason == "AlreadyExists" else f"Operation cannot be fulfilled on {what}: {exc}"
                self._send(409, status_body(409, reason, message))
                return
            self._send(code, answer)

        def _dispatch(
            self, method: str, route: _Route, query: dict[str, str], content_type: str, body: Any
        ) -> tuple[int, Any]:
            r, ns, name = cast(Resource, route.resource), route.namespace, route.name
            if route.sub == "binding":
                if method != "POST":
                    raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on pods/binding")
                return self._bind(ns or "default", name or "", body)
            if route.sub == "eviction":
                if method != "POST":
                    raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on pods/eviction")
                return self._evict(ns or "default", name or "", body)
            if name is None:
                if method == "GET":
                    items, version = cluster.list(r, ns)
                    for item in items:
                        item.pop("kind", None)
                        item.pop("apiVersion", None)
                    return 200, {
                        "kind": KIND[r] + "List",
                        "apiVersion": API_VERSION[r],
                        "metadata": {"resourceVersion": version},
                        "items": items,
                    }
                if method == "POST":
                    obj = self._object(r, body)
                    m = obj.setdefault("metadata", {})
                    if r in NAMESPACED:
                        if ns is None:
                            raise ApiError(404, "NotFound", "create needs a namespace in the path")
                        if m.get("namespace") not in (None, ns):
                            raise ApiError(
                                400,
                                "BadRequest",
                                "the namespace of the provided object does not match the namespace sent on the request",
                            )
                        m["namespace"] = ns
                    if not m.get("name") and not m.get("generateName"):
                        raise ApiError(422, "Invalid", f"{KIND[r]} is invalid: metadata.name: Required value")
                    return 201, _typed(r, cluster.create(r, obj))
                raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on a collection")
            if method == "GET":
                return 200, _typed(r, cluster.get(r, name, ns))
            if method == "PUT":
                obj = self._object(r, body)
                m = obj.setdefault("metadata", {})
                if m.get("name") != name:
                    raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
                if r in NAMESPACED:
                    m["namespace"] = ns
                return 200, _typed(r, cluster.replace(r, obj))
            if method == "DELETE":
                current = cluster.get(r, name, ns)
                cluster.delete(r, name, ns)
                return 200, _typed(r, current)
            if method == "PATCH":
                return 200, _typed(r, self._patch(r, ns, name, content_type, body))
            raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed")

        @staticmethod
        def _object(resource: str, body: Any) -> dict[str, Any]:
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "the body must be a JSON object")
            kind, version = body.get("kind"), body.get("apiVersion")
            if (kind and kind != KIND[resource]) or (version and version != API_VERSION[resource]):
                raise ApiError(
                    400, "BadRequest", f"expected {API_VERSION[resource]} {KIND[resource]}, got {version} {kind}"
                )
            return {k: v for k, v in body.items() if k not in ("kind", "apiVersion")}

        @staticmethod
        def _patch(resource: Resource, ns: str | None, name: str, content_type: str, body: Any) -> dict[str, Any]:
            if content_type.split(";")[0].strip() != "application/merge-patch+json":
                raise ApiError(415, "UnsupportedMediaType", f"this server takes merge patches, not {content_type}")
            if not isinstance(body, dict) or set(body) - {"metadata"}:
                raise ApiError(422, "Invalid", "this server patches metadata only")
            m = body.get("metadata") or {}
            if set(m) - {"annotations", "labels", "resourceVersion"}:
                raise ApiError(422, "Invalid", "this server patches annotations, labels and resourceVersion only")
            return cluster.patch_metadata(
                resource,
                name,
                ns,
                annotations=m.get("annotations"),
                labels=m.get("labels"),
                resource_version=m.get("resourceVersion"),
            )

        @staticmethod
        def _bind(ns: str, name: str, body: Any) -> tuple[int, Any]:
            if not isinstance(body, dict) or body.get("kind") != "Binding":
                raise ApiError(400, "BadRequest", "expected a v1 Binding")
            m = body.get("metadata") or {}
            if m.get("name") != name:
                raise ApiError(400, "BadRequest", "the Binding's name does not match the pod's")
            target = body.get("target") or {}
            carried = {k: v for k in ("annotations", "labels") if isinstance(v := m.get(k), dict)}
            cluster.bind(ns, name, m.get("uid") or "", target.get("name") or "", **carried)
            return 201, status_body(201, "", "")

        @staticmethod
        def _evict(ns: str, name: str, body: Any) -> tuple[int, Any]:
            """The Eviction API over the memory backend's `evict` (which honours its PodDisruptionBudgets)."""
            if not isinstance(body, dict) or body.get("kind") != "Eviction":
                raise ApiError(400, "BadRequest", "expected a policy/v1 Eviction")
            if (body.get("metadata") or {}).get("name") != name:
                raise ApiError(400, "BadRequest", "the Eviction's name does not match the pod's")
            uid = str(((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid") or "")
            try:
                cluster.evict(ns, name, uid)
            except NotFoundError:
                raise
            except ClusterError as exc:
                raise ApiError(exc.status or 500, exc.reason or "InternalError", str(exc)) from None
            return 201, status_body(201, "", "")

        # ------------------------------------------------------------------------------ watches

        def _watch(self, route: _Route, query: dict[str, str]) -> None:
            r, ns = route.resource, route.namespace
            version = query.get("resourceVersion", "")
            timeout = float(query.get("timeoutSeconds") or 1800)
            initial: list[WatchEvent] = []
            if version in ("", "0"):
                items, version = cluster.list(cast(Resource, r), ns)
                initial = [WatchEvent("ADDED", o) for o in items]
            start = int(version)
            with api._lock:
                expired = start < api._compacted
                generation = api._generation
            message = f"too old resource version: {start} ({api._compacted})"
            if expired and api.expired_as_http:
                self._send(410, status_body(410, "Expired", message))
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with api._changed:
                api._open_streams += 1
                api._changed.notify_all()
            try:
                if expired:
                    self._chunk({"type": "ERROR", "object": status_body(410, "Expired", message)})
                    self._end()
                    return
                for event in initial:
                    self._chunk({"type": event.type, "object": _typed(r, event.object)})
                deadline = time.monotonic() + timeout
                position = start
                while True:
                    with api._changed:
                        pending = [
                            e
                            for v, e in api._history[r].events
                            if v > position and (ns is None or meta(e.object).get("namespace") == ns)
                        ]
                        newest = max((v for v, _ in api._history[r].events), default=position)
                        cut = api._generation != generation or api._stopping
                        if not pending and not cut:
                            api._changed.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                    position = max(position, newest)
                    for event in pending:
                        self._chunk({"type": event.type, "object": _typed(r, event.object)})
                    if cut:
                        if api._abrupt:
                            self._drop()
                            return
                        break
                    if time.monotonic() >= deadline:
                        break
                self._end()
            except OSError:
                self.close_connection = True
            finally:
                with api._changed:
                    api._open_streams -= 1
                    api._changed.notify_all()

        def _chunk(self, event: dict[str, Any]) -> None:
            data = json.dumps(event).encode() + b"\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _end(self) -> None:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler
