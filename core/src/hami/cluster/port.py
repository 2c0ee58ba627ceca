"""The Kubernetes port: the few verbs the services need, and the errors they raise, independent of any backend.

Objects travel as the JSON dictionaries the API serves (``{"metadata": …, "spec": …, "status": …}``), so
the in-memory backend, the real client backend and the services agree on one shape without a translation
layer. Resources are named by their plural (`nodes`, `pods`, `leases`, `resourcequotas`, `namespaces`,
`events`). Every write that must not lose a race takes the resourceVersion it read; a stale one raises
`ConflictError` and the caller re-reads.

This module defines the interface only; `hami.cluster.memory` and `hami.cluster.kube` implement it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from hami.errors import HamiError

__all__ = [
    "Cluster",
    "ClusterError",
    "ListPages",
    "ConflictError",
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "KubeObject",
    "NotFoundError",
    "Resource",
    "Subscription",
    "WatchEvent",
    "WatchHandler",
    "list_pages",
    "meta",
    "pod_key",
    "revision",
    "selects",
]

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z"
r"""A Kubernetes object name (RFC 1123 subdomain). `\Z`, not `$`: Python's `$` also matches before a trailing
newline."""
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z"
"""A namespace's name (RFC 1123 label)."""

KubeObject = dict[str, Any]
Resource = Literal[
    "nodes", "pods", "leases", "resourcequotas", "namespaces", "events", "resourceslices", "resourceclaims",
    "poddisruptionbudgets", "podgroups", "volcanopodgroups",
]  # fmt: skip
"""`podgroups`: the coscheduling plugin's PodGroup (scheduling.x-k8s.io); `volcanopodgroups`: Volcano's
(scheduling.volcano.sh). Either CRD may be absent: reading it then raises `NotFoundError`."""
NAMESPACED: frozenset[str] = frozenset(
    {
        "pods",
        "leases",
        "resourcequotas",
        "events",
        "resourceclaims",
        "poddisruptionbudgets",
        "podgroups",
        "volcanopodgroups",
    }
)


class ClusterError(HamiError):
    """The API answered with an error (or could not be reached); `status` is the HTTP status (0 if none)."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        self.status = status
        self.reason = reason
        super().__init__(message)


class NotFoundError(ClusterError):
    def __init__(self, message: str) -> None:
        super().__init__(message, 404, "NotFound")


class ConflictError(ClusterError):
    """A precondition (resourceVersion, UID, already bound) failed: re-read and decide again."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 409, "Conflict")


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    object: KubeObject


WatchHandler = Callable[[WatchEvent], None]


class Subscription(Protocol):
    def stop(self) -> None: ...


class ListPages:
    """A list read a page at a time (`list_pages`): iterating gives the pages, each a list of objects, and
    `version`, the list's resourceVersion to watch from, is known once the first page has been read. A consumer
    that keeps only what it needs of each page never holds the whole list: the pods of 5,000 nodes are about 350
    MiB as objects."""

    def __init__(self, pages: Iterator[list[KubeObject]], version: Callable[[], str]) -> None:
        self._pages = pages
        self._version = version

    def __iter__(self) -> Iterator[list[KubeObject]]:
        return self._pages

    @property
    def version(self) -> str:
        return self._version()

    def close(self) -> None:
        """Read no more pages (a caller that stops part-way: the backend stops fetching)."""
        close: Callable[[], None] | None = getattr(self._pages, "close", None)
        if close is not None:
            close()


def list_pages(cluster: Cluster, resource: Resource) -> ListPages:
    """All objects of `resource` (in all namespaces) a page at a time, each fetched while the one before is used,
    where the backend reads lists in pages (`KubeCluster.list_pages`); else the whole list as one page. A list
    whose continue token expires part-way raises `ClusterError` with status 410 (the pages given are not taken
    back): the caller lists again."""
    paged: Callable[[Resource], ListPages] | None = getattr(cluster, "list_pages", None)
    if paged is not None:
        return paged(resource)
    items, version = cluster.list(resource)
    return ListPages(iter([items]), lambda: version)


class Cluster(Protocol):
    """What HAMi's services do with a Kubernetes API."""

    def list(self, resource: Resource, namespace: str | None = None) -> tuple[list[KubeObject], str]:
        """All objects (of one namespace, or all) and the list's resourceVersion to watch from."""
        ...

    def get(self, resource: Resource, name: str, namespace: str | None = None, *, recent: bool = False) -> KubeObject:
        """One object as stored; `recent`: any recent version the API server holds (`resourceVersion=0`, served
        from its watch cache without a read of etcd), which may be a moment behind the latest write. A caller
        asking for it checks what it read and reads again without it when that is not yet what it waits for."""
        ...

    def watch(self, resource: Resource, resource_version: str, handler: WatchHandler) -> Subscription:
        """Deliver every change after `resource_version` to `handler`, in order, until stopped."""
        ...

    def create(self, resource: Resource, obj: KubeObject) -> KubeObject: ...

    def replace(self, resource: Resource, obj: KubeObject) -> KubeObject:
        """Write the whole object; its metadata.resourceVersion is the precondition."""
        ...

    def delete(self, resource: Resource, name: str, namespace: str | None = None) -> None: ...

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
        """Merge annotations and labels (None removes a key); with `resource_version`, only if unchanged."""
        ...

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
        """Create the pod's Binding to `node`; ConflictError if the pod is already bound or its UID differs. The
        Binding carries `annotations` and `labels`: kube-apiserver merges its annotations into the pod's in the
        same write that sets the node (BindingREST's setPodNodeAndMetadata), and its labels too where the
        PodTopologyLabelsAdmission feature is on (beta, on by default from 1.35; before, they are dropped)."""
        ...

    def record_event(self, obj: KubeObject, reason: str, message: str, *, warning: bool = False) -> None:
        """Best effort: an Event about `obj`; never raises."""
        ...

    def evict(self, namespace: str, name: str, uid: str = "") -> None:
        """Evict the pod through the Eviction API (`pods/eviction`, policy/v1), so that its PodDisruptionBudgets
        are honoured: `ClusterError` with status 429 when a budget forbids it now, `NotFoundError` when the pod
        (with this UID, if given) is gone."""
        ...


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a label selector (`matchLabels`, `matchExpressions` with In, NotIn, Exists, DoesNotExist) selects
    an object with `labels`; the empty selector selects everything, as policy/v1 reads it."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        key, operator = str(expression.get("key") or ""), expression.get("operator")
        values = [str(v) for v in expression.get("values") or ()]
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object's metadata (an empty dict when absent)."""
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def pod_key(namespace: str, name: str) -> str:
    """How a pod is named across the services' maps: `namespace/name`."""
    return f"{namespace}/{name}"


def revision(value: object) -> int | None:
    """A resourceVersion as a number (etcd's revision), None when it is not one."""
    try:
        return int(str(value))
    except ValueError:
        return None
