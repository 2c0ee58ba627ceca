"""The Kunlunxin vendor plugin: HAMi v2.10's scheduling of Kunlunxin XPUs, shared (`XPU`) and whole (`kunlun`).

HAMi serves Kunlunxin P800 XPUs from its scheduler alone: the node side is Kunlunxin's own device plugins (published
images, no public source). The vxpu-device-plugin registers the XPUs under ``hami.io/node-register-xpu`` (HAMi's
JSON form), answers the handshake ``hami.io/node-handshake-xpu``, reads the placement HAMi's scheduler writes into
``hami.io/xpu-devices-to-allocate``/``-allocated`` and makes the driver-level vXPU; the xpu-device-plugin offers whole
XPUs as the node's ``kunlunxin.com/xpu`` capacity and reads the pod's ``BAIDU_COM_DEVICE_IDX``. This plugin is that
scheduler side, on the core's building blocks; like HAMi it has no discovery, allocation or container edits.

Whole XPUs (kind ``kunlun``, HAMi's ``KunlunDevices``): a node's devices are its capacity, each named
``<node>-kunlun-<i>`` with HAMi's figures (100 slots, 98304 MiB, 100 cores; the second half on NUMA node 1); a
container's ``kunlunxin.com/xpu`` XPUs are idle ones chosen as for vXPUs; the pod's ``hami.io/kunlun-allocated``
records them, and ``BAIDU_COM_DEVICE_IDX`` the indices of the last container given XPUs; the node's score adds
HAMi's topology bonus (`hami_vendor_kunlun.topology.bonus`).

* requests as HAMi's ``GenerateResourceRequests``: only a container with ``kunlunxin.com/vxpu`` asks; the memory
  ``kunlunxin.com/vxpu-memory`` (MiB) is rounded up to the P800's partition sizes, a quarter (24576), a half (49152)
  or the whole XPU (98304; also when the memory is absent), and the cores are that share (25, 50, 100);
* admission as HAMi's ``MutateAdmission``: the container's memory limit (and request) rewritten to that size;
* fitting: core's share fitter (health, HAMi's ``hami.io/use-xpu-uuid``/``hami.io/no-use-xpu-uuid``, the ``mutex``
  policy, memory and cores), HAMi's ``FitVXPU`` rule that an XPU is shared only by vXPUs of one size, Kunlunxin's
  older ``baidu.com/use-gpuuuid``/``baidu.com/nouse-gpuuuid`` selectors, and the choice among the XPUs that fit made
  as HAMi makes it on an 8-XPU node (`hami_vendor_kunlun.topology`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami import hookimpl
from hami.fitting import Candidate, ChoiceContext, DeviceState, ShareFitter
from hami.model import (
    AdmissionEdit,
    AnnotationKeys,
    Container,
    ContainerRequest,
    Device,
    DeviceKind,
    NodeFit,
    NodeView,
    Pod,
    RegisterFormat,
    ResourceNames,
    SchedulingPolicy,
    VendorInfo,
)
from hami.quantity import parse_quantity
from hami.requests import read_count
from hami_vendor_kunlun.topology import bonus, select

__all__ = ["INDEX_ANNOTATION", "INFO", "PARTITIONS", "WHOLE", "XPU", "capacity_devices", "partition_of"]

XPU = DeviceKind(
    common_word="XPU",
    resources=ResourceNames(count="kunlunxin.com/vxpu", memory="kunlunxin.com/vxpu-memory"),
    annotations=AnnotationKeys(
        node_register="hami.io/node-register-xpu",
        node_handshake="hami.io/node-handshake-xpu",
        to_allocate="hami.io/xpu-devices-to-allocate",
        allocated="hami.io/xpu-devices-allocated",
        use_uuid="hami.io/use-xpu-uuid",
        nouse_uuid="hami.io/no-use-xpu-uuid",
    ),
    register_format=RegisterFormat.JSON,
    reusable_fits=True,  # the fit reads the pod's spec and annotations, the policy and the node's view alone
)

WHOLE = DeviceKind(
    common_word="kunlun",
    resources=ResourceNames(count="kunlunxin.com/xpu"),
    annotations=AnnotationKeys(
        to_allocate="hami.io/kunlun-devices-to-allocate",  # not HAMi's: it writes only the allocated annotation
        allocated="hami.io/kunlun-allocated",
        use_uuid="hami.io/use-xpu-uuid",
        nouse_uuid="hami.io/no-use-xpu-uuid",
    ),
    register_format=RegisterFormat.CAPACITY,
    reusable_fits=True,
)

INFO = VendorInfo(name="kunlun", display_name="Kunlunxin", kinds=(XPU, WHOLE))

PARTITIONS = (24576, 49152, 98304)
"""A P800's vXPU memory sizes in MiB (a quarter, a half, the whole XPU), as HAMi's ``trimMemory`` rounds to."""
BAIDU_USE_UUID, BAIDU_NOUSE_UUID = "baidu.com/use-gpuuuid", "baidu.com/nouse-gpuuuid"
INDEX_ANNOTATION = "BAIDU_COM_DEVICE_IDX"
"""The pod annotation Kunlunxin's xpu-device-plugin reads: the indices of the whole XPUs given."""


