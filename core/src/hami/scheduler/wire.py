"""The scheduler extender's wire format (protocol.md section 4): its request bodies decoded and validated at the
edge, for `hami.scheduler.server`.

Each verb's body is decoded once, straight from its bytes and validated as it is read (msgspec: no generic JSON
objects are built, and the first wrong value ends the decoding, so a body costs about its own size), into a typed
model of exactly the fields the extender uses (`ExtenderArgs`, `BindingArgs`: the pod's name, namespace, UID,
labels, annotations, node name, scheduler name, priority, preemption policy and its containers' names, resources,
literal env and privileged flag; the nodes' names, and of a full Node its labels, annotations, capacity and
allocatable); every other field is skipped unread. The Node objects of the full-Nodes form are kept as sent, each
decoded only when read (an autoscaler's simulation reads them all; an answer carries the chosen ones as given).
Keys come in PascalCase (or lowercase, from old kube-schedulers). Names must be Kubernetes names (DNS subdomains;
a namespace a DNS label), strings must be valid Unicode (a lone surrogate is not JSON here). Anything else is a
`BadBody` that names the field, so nothing a client sends reaches the extender's state or the API server's URLs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar, overload

import msgspec
from msgspec import UNSET, UnsetType

from hami.cluster.port import DNS_LABEL, DNS_SUBDOMAIN

__all__ = ["BadBody", "BindingArgs", "ExtenderArgs", "GivenNodes", "PreemptArgs", "decode_preempt", "parse"]

# ---------------------------------------------------------------------------------------------- edge models
# msgspec decodes a body straight into these Structs, validating as it reads: no generic object is built for
# what the model holds, unknown fields are skipped unread, and the first wrong value ends the decoding (a body
# of a million wrong values costs one error, not a million).

Name = Annotated[str, msgspec.Meta(pattern=DNS_SUBDOMAIN)]
Namespace = Annotated[str, msgspec.Meta(pattern=DNS_LABEL)]
Quantity = str | int
"""A resource quantity: a string as the API serialises it (a bare integer is taken as one too)."""
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
NotEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class _Edge(msgspec.Struct, kw_only=True, omit_defaults=True):
    pass


class _EnvVar(_Edge):
    name: str
    value: str | None = None
    valueFrom: dict[str, Any] | None = None  # noqa: N815  (only whether it is there matters)


class _Resources(_Edge):
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None

    def __post_init__(self) -> None:
        for quantities in (self.limits, self.requests):
            if quantities is not None:
                for key, value in quantities.items():
                    if isinstance(value, int):
                        quantities[key] = str(value)


class _SecurityContext(_Edge):
    privileged: bool | None = None


class _Container(_Edge):
    name: str | None = None
    resources: _Resources | None = None
    env: list[_EnvVar] | None = None
    securityContext: _SecurityContext | None = None  # noqa: N815
    restartPolicy: str | None = None  # noqa: N815  (`Always` on an init container: a native sidecar)


class _PodSpec(_Edge):
    nodeName: Name | None = None  # noqa: N815
    schedulerName: str | None = None  # noqa: N815
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None  # noqa: N815
    priority: Int32 | None = None  # an int32, as the API has it
    preemptionPolicy: Literal["Never", "PreemptLowerPriority"] | None = None  # noqa: N815


class _PodMeta(_Edge):
    name: Name
    namespace: Namespace | None = None
    uid: str | None = None
    resourceVersion: str | None = None  # noqa: N815
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None


class PodArg(_Edge):
    """What the extender reads of a pod."""

    metadata: _PodMeta
    spec: _PodSpec | None = None

    def as_object(self) -> dict[str, Any]:
        """The pod as the API serialises it, with only these fields."""
        obj: dict[str, Any] = msgspec.to_builtins(self)
        return obj


class _NodeMeta(_Edge):
    name: Name
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class _NodeStatus(_Edge):
    capacity: dict[str, Quantity] | None = None
    allocatable: dict[str, Quantity] | None = None


class _Node(_Edge):
    """What the scheduler reads of a Node of the full-Nodes form (an autoscaler's template nodes are fitted from
    it), checked here so that a malformed one is a 400 naming the field; the Node itself is kept as sent
    (`ExtenderArgs.node_objects`)."""

    metadata: _NodeMeta
    status: _NodeStatus | None = None


class _NodeList(_Edge):
    items: list[_Node] | UnsetType | None = UNSET
    Items: list[_Node] | UnsetType | None = UNSET

    def names(self) -> list[str]:
        items = self.items if self.items is not UNSET else self.Items
        return [n.metadata.name for n in items or ()]


class _RawNodeList(_Edge):
    items: list[msgspec.Raw] | UnsetType | None = UNSET
    Items: list[msgspec.Raw] | UnsetType | None = UNSET


class _RawNodesWire(_Edge):
    """The full-Nodes form's Nodes as their bytes (each a view of the body, nothing decoded), read once the body
    has passed `_ExtenderWire`."""

    Nodes: _RawNodeList | UnsetType | None = UNSET
    nodes: _RawNodeList | UnsetType | None = UNSET


class BadBody(Exception):
    """A body that is not JSON or not the verb's model: the message names the field and what is wrong."""


