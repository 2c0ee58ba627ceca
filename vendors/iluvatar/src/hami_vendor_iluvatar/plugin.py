"""The Iluvatar vendor plugin: HAMi v2.10's `iluvatar.ai/<chip>-vgpu` resources and per-chip annotations.

Owns one device kind per Iluvatar chip (`MR-V100`, `MR-V50`, `BI-V150`, `BI-V100`, registered in HAMi's
legacy string format under `hami.io/node-<chip>-register`), their settings, and reading container requests.
Memory (`.vMem`) is asked in units of 256 MiB, cores (`.vCore`) in percent of one GPU.

Iluvatar shares only single GPUs: `.vMem` and `.vCore` are honoured with a count of 1. A count above 1 is
read as that many whole GPUs whatever `.vMem` and `.vCore` say (their values must still be numbers). This
is HAMi's conversion made per device: its webhook rewrites `.vCore` to 100 × count for such containers, so
refusing them would refuse every multi-GPU pod HAMi admitted.

Discovery, fitting and container edits (`SOL_CONTINER_NAME`, sic) are not built yet; sharing is enforced
by Iluvatar's gpu-manager, so there is no isolation library.
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
from hami.requests import ShareDefaults, read_count, read_share_request

CHIPS = ("MR-V100", "MR-V50", "BI-V150", "BI-V100")
MEMORY_UNIT_MIB = 256


def _kind(chip: str) -> DeviceKind:
    return DeviceKind(
        common_word=chip,
        resources=ResourceNames(
            count=f"iluvatar.ai/{chip}-vgpu",
            memory=f"iluvatar.ai/{chip}.vMem",
            cores=f"iluvatar.ai/{chip}.vCore",
            memory_unit_mib=MEMORY_UNIT_MIB,
        ),
        annotations=AnnotationKeys(
            node_register=f"hami.io/node-{chip}-register",
            node_handshake=f"hami.io/node-handshake-{chip}",
            to_allocate=f"hami.io/{chip}-devices-to-allocate",
            allocated=f"hami.io/{chip}-devices-allocated",
            use_uuid=f"hami.io/use-{chip}-uuid",
            nouse_uuid=f"hami.io/no-use-{chip}-uuid",
        ),
        register_format=RegisterFormat.LEGACY,
    )


INFO = VendorInfo(name="iluvatar", display_name="Iluvatar CoreX", kinds=tuple(_kind(c) for c in CHIPS))


class IluvatarSettings(ShareDefaults):
    """The `iluvatar` section of the configuration."""


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> IluvatarSettings:
    return IluvatarSettings.model_validate(raw)


@hookimpl
def hami_container_request(
    kind: DeviceKind, container: Container, pod: Pod, settings: IluvatarSettings
) -> ContainerRequest | None:
    names = kind.resources
    count = read_count(container, names.count, unit="devices", limit=1024)
    if count is not None and count > 1:
        read_count(container, names.memory or "", unit=f"{MEMORY_UNIT_MIB} MiB")
        read_count(container, names.cores or "", unit="percent")
        return ContainerRequest(kind=kind.common_word, count=count, memory_percentage=100, cores=100)
    return read_share_request(kind, container, defaults=settings)