def partition_of(memory: int) -> int:
    """The vXPU size a request of `memory` MiB gets: the smallest partition holding it (0 is a quarter)."""
    return next((p for p in PARTITIONS if memory <= p), PARTITIONS[-1])


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


def capacity_devices(node_name: str, capacity: Mapping[str, Any]) -> list[Device]:
    """A node's whole XPUs as HAMi's ``KunlunDevices.GetNodeDevices`` derives them from ``kunlunxin.com/xpu``."""
    try:
        cards = int(parse_quantity(str(capacity.get(WHOLE.resources.count, "0"))))
    except ValueError:
        return []
    return [
        Device(id=f"{node_name}-kunlun-{i}", index=i, count=100, devmem=PARTITIONS[-1], devcore=100,
               type=WHOLE.common_word, numa=1 if i >= cards // 2 else 0, vendor=WHOLE.common_word)
        for i in range(max(cards, 0))
    ]  # fmt: skip


@hookimpl
def hami_node_devices(kind: DeviceKind, node: str, capacity: Mapping[str, Any]) -> list[Device] | None:
    return capacity_devices(node, capacity) if kind.common_word == WHOLE.common_word else None


@hookimpl
def hami_container_request(kind: DeviceKind, container: Container) -> ContainerRequest | None:
    names = kind.resources
    count = read_count(container, names.count, unit="devices", limit=1024)
    if not count:
        return None
    if kind.common_word == WHOLE.common_word:  # HAMi: all of each XPU's memory, and its cores
        return ContainerRequest(kind=kind.common_word, count=count, memory_percentage=100, cores=100)
    asked = read_count(container, names.memory or "", unit="MiB")
    memory = PARTITIONS[-1] if asked is None else partition_of(asked)
    return ContainerRequest(kind=kind.common_word, count=count, memory=memory, cores=memory * 100 // PARTITIONS[-1])


@hookimpl
def hami_admission_defaults(kind: DeviceKind, container: Container) -> AdmissionEdit | None:
    names = kind.resources
    memory = names.memory or ""
    if names.count not in container.limits or memory not in container.limits:
        return None
    asked = read_count(container, memory, unit="MiB")
    return AdmissionEdit(limits={memory: str(partition_of(asked or 0))})


def _listed(value: str | None) -> set[str]:
    return {part.strip() for part in (value or "").split(",") if part.strip()}


class XpuFitter(ShareFitter):
    """Core's share fitter with HAMi's vXPU rules: one vXPU size per XPU, Kunlunxin's own UUID selectors, and the
    P800 node's choice of XPUs (`hami_vendor_kunlun.topology`)."""

    def __init__(self, kind: DeviceKind, pod: Pod) -> None:
        super().__init__(kind)
        self.use = _listed(pod.annotations.get(BAIDU_USE_UUID))
        self.nouse = _listed(pod.annotations.get(BAIDU_NOUSE_UUID))

    def _fits(self, state: DeviceState, memory: int) -> bool:
        uuid = state.device.id
        if (self.use and uuid not in self.use) or uuid in self.nouse:
            return False
        # HAMi's FitVXPU: an XPU already shared holds vXPUs of one size, and takes only another of that size
        return state.used == 0 or state.usedmem // state.used == memory

    def choose_devices(
        self, candidates: Sequence[Candidate], count: int, context: ChoiceContext
    ) -> Sequence[Candidate]:
        by_state = {id(c.state): c for c in candidates}
        order = context.order or list(range(len(context.devices)))
        listed = [context.devices[i] for i in order]
        fits = [id(s) in by_state and self._fits(s, by_state[id(s)].memory) for s in listed]
        chosen = select([s.device.index for s in listed], fits, count)
        by_index = {c.device.index: c for c in candidates}
        picked = [by_index[i] for i in chosen if i in by_index]
        return picked if len(picked) == count else []


def _with_indices(fits: list[NodeFit], nodes: Sequence[NodeView]) -> list[NodeFit]:
    """HAMi's ``BAIDU_COM_DEVICE_IDX``: the indices of the last container given whole XPUs."""
    index = {n.name: {u.device.id: u.device.index for u in n.devices} for n in nodes}
    out = []
    for fit in fits:
        given = [c for c in fit.placement or () if c]
        if given:
            text = ",".join(str(index[fit.node][d.uuid]) for d in given[-1])
            fit = fit.model_copy(update={"pod_annotations": {**fit.pod_annotations, INDEX_ANNOTATION: text}})
        out.append(fit)
    return out


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:
    fits = XpuFitter(kind, pod).fit_nodes(pod, requests, nodes, policy)
    return _with_indices(fits, nodes) if kind.common_word == WHOLE.common_word else fits


@hookimpl
def hami_score_nodes(kind: DeviceKind, fits: Sequence[NodeFit], nodes: Mapping[str, NodeView]) -> dict[str, float]:
    """HAMi's node score, plus for whole XPUs HAMi's ``ScoreNode`` bonus for keeping the node's wings whole."""
    if kind.common_word != WHOLE.common_word:
        return {fit.node: fit.score for fit in fits}
    out = {}
    for fit in fits:
        devices = nodes[fit.node].devices
        busy = [u.device.index for u in devices if u.used > 0]
        index = {u.device.id: u.device.index for u in devices}
        taken = [index[d.uuid] for container in fit.placement or () for d in container]
        out[fit.node] = fit.score + bonus(busy, taken)
    return out
