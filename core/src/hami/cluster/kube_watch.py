"""One watch of one resource on a Kubernetes API server, for `hami.cluster.kube.KubeCluster.watch`.

Owns the watch's thread, its position (the last resourceVersion it saw) and what it knows to exist (a slim copy of
every object it reported as present). Concurrency: one thread per watch. It opens the watch stream from the last
resourceVersion it saw, calls the handler for each event in order on that thread (a failing handler is logged, the
watch goes on), reconnects after timeouts and disconnects with a backoff that grows with the attempts that got
nowhere, and on 410 Gone lists again, delivering a MODIFIED for every listed object and a DELETED for every object
that disappeared, so a consumer's state converges. `stop()` shuts the stream's socket down so the thread ends at
once. Bookmarks move the position and are not delivered; every delivered object names its kind.

It must not build requests or retry a call itself: the backend it watches through (`WatchSource`) lists and opens
the stream, one attempt each, so that this thread owns the only retry loop and can be stopped while it waits. Like
the backend, it must not interpret objects beyond their metadata.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal, Protocol, cast

from hami.cluster.kube_transport import CONNECTION_ERRORS, decode_json, status_error
from hami.cluster.port import ClusterError, KubeObject, WatchEvent, WatchHandler, meta

__all__ = ["Known", "KubeWatch", "WatchSource", "name_key", "slim"]

log = logging.getLogger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
Known = dict[tuple[str, str], KubeObject]
"""(namespace, name) → what a watch keeps of an object it knows to exist (`slim`)."""

_WATCH_ERRORS: tuple[type[Exception], ...] = (ClusterError, ValueError, *CONNECTION_ERRORS)


class WatchSource(Protocol):
    """What a watch asks of the backend it watches through: each call one attempt, the watch's loop retries."""

    def list_once(self, resource: str) -> tuple[list[KubeObject], str]:
        """Every object of `resource` (all namespaces, kind and apiVersion set) and the list's resourceVersion."""
        ...

    def open_stream(self, resource: str, resource_version: str) -> Any:
        """The open watch stream (newline-delimited JSON events) from `resource_version`; a `ClusterError` with
        status 410 when the server no longer keeps that version."""
        ...

    def retry_delay(self, failures: int) -> float:
        """Seconds to wait after `failures` consecutive attempts that got nowhere."""
        ...


class _Expired(Exception):
    """The watch's resourceVersion is older than the server keeps (410 Gone)."""


def name_key(obj: KubeObject) -> tuple[str, str]:
    """The (namespace, name) a watch knows an object by."""
    m = meta(obj)
    return (str(m.get("namespace") or ""), str(m.get("name") or ""))


def slim(obj: KubeObject) -> KubeObject:
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


class KubeWatch:
    """One watch: its thread, its position (resourceVersion) and the objects it has reported as present."""

    def __init__(
        self,
        source: WatchSource,
        resource: str,
        resource_version: str,
        handler: WatchHandler,
        *,
        api_version: str,
        kind: str,
    ) -> None:
        """Watch `resource` (whose objects are `kind` in `api_version`) from `resource_version` through `source`,
        delivering to `handler` once started."""
        self.source = source
        self.resource = resource
        self.handler = handler
        self.resource_version = resource_version
        self.api_version = api_version
        self.kind = kind
        self._known: Known = {}
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
                self._stopped.wait(self.source.retry_delay(min(failures, 8)))

    def seed(self, known: Known) -> None:
        """Start knowing these objects (from the list the watch's version came from): no list of its own."""
        self._known = known
        self._seeded = True

    def _seed(self) -> None:
        """Learn which objects exist, so a later re-list can tell the consumer which ones disappeared."""
        items, _ = self.source.list_once(self.resource)
        self._known = {name_key(o): slim(o) for o in items}
        self._seeded = True

    def _stream(self) -> bool:
        """Deliver one stream's events; True when any arrived. Raises `_Expired` on 410."""
        try:
            response = self.source.open_stream(self.resource, self.resource_version)
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
                event = decode_json(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        raise _Expired
                    raise status_error(int(code or 500), json.dumps(obj).encode(), f"watch {self.resource}")
                version = meta(obj).get("resourceVersion")
                if version:
                    self.resource_version = str(version)
                if kind == "BOOKMARK" or kind not in ("ADDED", "MODIFIED", "DELETED"):
                    continue
                obj.setdefault("apiVersion", self.api_version)
                obj.setdefault("kind", self.kind)
                if kind == "DELETED":
                    self._known.pop(name_key(obj), None)
                else:
                    self._known[name_key(obj)] = slim(obj)
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
        items, version = self.source.list_once(self.resource)
        listed = {name_key(o): o for o in items}
        gone = [o for key, o in self._known.items() if key not in listed]
        self._known = {key: slim(o) for key, o in listed.items()}
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
            log.exception("watch handler for %s failed on %s %s", self.resource, event.type, name_key(event.object))


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
