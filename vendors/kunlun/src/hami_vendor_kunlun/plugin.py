"""The Kunlunxin vendor plugin: HAMi v2.10's vXPU scheduling (`kunlunxin.com/vxpu*`, `hami.io/xpu-*`).

HAMi serves Kunlunxin P800 XPUs from its scheduler alone: the node side is Kunlunxin's own vxpu-device-plugin (a
published image, no public source), which registers the XPUs under ``hami.io/node-register-xpu`` (HAMi's JSON form),
answers the handshake ``hami.io/node-handshake-xpu``, reads the placement HAMi's scheduler writes into
``hami.io/xpu-devices-to-allocate``/``-allocated`` and makes the driver-level vXPU. This plugin is that scheduler
side, on the core's building blocks; like HAMi it has no discovery, allocation or container edits of its own.

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

from collections.abc import Sequence

from hami import hookimpl
from hami.fitting import Candidate, ChoiceContext, DeviceState, ShareFitter
from hami.model import (
    AdmissionEdit,
    AnnotationKeys,
    Container,
    ContainerRequest,
    DeviceKind,
    NodeFit,
    NodeView,
    Pod,
    RegisterFormat,
    ResourceNames,
    SchedulingPolicy,
    VendorInfo,
)
from hami.requests import read_count
from hami_vendor_kunlun.topology import select

__all__ = ["INFO", "PARTITIONS", "XPU", "partition_of"]

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

INFO = VendorInfo(name="kunlun", display_name="Kunlunxin", kinds=(XPU,))

PARTITIONS = (24576, 49152, 98304)
"""A P800's vXPU memory sizes in MiB (a quarter, a half, the whole XPU), as HAMi's ``trimMemory`` rounds to."""
BAIDU_USE_UUID, BAIDU_NOUSE_UUID = "baidu.com/use-gpuuuid", "baidu.com/nouse-gpuuuid"


def partition_of(memory: int) -> int:
    """The vXPU size a request of `memory` MiB gets: the smallest partition holding it (0 is a quarter)."""
    return next((p for p in PARTITIONS if memory <= p), PARTITIONS[-1])


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_container_request(kind: DeviceKind, container: Container) -> ContainerRequest | None:
    names = kind.resources
    count = read_count(container, names.count, unit="devices", limit=1024)
    if not count:
        return None
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


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:
    return XpuFitter(kind, pod).fit_nodes(pod, requests, nodes, policy)