def _first(*candidates: tuple[str, Any], required: bool = False) -> Any:
    """The value of the first of a field's spellings that the body has (as kube-schedulers old and new spell it)."""
    for _, value in candidates:
        if value is not UNSET:
            return value
    if required:
        raise BadBody(f"{candidates[0][0]}: Field required")
    return None


class _ExtenderWire(_Edge):
    Pod: PodArg | UnsetType = UNSET
    pod: PodArg | UnsetType = UNSET
    Nodes: _NodeList | UnsetType | None = UNSET
    nodes: _NodeList | UnsetType | None = UNSET
    NodeNames: msgspec.Raw | UnsetType = UNSET  # a list of Names (or null), read by `_node_names`
    nodenames: msgspec.Raw | UnsetType = UNSET
    nodeNames: msgspec.Raw | UnsetType = UNSET  # noqa: N815


class _BindingWire(_Edge):
    PodName: Name | UnsetType = UNSET
    podName: Name | UnsetType = UNSET  # noqa: N815
    podname: Name | UnsetType = UNSET
    PodNamespace: Namespace | UnsetType = UNSET
    podNamespace: Namespace | UnsetType = UNSET  # noqa: N815
    podnamespace: Namespace | UnsetType = UNSET
    PodUID: NotEmpty | UnsetType = UNSET
    podUID: NotEmpty | UnsetType = UNSET  # noqa: N815
    poduid: NotEmpty | UnsetType = UNSET
    Node: Name | UnsetType = UNSET
    node: Name | UnsetType = UNSET


class PreemptArgs(_Edge):
    """kube-scheduler's ExtenderPreemptionArgs: only the victims' UIDs by node, which a nodeCacheCapable
    kube-scheduler sends (the Pod and the full victims, `NodeNameToVictims`, are skipped unread)."""

    NodeNameToMetaVictims: Any = None


