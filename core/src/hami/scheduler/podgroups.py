"""Which gang a pod names, and how many of its members must run together.

A pod names a gang the way the ecosystem does: the coscheduling plugin's `scheduling.x-k8s.io/pod-group` label
(its PodGroup's `spec.minMember` says how many must run), Volcano's `scheduling.k8s.io/group-name` annotation (its
PodGroup's `spec.minMember`), or this project's `hami.io/gang` annotation with `hami.io/gang-size` (for clusters
with neither CRD; the size also stands in when the named PodGroup cannot be read), or Kueue's plain-pod group
(`kueue.x-k8s.io/pod-group-name` label with its `kueue.x-k8s.io/pod-group-total-count` annotation: Kueue admits the
group's quota at once, the gang places it at once). `hami.io/gang-timeout` sets how long its holds wait;
`hami.io/gang-topology: node` keeps every member on one node; `island` keeps each member's devices within one island
of linked devices (NVLink, HCCS, MetaXLink: the rule is `hami.islands`, applied wherever the pod is fitted);
`node,island` both.

Owns reading those labels, annotations and PodGroups into a `GroupRef`, with a `GangError` saying what to fix
when they cannot be read. Must not hold, place or count anything (`hami.scheduler.gangs` does).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hami.cluster.port import DNS_SUBDOMAIN, Cluster, ClusterError, KubeObject, NotFoundError, Resource, meta
from hami.islands import GANG_TOPOLOGY_ANNOTATION, NODE, topology_words

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "GANG_ANNOTATION",
    "GANG_SIZE_ANNOTATION",
    "GANG_TIMEOUT_ANNOTATION",
    "GANG_TOPOLOGY_ANNOTATION",
    "KUEUE_COUNT_ANNOTATION",
    "KUEUE_GROUP_LABEL",
    "MAX_GANG_SIZE",
    "POD_GROUP_LABEL",
    "VOLCANO_GROUP_ANNOTATION",
    "GangError",
    "GroupRef",
    "group_of",
    "members_needed",
]

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
GANG_ANNOTATION = "hami.io/gang"
GANG_SIZE_ANNOTATION = "hami.io/gang-size"
GANG_TIMEOUT_ANNOTATION = "hami.io/gang-timeout"

DEFAULT_TIMEOUT_SECONDS = 60.0
"""How long a gang's holds wait for every held member to reach its filter before all are released."""
MAX_GANG_SIZE = 4096
MAX_TIMEOUT_SECONDS = 3600.0
_NAME = re.compile(DNS_SUBDOMAIN)
_SOURCES: dict[str, tuple[Resource, str]] = {
    "coscheduling": ("podgroups", "scheduling.x-k8s.io/v1alpha1"),
    "volcano": ("volcanopodgroups", "scheduling.volcano.sh/v1beta1"),
}


class GangError(ValueError):
    """A pod's gang annotations or labels that cannot be read; the message says what to fix."""


@dataclass(frozen=True)
class GroupRef:
    """The gang a pod names."""

    namespace: str
    name: str
    source: str
    """"coscheduling", "volcano", "kueue" or "hami": where the member count is read."""
    size: int | None = None
    """`hami.io/gang-size`, when given."""
    one_node: bool = False
    timeout: float = DEFAULT_TIMEOUT_SECONDS

    @property
    def key(self) -> str:
        return f"{self.source}:{self.namespace}/{self.name}"


def group_of(obj: KubeObject) -> GroupRef | None:
    """The gang the pod names (None: none), or `GangError` saying what is wrong with how it names one."""
    m = meta(obj)
    labels, annotations = m.get("labels") or {}, m.get("annotations") or {}
    named = [
        (source, str(value))
        for source, value in (
            ("coscheduling", labels.get(POD_GROUP_LABEL)),
            ("volcano", annotations.get(VOLCANO_GROUP_ANNOTATION)),
            ("hami", annotations.get(GANG_ANNOTATION)),
            ("kueue", labels.get(KUEUE_GROUP_LABEL)),
        )
        if value
    ]
    if not named:
        return None
    if len({name for _, name in named}) > 1:
        raise GangError("the pod names more than one gang (" + ", ".join(f"{s}: {n}" for s, n in named) + "): name one")
    source, name = named[0]
    if not _NAME.match(name):
        raise GangError(f"gang name {name[:80]!r} is not a valid object name (lower-case letters, digits, '-', '.')")
    size = _number(annotations, GANG_SIZE_ANNOTATION, 1, MAX_GANG_SIZE)
    if source == "kueue":
        size = _number(annotations, KUEUE_COUNT_ANNOTATION, 1, MAX_GANG_SIZE) or size
        if size is None:
            raise GangError(f"{KUEUE_GROUP_LABEL} needs {KUEUE_COUNT_ANNOTATION}: the number of pods in the group")
    if source == "hami" and size is None:
        raise GangError(f"{GANG_ANNOTATION} needs {GANG_SIZE_ANNOTATION}: the number of members that must run together")
    timeout = _number(annotations, GANG_TIMEOUT_ANNOTATION, 1, int(MAX_TIMEOUT_SECONDS))
    try:
        topology = topology_words(str(annotations.get(GANG_TOPOLOGY_ANNOTATION) or ""))
    except ValueError as exc:
        raise GangError(str(exc)) from None
    return GroupRef(
        namespace=str(m.get("namespace") or "default"),
        name=name,
        source=source,
        size=size,
        one_node=NODE in topology,
        timeout=float(timeout) if timeout is not None else DEFAULT_TIMEOUT_SECONDS,
    )


def _number(annotations: Mapping[str, object], key: str, low: int, high: int) -> int | None:
    raw = annotations.get(key)
    if raw is None or raw == "":
        return None
    text = str(raw).strip()
    if not text.isdigit() or not low <= int(text) <= high:
        raise GangError(f"{key} is {str(raw)[:40]!r}; expected a whole number from {low} to {high}")
    return int(text)


def members_needed(cluster: Cluster, ref: GroupRef) -> tuple[int | None, str]:
    """How many members of the gang must run together (None and why, when it cannot be told): the PodGroup's
    `spec.minMember` read from the cluster, else the size the pods give."""
    if ref.source in ("hami", "kueue"):
        return ref.size, ""
    resource, api = _SOURCES[ref.source]
    try:
        group = cluster.get(resource, ref.name, ref.namespace)
    except NotFoundError:
        if ref.size is not None:
            return ref.size, ""
        return None, (
            f"PodGroup {ref.namespace}/{ref.name} ({api}) does not exist: create it, or give the pods "
            f"{GANG_SIZE_ANNOTATION} with the number of members that must run together"
        )
    except ClusterError as exc:
        return None, f"cannot read PodGroup {ref.namespace}/{ref.name} ({api}): {exc}"
    raw = (group.get("spec") or {}).get("minMember")
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_GANG_SIZE:
        return None, f"PodGroup {ref.namespace}/{ref.name} has minMember {raw!r}; expected 1 to {MAX_GANG_SIZE}"
    return raw, ""
