"""The Hygon vendor plugin: HAMi v2.10's `hygon.com/dcu*` resources and `hami.io/dcu-*` annotations.

Owns the DCU device kind's metadata (its devices are registered in HAMi's legacy string format under
`hami.io/node-dcu-register`), its settings, and reading container requests under HAMi's shared rules:
memory in MiB, cores in percent of one DCU.

Discovery (DTK's rocm-smi library), fitting (compute-unit masks), the per-container vDCU configuration file
and container edits are not built yet; sharing is enforced by Hygon's driver-level vDCU, so there is no
isolation library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hami import hookimpl
from hami.model import (
    AnnotationKeys,
    Container,
    ContainerRequest,
    DeviceKind,
    Pod,
    RegisterFormat,
    ResourceNames,
    VendorInfo,
)
from hami.requests import ShareDefaults, read_share_request

KIND = DeviceKind(
    common_word="DCU",
    resources=ResourceNames(count="hygon.com/dcunum", memory="hygon.com/dcumem", cores="hygon.com/dcucores"),
    annotations=AnnotationKeys(
        node_register="hami.io/node-dcu-register",
        node_handshake="hami.io/node-handshake-dcu",
        to_allocate="hami.io/dcu-devices-to-allocate",
        allocated="hami.io/dcu-devices-allocated",
        use_uuid="hygon.com/use-gpuuuid",
        nouse_uuid="hygon.com/nouse-gpuuuid",
        use_type="hygon.com/use-dcutype",
        nouse_type="hygon.com/nouse-dcutype",
    ),
    register_format=RegisterFormat.LEGACY,
)

INFO = VendorInfo(name="hygon", display_name="Hygon", kinds=(KIND,))


class HygonSettings(ShareDefaults):
    """The `hygon` section of the configuration."""


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> HygonSettings:
    return HygonSettings.model_validate(raw)


@hookimpl
def hami_container_request(
    kind: DeviceKind, container: Container, pod: Pod, settings: HygonSettings
) -> ContainerRequest | None:
    return read_share_request(kind, container, defaults=settings)
