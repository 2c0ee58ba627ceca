"""The labels of every namespace, kept by a watch, so admission can honour `hami.io/webhook: ignore` on a namespace.

Owns nothing but that table: one list at start, then watch events; `labels(namespace)` never calls the API.
The MutatingWebhookConfiguration's `namespaceSelector` excludes such namespaces before the API server calls
the webhook at all; this is the same rule applied again, for configurations written without the selector.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from hami.cluster.port import Cluster, Subscription, WatchEvent, meta

__all__ = ["NamespaceLabels"]

log = logging.getLogger(__name__)


class NamespaceLabels:
    """Namespace name → its labels, current through a watch."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._lock = threading.Lock()
        self._labels: dict[str, dict[str, str]] = {}
        self._sub: Subscription | None = None

    def start(self) -> NamespaceLabels:
        """List the namespaces, then watch them. Raises `ClusterError` when the list fails."""
        items, rv = self.cluster.list("namespaces")
        with self._lock:
            self._labels = {str(meta(o).get("name")): _labels_of(o) for o in items}
        self._sub = self.cluster.watch("namespaces", rv, self._on_event)
        return self

    def stop(self) -> None:
        if self._sub is not None:
            self._sub.stop()
            self._sub = None

    def _on_event(self, event: WatchEvent) -> None:
        name = str(meta(event.object).get("name"))
        with self._lock:
            if event.type == "DELETED":
                self._labels.pop(name, None)
            else:
                self._labels[name] = _labels_of(event.object)

    def labels(self, namespace: str) -> Mapping[str, str]:
        """The namespace's labels (empty when it is unknown)."""
        with self._lock:
            return self._labels.get(namespace, {})


def _labels_of(obj: Mapping[str, object]) -> dict[str, str]:
    labels = meta(obj).get("labels")
    if not isinstance(labels, Mapping):
        return {}
    return {str(k): str(v) for k, v in labels.items()}
