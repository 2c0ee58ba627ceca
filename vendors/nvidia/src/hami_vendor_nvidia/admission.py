"""Reading NVIDIA requests and the admission defaults HAMi's webhook applies to NVIDIA containers.

Owns HAMi's NVIDIA rules on top of core's `read_share_request`: ``defaultMemory`` and ``defaultCores``; a
container that gives memory or cores without a count gets ``defaultGPUNum`` devices (none when it is 0); and,
at admission, for each container asking for NVIDIA GPUs:

* ``nvidia.com/gpucores: 100`` (exclusive) when only a count is given (or the whole memory by percentage), and
  no default memory is configured: a whole GPU is not shared;
* the count limit when memory or cores come without one (``defaultGPUNum``);
* ``CUDA_TASK_PRIORITY`` from ``nvidia.com/priority``, ``GPU_CORE_UTILIZATION_POLICY`` from ``gpuCorePolicy``
  (unless ``default``);
* ``runtimeClassName`` when configured (the webhook sets it only on pods that have none);
* a ``nvidia.com/vgpu-mode`` that names no known mode is refused with the modes that exist;
* ``CUDA_DISABLE_CONTROL=true`` (no isolation library) is refused unless the container asks for whole GPUs:
  100 % cores and the whole memory; a share without the library would take what others were granted.

Applying the answer twice gives the same pod: every limit is set only when absent, every env value is fixed.
"""

from __future__ import annotations

from hami.model import AdmissionEdit, Container, ContainerRequest, DeviceKind, Pod
from hami.requests import read_count, read_share_request
from hami_vendor_nvidia.edits import DISABLE_CONTROL_ENV, control_disabled
from hami_vendor_nvidia.fit import MODE_ANNOTATION, MODES, requested_modes
from hami_vendor_nvidia.settings import NvidiaSettings

__all__ = ["CORE_POLICY_ENV", "TASK_PRIORITY_ENV", "admission_defaults", "container_request"]

TASK_PRIORITY_ENV = "CUDA_TASK_PRIORITY"
CORE_POLICY_ENV = "GPU_CORE_UTILIZATION_POLICY"


def container_request(kind: DeviceKind, container: Container, settings: NvidiaSettings) -> ContainerRequest | None:
    """What the container asks of NVIDIA GPUs under HAMi's rules and the configured defaults."""
    names = kind.resources
    request = read_share_request(
        kind, container, default_memory=settings.default_memory, default_cores=settings.default_cores
    )
    if request is None or container.resource(names.count) is not None:
        return request
    # memory or cores without a count: HAMi's webhook adds defaultGPUNum devices (none when it is 0)
    if settings.default_gpu_num == 0:
        return None
    return request.model_copy(update={"count": settings.default_gpu_num})


def admission_defaults(
    kind: DeviceKind, container: Container, pod: Pod, settings: NvidiaSettings
) -> AdmissionEdit | None:
    """HAMi's NVIDIA admission mutation of one container, or a refusal."""
    names = kind.resources
    modes = requested_modes(pod)
    if modes is not None and not modes <= set(MODES):
        unknown = ", ".join(sorted(modes - set(MODES)))
        return AdmissionEdit(
            deny=f"{MODE_ANNOTATION}: {unknown} is not a GPU mode; use one of {', '.join(MODES)} (or a comma list)"
        )
    request = container_request(kind, container, settings)
    if request is None:
        return None
    limits: dict[str, str] = {}
    env: dict[str, str] = {}
    if container.resource(names.count) is None:
        limits[names.count] = str(request.count)
    if names.cores and container.resource(names.cores) is None and _exclusive(container, kind, settings):
        limits[names.cores] = "100"
    if control_disabled(container) and not _whole(request, limits.get(names.cores or "")):
        return AdmissionEdit(
            deny=f"container {container.name}: {DISABLE_CONTROL_ENV}=true runs it without the isolation library, "
            f"which only a container with whole GPUs may do: ask for {names.cores}: 100 and the whole memory "
            f"(no {names.memory}, or {names.memory_percentage}: 100), or remove {DISABLE_CONTROL_ENV}"
        )
    priority = read_count(container, names.priority, unit="priority level") if names.priority else None
    if priority is not None:
        env[TASK_PRIORITY_ENV] = str(priority)
    if settings.gpu_core_policy != "default":
        env[CORE_POLICY_ENV] = settings.gpu_core_policy
    env = {k: v for k, v in env.items() if container.env.get(k) != v}
    runtime_class = settings.runtime_class_name or None
    if not limits and not env and runtime_class is None:
        return None
    return AdmissionEdit(limits=limits, env=env, runtime_class_name=runtime_class)


def _whole(request: ContainerRequest, defaulted_cores: str | None) -> bool:
    """The request is whole GPUs: all of their compute and all of their memory."""
    cores = 100 if defaulted_cores == "100" else request.cores
    memory = request.memory_percentage == 100 or (request.memory == 0 and request.memory_percentage is None)
    return cores == 100 and memory


def _exclusive(container: Container, kind: DeviceKind, settings: NvidiaSettings) -> bool:
    """A count with the whole memory (by percentage, or no memory at all) is an exclusive GPU (HAMi's rule),
    unless a default memory makes it a share."""
    names = kind.resources
    if names.memory_percentage and container.resource(names.memory_percentage) is not None:
        return read_count(container, names.memory_percentage, unit="percent", limit=100) == 100
    if names.memory and container.resource(names.memory) is not None:
        return False
    return not settings.default_memory
