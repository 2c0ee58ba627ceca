"""Reading Ascend requests and applying the admission defaults: HAMi's rules for `huawei.com/<chip>` resources.

Owns, on top of core's shared rules (`hami.requests.read_share_request`):

* the vNPU mode of a pod (`vnpu_mode`): its ``huawei.com/vnpu-mode`` annotation (``hami-core`` for the soft split,
  ``template`` for vNPU templates), else the configured ``hamiVnpuMode``; any other value is refused;
* ``huawei.com/<chip>-core`` is read only in soft-split mode: in template mode the template fixes the cores, so a
  ``-core`` value is refused with the annotation to add;
* memory: in template mode any size up to the chip's capacity (the fit rounds it up to the smallest template that
  holds it, and above the largest template gives the whole card, as HAMi does); more than the chip holds is
  refused, naming the chip's size;
* several devices in one container are whole cards only: memory or a partial core share with a count above 1 is
  refused, except memory that means a whole card (between the chip's ``memoryAllocatable`` and
  ``memoryCapacity``, which HAMi's own webhook writes into every container it admits, or in template mode a size
  no template holds);
* super-pod chips (910C, ``superPod``): whole cards come in modules of two dies, so a request for one whole card
  is read as two, and an odd count is refused; a share of one die stays one device;
* admission defaults: the count written back when it was read as two, and ``runtimeClassName``.

The requests keep the memory as the user wrote it (the fit does the rounding), so that quota and messages speak
the user's numbers; the placement records what the template really takes.
"""

from __future__ import annotations

from hami.errors import RequestError
from hami.model import AdmissionEdit, Container, ContainerRequest, DeviceKind, Pod
from hami.requests import read_share_request
from hami_vendor_ascend.chips import AscendChip
from hami_vendor_ascend.settings import SOFT_SPLIT, TEMPLATE, AscendSettings, VnpuMode

__all__ = ["VNPU_MODE_ANNOTATION", "admission_defaults", "container_request", "is_whole_card", "vnpu_mode"]

VNPU_MODE_ANNOTATION = "huawei.com/vnpu-mode"


def vnpu_mode(pod: Pod, settings: AscendSettings) -> VnpuMode:
    """The pod's vNPU mode: its `huawei.com/vnpu-mode` annotation, else the configured default."""
    value = pod.annotations.get(VNPU_MODE_ANNOTATION)
    if value is None:
        return settings.default_vnpu_mode
    if value == SOFT_SPLIT:
        return SOFT_SPLIT
    if value == TEMPLATE:
        return TEMPLATE
    raise RequestError(
        VNPU_MODE_ANNOTATION, value, f"is not a vNPU mode: write {SOFT_SPLIT} (soft split) or {TEMPLATE}"
    )


def whole_by_memory(memory: int, chip: AscendChip, mode: VnpuMode) -> bool:
    """Whether `memory` MiB per device means a whole card: the chip's whole-card memory (up to its capacity), or
    in template mode a size no template holds."""
    if memory > chip.memory_capacity:
        return False
    if memory >= chip.memory_allocatable:
        return True
    return mode == TEMPLATE and chip.template_for(memory) is None


def is_whole_card(request: ContainerRequest, chip: AscendChip, mode: VnpuMode) -> bool:
    """Whether `request` asks for whole cards (all of each device's memory, and no partial core share)."""
    if request.cores not in (0, 100):
        return False
    if request.memory_percentage == 100 and not request.memory:
        return True
    return bool(request.memory) and whole_by_memory(request.memory, chip, mode)


def container_request(
    kind: DeviceKind, container: Container, pod: Pod, settings: AscendSettings
) -> ContainerRequest | None:
    """What the container asks of `kind` under the Ascend rules (see the module's docstring)."""
    mode = vnpu_mode(pod, settings)
    names = kind.resources
    cores_name = f"{names.count}-core"
    raw_cores = container.resource(cores_name)
    if raw_cores is not None and mode != SOFT_SPLIT:
        raise RequestError(
            cores_name,
            raw_cores,
            f"is honoured only in soft-split mode: add the pod annotation {VNPU_MODE_ANNOTATION}: {SOFT_SPLIT}, "
            "or remove it (in template mode the vNPU template sets the cores)",
        )
    request = read_share_request(kind, container)
    if request is None:
        return None
    chip = settings.chips[kind.common_word]
    if request.count > 1:
        request = _whole_cards(kind, container, request, chip, mode)
    elif request.memory > chip.memory_capacity:
        raise RequestError(
            f"{names.count}-memory",
            container.resource(f"{names.count}-memory") or "",
            f"is more than one {kind.common_word} holds ({chip.memory_capacity} MiB): ask for at most that, or "
            f"leave the memory out for a whole card",
        )
    if not chip.super_pod or not is_whole_card(request, chip, mode):
        return request
    if request.count % 2:
        if request.count == 1:
            return ContainerRequest(kind=kind.common_word, count=2, memory_percentage=100, cores=100)
        raise RequestError(
            names.count,
            container.resource(names.count) or "",
            f"is odd: {kind.common_word} whole cards come in modules of two NPUs, so ask for an even number "
            "(one is read as two)",
        )
    return request


def _whole_cards(
    kind: DeviceKind, container: Container, request: ContainerRequest, chip: AscendChip, mode: VnpuMode
) -> ContainerRequest:
    """A request for several devices: whole cards, or a refusal naming the partial share."""
    partial = None
    if request.memory and not whole_by_memory(request.memory, chip, mode):
        partial = f"{kind.resources.count}-memory"
    elif request.cores not in (0, 100):
        partial = f"{kind.resources.count}-core"
    if partial:
        raise RequestError(
            partial,
            container.resource(partial) or "",
            f"asks for part of a card, but {request.count} {kind.common_word} devices are whole cards only: "
            f"leave out {partial}, or ask for 1 device",
        )
    return ContainerRequest(kind=kind.common_word, count=request.count, memory_percentage=100, cores=100)


def admission_defaults(
    kind: DeviceKind, container: Container, pod: Pod, settings: AscendSettings
) -> AdmissionEdit | None:
    """The count a super-pod chip reads as two written back (so the kubelet gives two devices), and the
    runtime class."""
    request = container_request(kind, container, pod, settings)
    if request is None:
        return None
    limits: dict[str, str] = {}
    raw = container.resource(kind.resources.count)
    written = raw is not None and raw.strip() == str(request.count)
    if not written and settings.chips[kind.common_word].super_pod and request.count == 2:
        limits[kind.resources.count] = "2"
    runtime_class = settings.runtime_class_name or None
    if not limits and runtime_class is None:
        return None
    return AdmissionEdit(limits=limits, runtime_class_name=runtime_class)