class GivenNodes(Sequence[dict[str, Any]]):
    """The Node objects of the full-Nodes form, each decoded from its bytes when read, and not kept: an ordinary
    filter reads none, an autoscaler's simulation each once. Kept, the decoded Nodes of a large NodeList cost as much
    again as its body while the answer is built (a peak of 4 times a 60 MB body with them, `hostile_clients.py`)."""

    def __init__(self, raws: list[msgspec.Raw], names: list[str]) -> None:
        self._raws = raws
        self._names = names  # each Node's name, as `_ExtenderWire` read it

    def named(self, names: Sequence[str]) -> list[msgspec.Raw]:
        """The bytes of the Nodes of these names as sent (the last one sent of a name sent twice): an answer
        carries them unchanged, without decoding them again."""
        where = {name: index for index, name in enumerate(self._names)}
        return [self._raws[where[name]] for name in names]

    def __len__(self) -> int:
        return len(self._raws)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | Sequence[dict[str, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        decoded: dict[str, Any] = _OBJECT.decode(self._raws[range(len(self))[index]])
        return decoded


@dataclass(frozen=True)
class ExtenderArgs:
    """The body of filter and prioritize (kube-scheduler's ExtenderArgs)."""

    pod: PodArg
    nodes: _NodeList | None = None
    node_names: tuple[str, ...] | None = None
    """As sent, once each (`_node_names`)."""
    body: bytes | bytearray = field(default=b"", repr=False, compare=False)

    def candidates(self) -> tuple[Sequence[str], bool]:
        """The candidate node names, once each, and whether they came as a node list. The names of the NodeNames
        form are the very tuple of the filter before when the same array was sent (`_node_names`)."""
        if self.nodes is not None:
            return list(dict.fromkeys(self.nodes.names())), True
        return self.node_names or (), False

    def node_objects(self) -> Sequence[dict[str, Any]] | None:
        """The Node objects of the full-Nodes form as sent, decoded as they are read (None in the NodeNames
        form)."""
        if self.nodes is None:
            return None
        wire = _decode(_RAW_NODES, self.body)  # the body passed `_ExtenderWire`: the same spellings are there
        listed = _first(("Nodes", wire.Nodes), ("nodes", wire.nodes))
        raws = _first(("items", listed.items), ("Items", listed.Items)) if listed is not None else None
        return GivenNodes(raws or [], self.nodes.names())

    @classmethod
    def decode(cls, body: bytes | bytearray) -> ExtenderArgs:
        w = _decode(_EXTENDER, body)
        nodes = _first(("Nodes", w.Nodes), ("nodes", w.nodes))
        spelled = (("NodeNames", w.NodeNames), ("nodenames", w.nodenames), ("nodeNames", w.nodeNames))
        key, raw = next(((k, v) for k, v in spelled if v is not UNSET), ("", None))
        names = _node_names(raw, key) if raw is not None else None
        return cls(_first(("Pod", w.Pod), ("pod", w.pod), required=True), nodes, names, body)


@dataclass(frozen=True)
class BindingArgs:
    """The body of bind (kube-scheduler's ExtenderBindingArgs)."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @classmethod
    def decode(cls, body: bytes | bytearray) -> BindingArgs:
        w = _decode(_BINDING, body)
        return cls(
            _first(("PodName", w.PodName), ("podName", w.podName), ("podname", w.podname), required=True),
            _first(
                ("PodNamespace", w.PodNamespace),
                ("podNamespace", w.podNamespace),
                ("podnamespace", w.podnamespace),
                required=True,
            ),
            _first(("PodUID", w.PodUID), ("podUID", w.podUID), ("poduid", w.poduid), required=True),
            _first(("Node", w.Node), ("node", w.node), required=True),
        )


_NAME = re.compile(DNS_SUBDOMAIN)
_VALID_NAMES: set[str] = set()
"""Node names found valid, up to `_VALID_NAMES_KEPT`: every filter of the NodeNames form names the same nodes, and a
set's one look-up per name costs a fraction of a regular expression's match."""
_VALID_NAMES_KEPT = 16_384
"""More than a cluster's nodes (5,000 is Kubernetes' tested limit), and at most about 5 MB of names however they
are chosen: once full, the set starts again empty."""


def _check_names(names: list[str], key: str) -> None:
    """BadBody naming the first of `names` that is not a Kubernetes name (a DNS subdomain)."""
    if _VALID_NAMES.issuperset(names):
        return
    for index, name in enumerate(names):
        if name not in _VALID_NAMES:
            if not _NAME.match(name):
                raise BadBody(f"{key}.{index}: Expected `str` matching regex {DNS_SUBDOMAIN!r}")
            if len(_VALID_NAMES) >= _VALID_NAMES_KEPT:
                _VALID_NAMES.clear()
            _VALID_NAMES.add(name)


_NAMES = msgspec.json.Decoder(list[str] | None)
_names_seen: tuple[bytes, tuple[str, ...]] = (b"[]", ())
"""The last NodeNames array as sent and the names it gave (valid, once each). kube-scheduler sends the same array
with every filter while the cluster's nodes stay the same: one comparison of its bytes spares decoding, checking and
de-duplicating thousands of names a filter, and the same tuple lets the candidate index keep its set of them
(`hami.scheduler.candidates`). Replaced whole (one reference), so threads read it without a lock."""


def _node_names(raw: msgspec.Raw, key: str) -> tuple[str, ...] | None:
    """The NodeNames array `raw` (spelled `key` in the body) as valid names, once each; None for null."""
    global _names_seen
    seen = _names_seen
    if memoryview(raw) == seen[0]:
        return seen[1]
    try:
        decoded = _NAMES.decode(raw)
    except msgspec.ValidationError as exc:
        message, where = str(exc), ""
        if found := _WHERE.fullmatch(message):
            message, where = found.group(1), re.sub(r"\[(\d+)\]", r".\1", found.group(2))
        raise BadBody(f"{key}{where}: {message}") from None
    except msgspec.DecodeError as exc:  # the body as a whole passed: what is left is text that is not UTF-8
        raise BadBody(f"{key}: {str(exc).removeprefix('JSON is malformed: ')}") from None
    if decoded is None:
        return None
    _check_names(decoded, key)
    names = tuple(dict.fromkeys(decoded))
    if len(raw) <= _NAMES_SEEN_BYTES:
        _names_seen = (bytes(raw), names)
    return names


_NAMES_SEEN_BYTES = 4 << 20  # the array of 50,000 long node names; a larger one is decoded each time
_EXTENDER = msgspec.json.Decoder(_ExtenderWire)
_RAW_NODES = msgspec.json.Decoder(_RawNodesWire)
_BINDING = msgspec.json.Decoder(_BindingWire)
_PREEMPT = msgspec.json.Decoder(PreemptArgs)
_OBJECT = msgspec.json.Decoder(dict[str, Any])
Wire = TypeVar("Wire")
_WHERE = re.compile(r"(?s)(.*) - at `\$(.*)`")
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_MISSING = re.compile(r"Object missing required field `(.*)`")


def _decode(decoder: msgspec.json.Decoder[Wire], body: bytes | bytearray) -> Wire:
    """`body` decoded by `decoder`, or BadBody saying where and what is wrong (`Pod.spec.containers.0: ...`)."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        message, where = str(exc), ""
        if found := _WHERE.fullmatch(message):
            message, where = found.group(1), re.sub(r"\[(\d+)\]", r".\1", found.group(2)).lstrip(".")
        if missing := _MISSING.fullmatch(message):
            where, message = ".".join(filter(None, (where, missing.group(1)))), "Field required"
        raise BadBody(f"{where or 'the body'}: {message}") from None
    except RecursionError:  # msgspec's own depth limit, in a part decoded as any JSON (`valueFrom`)
        raise BadBody("the body is nested too deeply") from None
    except msgspec.DecodeError as exc:
        message = str(exc).removeprefix("JSON is malformed: ")
        if "surrogate" not in message and _SURROGATE.search(body):  # msgspec can call one "truncated"
            message += " (a \\uD800-\\uDFFF escape must be half of a surrogate pair: a lone surrogate is not text)"
        raise BadBody(f"the body is not JSON: {message}") from None


Model = TypeVar("Model", ExtenderArgs, BindingArgs)


def parse(model: type[Model], body: bytes | bytearray) -> Model:
    """`body` as `model`, or BadBody."""
    return model.decode(body)


def decode_preempt(body: bytes | bytearray) -> PreemptArgs:
    """The body of preempt (kube-scheduler's ExtenderPreemptionArgs), or BadBody."""
    return _decode(_PREEMPT, body)
