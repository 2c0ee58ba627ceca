"""Device islands: a pod's devices kept within one group of devices linked to each other (NVLink, HCCS, MetaXLink).

A pod annotated `hami.io/gang-topology: island` (a gang member that asks for it, or any pod) gets all its devices
of a kind from one island of its node: devices joined by the vendor's fabric, as the vendor reads them from what
its discovery published (`hami_device_islands`: NVLink link scores, Ascend's HCCS `NetworkID`, MetaX's
MetaXLink zone). A device the vendor names no island for is an island of its own, so a pod asking one device
always has one; a pod asking more than its node's largest island holds is refused there, saying so.

The rule is the core's and the same for every vendor (`fit_within_islands`): the vendor's own fitter is asked to
fit the pod onto each island of each node in turn, as a view of the node with only that island's devices (one
call per round, the r-th island of every node in round r), and of the islands that fit on a node, the tightest is
taken (fewest idle devices, then fewest devices, then the order the vendor named them), so that whole islands stay
whole for the pods that need them. Everything else (feasibility, accounting, selectors, refusal reasons, the
vendor's annotations) is the vendor fitter's own.

Owns the annotation's words and that rule. Must not know any vendor's fabric (the vendor names the islands) nor
modify the views it is given (it passes shallow copies with fewer devices).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from hami.model import NodeFit, NodeView, Pod

__all__ = [
    "GANG_TOPOLOGY_ANNOTATION",
    "ISLAND",
    "NODE",
    "Islands",
    "asks_island",
    "fit_within_islands",
    "islands_from_links",
    "topology_words",
]

GANG_TOPOLOGY_ANNOTATION = "hami.io/gang-topology"
NODE = "node"
"""Every member of the pod's gang on one node (`hami.scheduler.gangs`)."""
ISLAND = "island"
"""Each pod's devices of a kind within one island of linked devices (this module)."""
_WORDS = (NODE, ISLAND)

Islands = Mapping[str, str]
"""Device id → the name of its island (devices of one name are linked to each other)."""


def topology_words(value: str) -> frozenset[str]:
    """The words of a `hami.io/gang-topology` value ("node", "island" or "node,island"); `ValueError` saying what
    is understood for anything else."""
    words = frozenset(w.strip() for w in value.split(",") if w.strip())
    unknown = sorted(words - set(_WORDS))
    if unknown:
        raise ValueError(
            f"{GANG_TOPOLOGY_ANNOTATION} is {value[:40]!r}; the values understood are 'node' (every member on one "
            "node), 'island' (each member's devices within one NVLink/HCCS/MetaXLink island) or 'node,island'"
        )
    return words


def asks_island(pod: Pod) -> bool:
    """Whether the pod asks for its devices within one island (an unreadable value asks nothing here: a gang
    member's filter refuses it with the reason)."""
    value = pod.annotations.get(GANG_TOPOLOGY_ANNOTATION)
    if not value:
        return False
    try:
        return ISLAND in topology_words(value)
    except ValueError:
        return False


def islands_from_links(devices: Sequence[str], scores: Mapping[str, Mapping[str, int]], linked: int) -> dict[str, str]:
    """Islands from pairwise link scores (`hami.topology.LinkScores`): devices joined, directly or through others,
    by pairs scoring at least `linked` (both directions), each island named after its first device in `devices`.
    A device with no such pair is left out (an island of its own)."""
    parent = {d: d for d in devices}

    def root(d: str) -> str:
        while parent[d] != d:
            parent[d] = parent[parent[d]]
            d = parent[d]
        return d

    for i, a in enumerate(devices):
        for b in devices[i + 1 :]:
            if min(scores.get(a, {}).get(b, 0), scores.get(b, {}).get(a, 0)) >= linked:
                ra, rb = root(a), root(b)
                if ra != rb:
                    first, second = sorted((ra, rb), key=devices.index)
                    parent[second] = first
    groups: dict[str, list[str]] = {}
    for d in devices:
        groups.setdefault(root(d), []).append(d)
    return {d: f"island-{members[0]}" for members in groups.values() if len(members) > 1 for d in members}


def _split(view: NodeView, islands: Islands | None) -> list[NodeView]:
    """The node's islands, each a view of the node with only its devices, in the order the devices come."""
    named = islands or {}
    groups: dict[str, list[int]] = {}
    for index, usage in enumerate(view.devices):
        groups.setdefault(named.get(usage.id) or f"device:{usage.id}", []).append(index)
    return [view.model_copy(update={"devices": [view.devices[i] for i in members]}) for members in groups.values()]


def _tightness(island: NodeView) -> tuple[int, int]:
    return sum(1 for d in island.devices if d.used == 0), len(island.devices)


def fit_within_islands(
    fit: Callable[[Sequence[NodeView]], list[NodeFit]],
    nodes: Sequence[NodeView],
    islands_of: Callable[[NodeView], Islands | None],
) -> list[NodeFit]:
    """The fits of a pod that asks for one island, one per node in `nodes`' order: `fit` (the vendor's fitter of
    the pod's requests) asked island by island (see the module's docstring)."""
    split = {view.name: _split(view, islands_of(view)) for view in nodes}
    found: dict[str, list[tuple[NodeView, NodeFit]]] = {view.name: [] for view in nodes}
    rounds = max((len(parts) for parts in split.values()), default=0)
    for r in range(rounds):
        views = [parts[r] for parts in split.values() if len(parts) > r]
        by_name = {v.name: v for v in views}
        for answer in fit(views):
            if answer.node in by_name:
                found[answer.node].append((by_name[answer.node], answer))
    out: list[NodeFit] = []
    for view in nodes:
        answers = found[view.name]
        fitting = [(island, answer) for island, answer in answers if answer.placement is not None]
        if fitting:
            out.append(min(fitting, key=lambda pair: _tightness(pair[0]))[1])
            continue
        sizes = sorted((len(part.devices) for part in split[view.name]), reverse=True)
        largest = max(answers, key=lambda pair: len(pair[0].devices), default=None)
        why = f": {largest[1].reason}" if largest is not None and largest[1].reason else ""
        shape = "+".join(str(n) for n in sizes[:8]) + ("+..." if len(sizes) > 8 else "")
        out.append(
            NodeFit(
                node=view.name,
                reason=(
                    f"no island of linked devices holds the pod ({GANG_TOPOLOGY_ANNOTATION}: {ISLAND}; "
                    f"islands here: {shape or 'none'} device(s)){why}"
                ),
            )
        )
    return out
