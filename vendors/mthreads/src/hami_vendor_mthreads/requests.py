"""Requests and admission for Moore Threads GPUs: HAMi v2.10's rules for the ``mthreads.com/*`` resources.

Owns reading a container's request and the admission defaults, with the sGPU rules of Moore Threads' MT
CloudNative Toolkit, which HAMi applies (``pkg/device/mthreads``):

* a container asks for Moore Threads GPUs only through ``mthreads.com/vgpu``; memory or cores alone ask for
  nothing (HAMi reads neither without a count). A count of 0 is refused, as HAMi's webhook refuses it.
* memory (``mthreads.com/sgpu-memory``) comes in units of 512 MiB and only in the sGPU sizes 2, 4, 8, 16, 32, 64
  and 96; any other value is refused with the legal ones listed. 96 units, the size HAMi's webhook writes for a
  whole GPU, is read as the whole GPU (all its memory; 48 GiB on an MTT S4000).
* cores (``mthreads.com/sgpu-core``) are in the GPU's own units, not percent: a whole GPU has 16, so values above
  16 are refused (HAMi would accept them and then never fit them).
* one GPU without memory is a whole GPU (HAMi's webhook writes 96 units and 16 cores over whatever cores said);
  several GPUs in one container are whole GPUs, whatever memory and cores say (HAMi's webhook rewrites them to
  96 × count and 16 × count; they must still be plain numbers).

Admission (`admission_defaults`) writes what HAMi's webhook writes, so HAMi's scheduler and Moore Threads' own
components read the same pod: the limits above and, for several GPUs, the pod annotation
``mthreads.com/request-gpu-num`` (the count of the pod's last such container, as HAMi's loop leaves it). Beyond
HAMi, a container asking for Moore Threads GPUs that sets ``MTHREADS_VISIBLE_DEVICES`` or
``MTHREADS_DRIVER_CAPABILITIES`` itself is refused: the ``mthreads`` container runtime reads them to decide which
GPUs and driver parts to give the container, and only the device plugin's values (from the placement) may count.
"""

from __future__ import annotations

from hami.errors import RequestError
from hami.model import AdmissionEdit, Container, ContainerRequest, DeviceKind, Pod
from hami.requests import read_count
from hami_vendor_mthreads.settings import CORE_UNIT, CORES_PER_GPU, MthreadsSettings

__all__ = [
    "LEGAL_MEMORY_UNITS",
    "MEMORY_UNIT_MIB",
    "REQUEST_GPU_NUM",
    "WHOLE_GPU_UNITS",
    "admission_defaults",
    "container_request",
    "whole_gpus",
]

MEMORY_UNIT_MIB = 512
LEGAL_MEMORY_UNITS = (2, 4, 8, 16, 32, 64, 96)
WHOLE_GPU_UNITS = 96
"""HAMi's ``memoryPerMthreadsGPU``: the memory its webhook writes for one whole GPU."""
REQUEST_GPU_NUM = "mthreads.com/request-gpu-num"
RUNTIME_ENV = ("MTHREADS_VISIBLE_DEVICES", "MTHREADS_DRIVER_CAPABILITIES")
"""What the ``mthreads`` container runtime reads to wire a container; the device plugin's to set."""
MAX_COUNT = 1024


def whole_gpus(kind: DeviceKind, count: int) -> ContainerRequest:
    """`count` whole GPUs: all their memory and all 16 of their cores."""
    return ContainerRequest(kind=kind.common_word, count=count, memory_percentage=100, cores=CORES_PER_GPU)


def _count(kind: DeviceKind, container: Container) -> int | None:
    count = read_count(container, kind.resources.count, unit="devices", limit=MAX_COUNT)
    if count == 0:
        raise RequestError(
            kind.resources.count, container.resource(kind.resources.count) or "0", "must be greater than 0"
        )
    return count


def _memory_unit() -> str:
    return f"{MEMORY_UNIT_MIB} MiB"


def container_request(kind: DeviceKind, container: Container, settings: MthreadsSettings) -> ContainerRequest | None:
    """The container's request (see the module), or None when it has no ``mthreads.com/vgpu``.

    :raises RequestError: a value is not a plain number, memory is not an sGPU size, cores exceed 16, count is 0.
    """
    names = kind.resources
    count = _count(kind, container)
    memory_name, cores_name = names.memory or "", names.cores or ""
    if count is None:
        return None
    if count > 1:
        read_count(container, memory_name, unit=_memory_unit())
        read_count(container, cores_name, unit=CORE_UNIT)
        return whole_gpus(kind, count)
    cores = read_count(container, cores_name, unit=CORE_UNIT, limit=CORES_PER_GPU)
    units = read_count(container, memory_name, unit=_memory_unit())
    if units is None or units == WHOLE_GPU_UNITS:
        if units is None or cores in (None, CORES_PER_GPU):
            return whole_gpus(kind, 1)
        return ContainerRequest(kind=kind.common_word, count=1, memory_percentage=100, cores=cores or 0)
    if units not in LEGAL_MEMORY_UNITS:
        raise RequestError(
            memory_name,
            container.resource(memory_name) or "",
            f"is not an sGPU memory size: write one of {', '.join(map(str, LEGAL_MEMORY_UNITS))} "
            f"(units of {MEMORY_UNIT_MIB} MiB)",
        )
    return ContainerRequest(
        kind=kind.common_word,
        count=1,
        memory=units * MEMORY_UNIT_MIB,
        cores=settings.default_cores if cores is None else cores,
    )


def admission_defaults(kind: DeviceKind, container: Container, pod: Pod) -> AdmissionEdit | None:
    """HAMi's webhook edit of one container (see the module); None when it changes nothing."""
    names = kind.resources
    memory_name, cores_name = names.memory or "", names.cores or ""
    count = _count(kind, container)
    if count is None:
        return None
    own = [name for name in RUNTIME_ENV if name in container.env]
    if own:
        return AdmissionEdit(
            deny=f"container {container.name} sets {', '.join(own)} itself: the mthreads container runtime would "
            "give it the GPUs and driver parts that value names; remove it, the device plugin sets it from the "
            "GPUs the scheduler placed"
        )
    if count > 1:
        last = count
        for other in pod.all_containers:
            n = read_count(other, names.count, unit="devices", limit=MAX_COUNT)
            if n is not None and n > 1:
                last = n
        return AdmissionEdit(
            limits={cores_name: str(CORES_PER_GPU * count), memory_name: str(WHOLE_GPU_UNITS * count)},
            pod_annotations={REQUEST_GPU_NUM: str(last)},
        )
    if container.limits.get(memory_name) is None and container.resource(memory_name) is None:
        return AdmissionEdit(limits={cores_name: str(CORES_PER_GPU), memory_name: str(WHOLE_GPU_UNITS)})
    return None
