"""An in-memory Kubernetes API with the semantics HAMi relies on, for tests, the demo and the simulator.

Owns a store of JSON objects per resource with one global resourceVersion counter, preconditions that fail
with `ConflictError` exactly where the API server's do (stale resourceVersion, binding an already bound pod
or a pod whose UID changed), `NotFoundError` for missing objects, and watches.

Watches are asynchronous, like real ones: each subscription has its own delivery thread, so a writer never
runs a watcher's handler (no lock-order traps between a service's state lock and this store's lock).
`flush()` waits until every event so far has been delivered, which is what tests use instead of sleeping.
"""

from __future__ import annotations

import copy
import queue
import threading
import uuid as uuidlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

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
    selects,
)

__all__ = ["MemoryCluster"]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Subscription:
    def __init__(self, cluster: MemoryCluster, resource: str, handler: WatchHandler) -> None:
        self.resource = resource
        self.handler = handler
        self.queue: queue.Queue[WatchEvent | None] = queue.Queue()
        self._cluster = cluster
        self._thread = threading.Thread(target=self._run, name=f"watch-{resource}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            event = self.queue.get()
            try:
                if event is None:
                    return
                self.handler(event)
            except Exception:  # a failing handler must not stop the watch
                import logging

                logging.getLogger(__name__).exception("watch handler for %s failed", self.resource)
            finally:
                self.queue.task_done()

    def stop(self) -> None:
        self._cluster._unsubscribe(self)
        self.queue.put(None)


class MemoryCluster:
    """The in-memory backend of `hami.cluster.port.Cluster`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = 0
        self._store: dict[str, dict[tuple[str, str], KubeObject]] = {}
        self._subs: list[_Subscription] = []
        self.events: list[KubeObject] = []
        self.copies_binding_labels = True
        """Whether `bind` sets the Binding's labels on the pod (kube-apiserver's PodTopologyLabelsAdmission)."""

    # ---------------------------------------------------------------------------------- internals

    @staticmethod
    def _key(resource: str, name: str, namespace: str | None) -> tuple[str, str]:
        return ((namespace or "default") if resource in NAMESPACED else "", name)

    def _bump(self, resource: str, obj: KubeObject, kind: str) -> KubeObject:
        """Store `obj` with a new resourceVersion and queue its event; caller holds the lock."""
        m = obj.setdefault("metadata", {})
        self._version += 1
        m["resourceVersion"] = str(self._version)
        key = self._key(resource, m["name"], m.get("namespace"))
        table = self._store.setdefault(resource, {})
        if kind == "DELETED":
            table.pop(key, None)
        else:
            table[key] = obj
        for sub in self._subs:
            if sub.resource == resource:
                sub.queue.put(WatchEvent(kind, copy.deepcopy(obj)))  # type: ignore[arg-type]
        return copy.deepcopy(obj)

    def _find(self, resource: str, name: str, namespace: str | None) -> KubeObject:
        obj = self._store.get(resource, {}).get(self._key(resource, name, namespace))
        if obj is None:
            where = f"{namespace}/{name}" if resource in NAMESPACED else name
            raise NotFoundError(f'{resource} "{where}" not found')
        return obj

    def _unsubscribe(self, sub: _Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    # ---------------------------------------------------------------------------------- the port

    def list(self, resource: Resource, namespace: str | None = None) -> tuple[list[KubeObject], str]:
        with self._lock:
            items = [
                copy.deepcopy(o)
                for (ns, _), o in sorted(self._store.get(resource, {}).items())
                if namespace is None or ns == namespace
            ]
            return items, self.resource_version()

    def resource_version(self) -> str:
        """The current global resourceVersion (what a list would return)."""
        return str(self._version)

    def get(self, resource: Resource, name: str, namespace: str | None = None, *, recent: bool = False) -> KubeObject:
        """The object as stored (here the latest is always at hand, `recent` or not)."""
        with self._lock:
            return copy.deepcopy(self._find(resource, name, namespace))

    def watch(self, resource: Resource, resource_version: str, handler: WatchHandler) -> _Subscription:
        with self._lock:
            if resource_version != self.resource_version():
                # Events before now are not kept: a watcher that listed earlier must list again.
                newer = [
                    o
                    for o in self._store.get(resource, {}).values()
                    if int(meta(o)["resourceVersion"]) > int(resource_version or 0)
                ]
                if newer:
                    raise ConflictError(f"resourceVersion {resource_version} is too old; list again")
            sub = _Subscription(self, resource, handler)
            self._subs.append(sub)
            return sub

    def create(self, resource: Resource, obj: KubeObject) -> KubeObject:
        obj = copy.deepcopy(obj)
        m = obj.setdefault("metadata", {})
        if not m.get("name") and m.get("generateName"):
            m["name"] = m["generateName"] + uuidlib.uuid4().hex[:5]
        if not m.get("name"):
            raise ConflictError(f"a {resource} object needs metadata.name")
        if resource in NAMESPACED:
            m.setdefault("namespace", "default")
        with self._lock:
            if self._store.get(resource, {}).get(self._key(resource, m["name"], m.get("namespace"))) is not None:
                raise ConflictError(f'{resource} "{m["name"]}" already exists')
            m.setdefault("uid", str(uuidlib.uuid4()))
            m.setdefault("creationTimestamp", _now())
            return self._bump(resource, obj, "ADDED")

    def replace(self, resource: Resource, obj: KubeObject) -> KubeObject:
        obj = copy.deepcopy(obj)
        m = meta(obj)
        with self._lock:
            current = self._find(resource, m.get("name", ""), m.get("namespace"))
            want = m.get("resourceVersion")
            if want and want != meta(current)["resourceVersion"]:
                raise ConflictError(
                    f"the object has been modified (resourceVersion {want} != {meta(current)['resourceVersion']})"
                )
            m["uid"] = meta(current).get("uid")
            return self._bump(resource, obj, "MODIFIED")

    def delete(self, resource: Resource, name: str, namespace: str | None = None) -> None:
        with self._lock:
            obj = self._find(resource, name, namespace)
            self._bump(resource, obj, "DELETED")

    def evict(self, namespace: str, name: str, uid: str = "") -> None:
        """The Eviction API as the API server answers it: a budget selecting the pod with no disruption allowed
        refuses (429, TooManyRequests); otherwise each selecting budget's `status.disruptionsAllowed` is spent and
        the pod is deleted."""
        with self._lock:
            pod = self._find("pods", name, namespace)
            m = meta(pod)
            if uid and m.get("uid") != uid:
                raise NotFoundError(f'pods "{namespace}/{name}" with UID {uid} not found (the pod was replaced)')
            labels = m.get("labels") or {}
            budgets = [
                b
                for (ns, _), b in self._store.get("poddisruptionbudgets", {}).items()
                if ns == (namespace or "default") and selects((b.get("spec") or {}).get("selector") or {}, labels)
            ]
            for budget in budgets:
                if int((budget.get("status") or {}).get("disruptionsAllowed") or 0) <= 0:
                    raise ClusterError(
                        f"Cannot evict pod as it would violate the pod's disruption budget {meta(budget).get('name')}.",
                        status=429,
                        reason="TooManyRequests",
                    )
            for budget in budgets:
                status = budget.setdefault("status", {})
                status["disruptionsAllowed"] = int(status.get("disruptionsAllowed") or 0) - 1
                self._bump("poddisruptionbudgets", budget, "MODIFIED")
            self._bump("pods", pod, "DELETED")

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
        with self._lock:
            current = self._find(resource, name, namespace)
            if resource_version and resource_version != meta(current)["resourceVersion"]:
                raise ConflictError(
                    f"the object has been modified (resourceVersion {resource_version} != "
                    f"{meta(current)['resourceVersion']})"
                )
            obj = copy.deepcopy(current)
            m = meta(obj)
            for field, changes in (("annotations", annotations), ("labels", labels)):
                if not changes:
                    continue
                values: dict[str, Any] = m.setdefault(field, {})
                for key, value in changes.items():
                    if value is None:
                        values.pop(key, None)
                    else:
                        values[key] = value
            return self._bump(resource, obj, "MODIFIED")

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
        """As kube-apiserver 1.35 binds (its PodTopologyLabelsAdmission on, the default): the Binding's annotations
        and labels merged into the pod's in the write that sets its node; `copies_binding_labels = False` drops the
        labels, as an API server with that feature off does."""
        with self._lock:
            pod = self._find("pods", name, namespace)
            if uid and meta(pod).get("uid") != uid:
                raise ConflictError(f"pod {namespace}/{name} has UID {meta(pod).get('uid')}, not {uid}")
            spec = pod.setdefault("spec", {})
            if spec.get("nodeName"):
                raise ConflictError(f"pod {namespace}/{name} is already assigned to node {spec['nodeName']}")
            if "nodes" in self._store and ("", node) not in self._store["nodes"]:
                raise NotFoundError(f'nodes "{node}" not found')
            obj = copy.deepcopy(pod)
            obj["spec"]["nodeName"] = node
            obj.setdefault("status", {})["conditions"] = [{"type": "PodScheduled", "status": "True"}]
            carried = {"annotations": annotations, "labels": labels if self.copies_binding_labels else None}
            for field, values in carried.items():
                if values:
                    obj["metadata"].setdefault(field, {}).update(values)
            self._bump("pods", obj, "MODIFIED")

    def record_event(self, obj: KubeObject, reason: str, message: str, *, warning: bool = False) -> None:
        m = meta(obj)
        with self._lock:
            self.events.append(
                {
                    "involvedObject": {
                        "kind": obj.get("kind", ""),
                        "name": m.get("name"),
                        "namespace": m.get("namespace"),
                    },
                    "reason": reason,
                    "message": message,
                    "type": "Warning" if warning else "Normal",
                }
            )

    # ---------------------------------------------------------------------------------- test helpers

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every event queued so far has been delivered to every watcher."""
        with self._lock:
            subs = list(self._subs)
        for sub in subs:
            done = threading.Event()

            def join(s: _Subscription = sub, d: threading.Event = done) -> None:
                s.queue.join()
                d.set()

            threading.Thread(target=join, daemon=True).start()
            if not done.wait(timeout):
                raise TimeoutError(f"watch of {sub.resource} did not drain within {timeout} s")
