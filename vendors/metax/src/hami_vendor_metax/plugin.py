"""The MetaX vendor plugin: HAMi v2.10's `metax-tech.com/*` resources and `hami.io/metax-*` annotations.

Owns two device kinds, their settings, and reading container requests:

- `Metax-GPU`: whole cards (`metax-tech.com/gpu`), with no memory or cores resources.
- `Metax-SGPU`: shares of a card (`metax-tech.com/sgpu` devices, `metax-tech.com/vmemory` in GiB,
  `metax-tech.com/vcore` in percent). As in HAMi, a container that names memory but not `vcore` gets the
  whole compute of its card (`defaultCores`, 100). The pod's `metax-tech.com/sgpu-qos-policy` must be one of
  `best-effort` (the default when absent), `fixed-share` or `burst-share`, and its
  `metax-tech.com/sgpu-app-class`, when given, `online` or `offline` with a single device; other values are
  refused with the legal ones listed. HAMi ignores the QoS policy of online pods, and so does this plugin.

Both kinds are read from the node's capacity for now (HAMi reads MetaX's own `metax-tech.com/node-gpu-devices`
JSON for shared cards; that comes with discovery). Discovery, fitting (topology, QoS), the `metax-tech.com/*`
pod annotations and container edits are not built yet; MetaX's sGPU device plugin enforces the share, so
there is no isolation library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from hami import hookimpl
from hami.errors import RequestError
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

QOS_ANNOTATION = "metax-tech.com/sgpu-qos-policy"
QOS_POLICIES = ("best-effort", "fixed-share", "burst-share")
APP_CLASS_ANNOTATION = "metax-tech.com/sgpu-app-class"
APP_CLASSES = ("online", "offline")

_SELECTORS = {"use_uuid": "metax-tech.com/use-gpuuuid", "nouse_uuid": "metax-tech.com/nouse-gpuuuid"}

GPU = DeviceKind(
    common_word="Metax-GPU",
    resources=ResourceNames(count="metax-tech.com/gpu"),
    annotations=AnnotationKeys(
        to_allocate="hami.io/metax-gpu-devices-to-allocate",
        allocated="hami.io/metax-gpu-devices-allocated",
        **_SELECTORS,
    ),
    register_format=RegisterFormat.CAPACITY,
)

SGPU = DeviceKind(
    common_word="Metax-SGPU",
    resources=ResourceNames(
        count="metax-tech.com/sgpu", memory="metax-tech.com/vmemory", cores="metax-tech.com/vcore", memory_unit_mib=1024
    ),
    annotations=AnnotationKeys(
        to_allocate="hami.io/metax-sgpu-devices-to-allocate",
        allocated="hami.io/metax-sgpu-devices-allocated",
        **_SELECTORS,
    ),
    register_format=RegisterFormat.CAPACITY,
)

INFO = VendorInfo(name="metax", display_name="MetaX", kinds=(GPU, SGPU))


class MetaxSettings(ShareDefaults):
    """The `metax` section of the configuration; the defaults apply to shared cards (`Metax-SGPU`)."""

    default_cores: int = Field(
        default=100, ge=0, le=100, alias="defaultCores", description="percent when memory is given without cores"
    )


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> MetaxSettings:
    return MetaxSettings.model_validate(raw)


@hookimpl
def hami_container_request(
    kind: DeviceKind, container: Container, pod: Pod, settings: MetaxSettings
) -> ContainerRequest | None:
    if kind.common_word == GPU.common_word:
        return read_share_request(kind, container)
    request = read_share_request(kind, container, defaults=settings)
    if request is not None:
        check_sgpu_annotations(pod, request)
    return request


def check_sgpu_annotations(pod: Pod, request: ContainerRequest) -> None:
    """Refuse a shared-card pod whose app class or QoS policy MetaX's sGPU plugin would not understand."""
    app_class = pod.annotations.get(APP_CLASS_ANNOTATION)
    if app_class is not None:
        if app_class not in APP_CLASSES:
            raise RequestError(
                APP_CLASS_ANNOTATION, app_class, f"is not an app class: write one of {', '.join(APP_CLASSES)}"
            )
        if request.count != 1:
            raise RequestError(
                APP_CLASS_ANNOTATION,
                app_class,
                f"is for single-device containers, and this one asks for {request.count} {SGPU.resources.count}",
            )
    qos = pod.annotations.get(QOS_ANNOTATION)
    if app_class != "online" and qos is not None and qos not in QOS_POLICIES:
        raise RequestError(QOS_ANNOTATION, qos, f"is not a QoS policy: write one of {', '.join(QOS_POLICIES)}")
