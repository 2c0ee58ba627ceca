"""`TraceGPU`: the vendor plugin the simulator schedules trace GPUs with.

A plain share-based GPU: HAMi's request rules (`hami.requests`) and core's `ShareFitter`, nothing else, so
simulations measure the scheduler's policies. It is registered only by the simulator (not as an entry point),
through the same `VendorPlugins` and hooks as every vendor.
"""

from __future__ import annotations

from collections.abc import Sequence

from hami import hookimpl
from hami.fitting import ShareFitter
from hami.model import (
    AnnotationKeys,
    Container,
    ContainerRequest,
    DeviceKind,
    NodeFit,
    NodeView,
    Pod,
    ResourceNames,
    SchedulingPolicy,
    VendorInfo,
)
from hami.requests import read_share_request

KIND = DeviceKind(
    common_word="TraceGPU",
    resources=ResourceNames(count="trace.hami.io/gpu", memory="trace.hami.io/gpumem", cores="trace.hami.io/gpucores"),
    annotations=AnnotationKeys(
        node_register="hami.io/node-tracegpu-register",
        to_allocate="hami.io/tracegpu-devices-to-allocate",
        allocated="hami.io/tracegpu-devices-allocated",
        use_type="trace.hami.io/use-gputype",
        nouse_type="trace.hami.io/nouse-gputype",
    ),
    reusable_fits=True,  # `ShareFitter` alone: a fit reads nothing but the pod, the policy and the node's view
)


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return VendorInfo(name="tracegpu", display_name="Trace GPU (simulation)", kinds=(KIND,))


@hookimpl
def hami_container_request(kind: DeviceKind, container: Container) -> ContainerRequest | None:
    return read_share_request(kind, container)


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:
    return ShareFitter(kind).fit_nodes(pod, requests, nodes, policy)
