"""The data model every part of HAMi speaks: devices, requests, placements, node views.

This module owns the *meaning* of the values that travel between the services and the vendor plugins, and
their validation: a negative memory size, cores over 100 % of a card, or a request for zero devices is
rejected here, with a message that names the field and says what a legal value looks like.

It owns no encoding (that is `hami.codec`) and no Kubernetes access (that is `hami.cluster`). Models that
are built on the hot path of the scheduler (`DeviceUsage`, `ContainerDevice`) stay small and flat so that
building thousands of them per filter call is cheap.

Units: device memory is always MiB, cores are always percent of one device (100 = a whole device; a
device whose cores are scaled may register more than 100).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hami.fragmentation import WorkloadProfile
from hami.quantity import cpu_millis, memory_mib

__all__ = [
    "AdmissionEdit",
    "Allocation",
    "AnnotationKeys",
    "Container",
    "ContainerDevice",
    "ContainerEdits",
    "ContainerRequest",
    "Device",
    "DeviceKind",
    "DeviceNode",
    "DeviceProcess",
    "DeviceReading",
    "DeviceUsage",
    "DraDevice",
    "IsolationLibrary",
    "Mount",
    "NO_INIT",
    "NodeFit",
    "NodeInventory",
    "NodeView",
    "PlacedPod",
    "Pod",
    "PodAllocation",
    "RegisterFormat",
    "ResourceNames",
    "RunOrder",
    "SchedulingPolicy",
    "VendorInfo",
    "cpu_memory_requests",
]

MiB = Annotated[int, Field(ge=0, description="device memory in MiB")]
"""A memory size in MiB; never negative."""

_ID_FORBIDDEN = frozenset(",:;")


def _check_device_id(value: str, what: str) -> str:
    if not value:
        raise ValueError(f"{what} must not be empty")
    if "," in value or ":" in value or ";" in value:  # three scans in C: every device and grant decoded runs this
        bad = sorted(_ID_FORBIDDEN.intersection(value))
        raise ValueError(
            f"{what} {value!r} contains {' '.join(repr(c) for c in bad)}, which HAMi's annotation encodings "
            "use as separators; use the device UUID as the driver reports it"
        )
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------------------------------------
# Vendor metadata
# --------------------------------------------------------------------------------------------------------


class RegisterFormat(StrEnum):
    """How a device kind publishes its devices on the Node object."""

    JSON = "json"
    """`hami.io/node-…-register` holds a JSON array of device objects (NVIDIA, Ascend)."""
    LEGACY = "legacy"
    """The register annotation holds HAMi's colon-terminated 7- or 9-field strings (Hygon, Iluvatar)."""
    CAPACITY = "capacity"
    """No annotation in HAMi: devices are derived from the node's `status.capacity` (Cambricon, Moore Threads,
    whole-card MetaX). The unified daemon may still publish a JSON register annotation for these."""


class ResourceNames(_Model):
    """The extended-resource names a device kind answers to in pod specs (protocol.md section 1)."""

    count: str = Field(description="number of physical devices a container gets, e.g. `nvidia.com/gpu`")
    memory: str | None = Field(default=None, description="device memory per device, e.g. `nvidia.com/gpumem`")
    memory_percentage: str | None = Field(default=None, description="memory as percent of the device")
    cores: str | None = Field(default=None, description="compute share per device, in percent")
    priority: str | None = Field(default=None, description="task priority, e.g. `nvidia.com/priority`")
    memory_unit_mib: int = Field(default=1, ge=1, description="MiB per unit of the memory resource (256 for MLU)")

    def all(self) -> tuple[str, ...]:
        """Every resource name of this kind, count first."""
        names = (self.count, self.memory, self.memory_percentage, self.cores, self.priority)
        return tuple(n for n in names if n)


class AnnotationKeys(_Model):
    """The node and pod annotation keys a device kind reads and writes (protocol.md sections 1-3)."""

    node_register: str | None = Field(default=None, description="node annotation listing the devices")
    node_handshake: str | None = Field(default=None, description="node annotation of the scheduler/daemon handshake")
    to_allocate: str | None = Field(
        description="pod annotation: placements the node side has still to serve; None for a kind HAMi writes no "
        "such annotation for, whose node side is the vendor's own device plugin (Enflame's DRS, AWS Neuron), "
        "which this node daemon does not serve"
    )
    allocated: str = Field(description="pod annotation: placements, kept for usage accounting")
    use_uuid: str | None = None
    nouse_uuid: str | None = None
    use_type: str | None = None
    nouse_type: str | None = None

    def selectors(self) -> tuple[str, ...]:
        keys = (self.use_uuid, self.nouse_uuid, self.use_type, self.nouse_type)
        return tuple(k for k in keys if k)


class DeviceKind(_Model):
    """One kind of device a vendor serves, identified by HAMi's *common word* (`NVIDIA`, `Ascend910B3`, `DCU`).

    A vendor may serve several kinds (Ascend: one per chip; MetaX: whole cards and shared cards). The
    common word is the `Type` written in pod device strings and the key of a pod allocation.
    """

    common_word: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    resources: ResourceNames
    annotations: AnnotationKeys
    register_format: RegisterFormat = RegisterFormat.JSON
    capacity_by_cores: str | None = Field(
        default=None,
        description="a capacity kind HAMi counts from its cores capacity (100 per device) and names "
        "`<node>-<this>-<i>` (Cambricon: `cambricon-mlu`); its node daemon serves that capacity too",
    )
    capacity_cores_per_device: int = Field(
        default=100,
        ge=1,
        description="with `capacity_by_cores`: the cores each device adds to the cores capacity, which are also "
        "its `devcore` (Cambricon 100, Moore Threads 16)",
    )
    capacity_memory: int = Field(
        default=0,
        ge=0,
        description="the memory each capacity-derived device registers when the kind has no memory resource (HAMi "
        "registers Enflame's whole GCUs with 100)",
    )
    capacity_name: str | None = Field(
        default=None,
        description="the word in HAMi's capacity-derived device names `<node>-<word>-<i>` (MetaX: "
        "`metax`); the common word when unset",
    )
    node_lock: str | None = Field(
        default=None,
        description="node annotation of the vendor's own node lock (an RFC 3339 time) that HAMi's scheduler takes "
        "at bind for pods of this kind and the vendor's node side removes once it served the pod; this scheduler "
        "takes it in the same write as its own lock, and waits while one is younger than `node_lock_seconds`",
    )
    node_lock_seconds: int = Field(default=120, gt=0, description="age at which `node_lock` is taken over")
    reusable_fits: bool = Field(
        default=False,
        description="the vendor's fit of a node (`hami_fit_nodes`) is a function of the pod's spec and annotations "
        "(not its name or UID), the policy and that node's view alone (its devices, usage, pods, labels and "
        "annotations but the node lock and handshake): no clock, no randomness, no other node, nothing the vendor "
        "keeps between calls. The scheduler then reuses a node's fit for a later pod alike until the node changes "
        "(most of a filter's cost when a policy compares a batch of nodes). Leave it False when a fit writes a "
        "time or anything else of the moment in `pod_annotations`",
    )
    core_units: bool = Field(
        default=False,
        description="a device's `devcore` counts compute units and a request's `cores` (a percent) takes "
        "floor(percent × devcore / 100) of them, at least 1 (HAMi's AMD: `devcore` is the GPU's compute units, a "
        "placement's `usedcores` the units granted); when False, `cores` are granted as written",
    )

    def cores_on(self, cores: int, device: Device) -> int:
        """What a request of `cores` percent takes of `device`'s `devcore` (see `core_units`)."""
        if not self.core_units or cores <= 0:
            return cores
        return max(1, min(device.devcore, device.devcore * cores // 100))


class VendorInfo(_Model):
    """What a vendor plugin is: its name, its device kinds, its isolation library."""

    name: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9_-]*$", description="short name, e.g. `nvidia`")
    display_name: str = Field(min_length=1, description="human name, e.g. `NVIDIA`")
    kinds: tuple[DeviceKind, ...] = Field(min_length=1)
    isolation_library: str | None = Field(
        default=None,
        description="file name of the library loaded into containers through /etc/ld.so.preload, or None "
        "when the vendor's own components enforce the share",
    )

    @model_validator(mode="after")
    def _kinds_unique(self) -> VendorInfo:
        words = [k.common_word for k in self.kinds]
        if len(set(words)) != len(words):
            raise ValueError(f"vendor {self.name!r} declares a device kind twice: {words}")
        return self

    def kind(self, common_word: str) -> DeviceKind:
        for k in self.kinds:
            if k.common_word == common_word:
                return k
        raise KeyError(f"vendor {self.name!r} has no device kind {common_word!r}")


# --------------------------------------------------------------------------------------------------------
# Devices and their usage
# --------------------------------------------------------------------------------------------------------


class Device(_Model):
    """One physical device as a node registers it (HAMi's DeviceInfo)."""

    id: str = Field(description="the device UUID, e.g. `GPU-0a1b…`")
    index: int = Field(default=0, ge=0, description="the driver's index of the device on its node")
    count: int = Field(default=1, ge=0, description="how many containers may share it (the split count)")
    devmem: MiB = Field(default=0, description="memory in MiB, after memory scaling")
    devcore: int = Field(default=100, ge=0, description="compute in percent of one device, after core scaling")
    type: str = Field(default="", description="the model, e.g. `NVIDIA-A100`")
    numa: int = Field(default=0, ge=-1, description="NUMA node, -1 when unknown")
    health: bool = True
    mode: str = Field(default="", description="sharing mode: `hami-core`, `mig`, `mps`, or empty")
    mig_profiles: tuple[Any, ...] = Field(default=(), description="MIG geometries allowed, as the vendor writes them")
    vendor: str = Field(default="", description="HAMi's `devicevendor`, when the register annotation carries it")
    custom: Mapping[str, Any] = Field(default_factory=dict, description="vendor-specific extras (`custominfo`)")

    @field_validator("id")
    @classmethod
    def _id_ok(cls, v: str) -> str:
        return _check_device_id(v, "device id")

    @field_validator("type", "mode")
    @classmethod
    def _no_separators(cls, v: str) -> str:
        bad = sorted(_ID_FORBIDDEN.intersection(v))
        if bad:
            raise ValueError(f"{v!r} contains {' '.join(repr(c) for c in bad)}, a separator of HAMi's encodings")
        return v


class DeviceUsage(BaseModel):
    """A registered device together with what running and placed pods already use of it.

    Mutable on purpose: the scheduler adds a placement's usage as soon as it decides, so the next pod sees it.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    device: Device
    used: int = Field(default=0, ge=0, description="containers sharing the device")
    usedmem: MiB = 0
    usedcores: int = Field(default=0, ge=0)

    @property
    def id(self) -> str:
        return self.device.id

    @property
    def free_slots(self) -> int:
        return self.device.count - self.used

    @property
    def free_memory(self) -> int:
        return self.device.devmem - self.usedmem

    @property
    def free_cores(self) -> int:
        return self.device.devcore - self.usedcores


# --------------------------------------------------------------------------------------------------------
# Pods as the device logic sees them
# --------------------------------------------------------------------------------------------------------


_K = TypeVar("_K")

SIDECAR_RESTART_POLICY = "Always"
"""An init container's `restartPolicy` that makes it a native sidecar (Kubernetes 1.29 and later)."""


@dataclass(frozen=True, slots=True)
class RunOrder:
    """Which of a pod's containers hold their devices at the same time, by position (init containers first, the
    positional order of HAMi's pod device strings), and the one rule every count of a pod's usage follows.

    Init containers run one after another, before the app containers. A native sidecar (an init container with
    `restartPolicy: Always`, Kubernetes 1.29 and later) starts in its turn and then runs for the pod's whole
    life: beside every init container declared after it and beside the app containers. So (Kubernetes' own
    rule for a pod's effective requests, and HAMi's since PR #2723) the pod holds the larger of
    - its init phase's peak: for each init container, it plus the sidecars declared before it, and
    - its steady state: every sidecar plus every app container.

    The fitter, the scheduler's bookkeeping, quota (admission and the filter's reservation) and kube-scheduler's
    CPU and memory count (`cpu_memory_requests`) all count through `peak`; nothing else decides it.
    """

    init: int = 0
    """How many of the positions are init containers (sidecars included)."""
    sidecars: frozenset[int] = frozenset()
    """Positions (each below `init`) of the init containers that are native sidecars."""

    @classmethod
    def of_spec(cls, spec: Mapping[str, Any]) -> RunOrder:
        """From a pod spec as the Kubernetes API serialises it (the bookkeeping reads pods without the model)."""
        inits = spec.get("initContainers") or ()
        if not inits:
            return NO_INIT  # most pods: one frozen value for all (a pod is read three times at start-up)
        if not isinstance(inits, Sequence) or isinstance(inits, str):
            return cls()
        return cls(
            len(inits),
            frozenset(
                i
                for i, c in enumerate(inits)
                if isinstance(c, Mapping) and c.get("restartPolicy") == SIDECAR_RESTART_POLICY
            ),
        )

    def role(self, index: int) -> str:
        """`init`, `sidecar` or `app`: how the container at `index` runs (for messages)."""
        if index >= self.init:
            return "app"
        return "sidecar" if index in self.sidecars else "init"

    def steady(self, index: int) -> bool:
        """Whether the container at `index` runs for the pod's whole life (a sidecar or an app container)."""
        return index >= self.init or index in self.sidecars

    def peak(self, amounts: Iterable[tuple[int, Sequence[int]]]) -> tuple[int, ...]:
        """What the pod holds at its peak, component by component: the larger of the init phase's peak (each init
        container with the sidecars declared before it) and the steady state (sidecars plus app containers).

        `amounts` are (position, amount) pairs in ascending position, every amount of the same length (e.g.
        slots, MiB, cores); a position left out holds nothing. Nothing given is the empty tuple."""
        return self.peaks((index, None, amount) for index, amount in amounts).get(None, ())

    def peaks(self, amounts: Iterable[tuple[int, _K, Sequence[int]]]) -> dict[_K, tuple[int, ...]]:
        """`peak` for several things at once (e.g. each device a pod uses), in one pass: (position, key, amount)
        triples in ascending position, the amounts of one key all of the same length; the peak per key given."""
        init, sidecars = self.init, self.sidecars
        if not init:  # every container at once (most pods; this runs for every node fitted): the sum
            sums: dict[_K, tuple[int, ...]] = {}
            for _, key, amount in amounts:
                so_far = sums.get(key)
                sums[key] = (
                    tuple(amount) if so_far is None else tuple([t + v for t, v in zip(so_far, amount, strict=True)])
                )
            return sums
        started: dict[_K, list[int]] = {}  # per key, the sidecars started so far
        peak: dict[_K, list[int]] = {}  # per key, the init phase's peak so far
        apps: dict[_K, list[int]] = {}
        for index, key, amount in amounts:
            if index >= init:
                total = apps.get(key)
                if total is None:
                    apps[key] = list(amount)
                else:
                    for k, v in enumerate(amount):
                        total[k] += v
                continue
            on = started.setdefault(key, [0] * len(amount))
            top = peak.setdefault(key, [0] * len(amount))
            sidecar = index in sidecars
            for k, v in enumerate(amount):
                if sidecar:
                    on[k] += v
                    top[k] = max(top[k], on[k])
                else:
                    top[k] = max(top[k], on[k] + v)
        out = {key: tuple(total) for key, total in apps.items() if key not in peak}
        for key, top in peak.items():
            on, total = started[key], apps.get(key)
            out[key] = tuple(
                max(p, s + (total[k] if total else 0)) for k, (p, s) in enumerate(zip(top, on, strict=True))
            )
        return out


NO_INIT = RunOrder()
"""The run order of a pod without init containers: every position is an app container's."""


class Container(_Model):
    """The parts of a Kubernetes container spec that device logic reads."""

    name: str
    limits: Mapping[str, str] = Field(default_factory=dict)
    requests: Mapping[str, str] = Field(default_factory=dict)
    env: Mapping[str, str] = Field(default_factory=dict, description="literal `value` env entries only")
    privileged: bool = False
    restart_policy: str = Field(
        default="", description="an init container's `restartPolicy`: `Always` makes it a native sidecar"
    )

    def resource(self, name: str) -> str | None:
        """The raw quantity of resource `name`: from limits, falling back to requests (HAMi's rule)."""
        value = self.limits.get(name)
        if value is None:
            value = self.requests.get(name)
        return value

    def mentions(self, names: Sequence[str]) -> bool:
        return any(n in self.limits or n in self.requests for n in names)


class Pod(_Model):
    """The parts of a Kubernetes pod that device logic reads. Built from the API object by `Pod.from_api`."""

    name: str
    namespace: str = "default"
    uid: str = ""
    annotations: Mapping[str, str] = Field(default_factory=dict)
    labels: Mapping[str, str] = Field(default_factory=dict)
    init_containers: tuple[Container, ...] = ()
    containers: tuple[Container, ...] = ()
    node_name: str = ""
    scheduler_name: str = ""
    cpu_request: int = Field(default=0, ge=0, description="CPU millicores the pod requests, as kube-scheduler counts")
    memory_request: int = Field(default=0, ge=0, description="memory MiB the pod requests, as kube-scheduler counts")
    priority: int = Field(default=0, description="spec.priority, resolved from its PriorityClass at admission")
    preemption_policy: str = Field(default="", description="spec.preemptionPolicy (`Never` forbids preempting)")

    @property
    def all_containers(self) -> tuple[Container, ...]:
        """Init containers first, then app containers: the positional order of HAMi's pod device strings."""
        return self.init_containers + self.containers

    @property
    def run_order(self) -> RunOrder:
        """Which of `all_containers` hold devices at the same time (`RunOrder`)."""
        if not self.init_containers:
            return NO_INIT
        return RunOrder(
            len(self.init_containers),
            frozenset(i for i, c in enumerate(self.init_containers) if c.restart_policy == SIDECAR_RESTART_POLICY),
        )

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> Pod:
        """Build the view from a pod as the Kubernetes API serialises it (a JSON object)."""
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        return cls(
            name=str(meta.get("name") or meta.get("generateName") or ""),
            namespace=str(meta.get("namespace") or "default"),
            uid=str(meta.get("uid") or ""),
            annotations=_str_map(meta.get("annotations")),
            labels=_str_map(meta.get("labels")),
            init_containers=tuple(_container_from_api(c) for c in spec.get("initContainers") or ()),
            containers=tuple(_container_from_api(c) for c in spec.get("containers") or ()),
            node_name=str(spec.get("nodeName") or ""),
            scheduler_name=str(spec.get("schedulerName") or ""),
            priority=_priority(spec.get("priority")),
            preemption_policy=str(spec.get("preemptionPolicy") or ""),
            **dict(zip(("cpu_request", "memory_request"), cpu_memory_requests(spec), strict=True)),
        )


def _priority(value: object) -> int:
    """spec.priority as an int (the API server sets it from the PriorityClass; absent or unreadable is 0)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        return 0


def cpu_memory_requests(spec: Mapping[str, Any]) -> tuple[int, int]:
    """A pod's CPU (millicores) and memory (MiB) requests as kube-scheduler counts them: the sum of its app
    containers and native sidecars, or its init phase's peak if that is larger (`RunOrder.peak`). Requests
    default to limits; unreadable quantities count as zero (the API server has validated them)."""

    def one(container: Any) -> tuple[int, int]:
        resources = container.get("resources") or {} if isinstance(container, Mapping) else {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        try:
            return (
                cpu_millis(asked["cpu"]) if "cpu" in asked else 0,
                memory_mib(asked["memory"]) if "memory" in asked else 0,
            )
        except ValueError:
            return 0, 0

    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    cpu, memory = RunOrder.of_spec(spec).peak(enumerate(map(one, containers))) or (0, 0)
    return max(cpu, 0), max(memory, 0)


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def _container_from_api(obj: Mapping[str, Any]) -> Container:
    resources = obj.get("resources") or {}
    # A literal entry: `value` set, or neither `value` nor `valueFrom` (the API omits an empty `value`).
    env = {
        str(e["name"]): e.get("value") or ""
        for e in obj.get("env") or ()
        if isinstance(e, Mapping) and "name" in e and isinstance(e.get("value") or "", str) and not e.get("valueFrom")
    }
    security = obj.get("securityContext") or {}
    return Container(
        name=str(obj.get("name") or ""),
        limits=_str_map(resources.get("limits")),
        requests=_str_map(resources.get("requests")),
        env=env,
        privileged=bool(security.get("privileged")) if isinstance(security, Mapping) else False,
        restart_policy=str(obj.get("restartPolicy") or ""),
    )


# --------------------------------------------------------------------------------------------------------
# Requests and placements
# --------------------------------------------------------------------------------------------------------


class ContainerRequest(_Model):
    """What one container asks of one device kind (HAMi's ContainerDeviceRequest). Memory and cores are per device."""

    kind: str = Field(min_length=1, description="the device kind's common word")
    count: int = Field(ge=1, le=1024, description="how many physical devices")
    memory: MiB = Field(default=0, description="MiB per device; 0 with `memory_percentage` unset means none asked")
    memory_percentage: int | None = Field(default=None, ge=0, le=100, description="percent of each device's memory")
    cores: int = Field(default=0, ge=0, le=100, description="percent of each device's compute; 100 = exclusive")

    @model_validator(mode="after")
    def _memory_one_way(self) -> ContainerRequest:
        if self.memory and self.memory_percentage is not None:
            raise ValueError("ask for memory in MiB or as a percentage of the device, not both")
        return self

    def memory_on(self, device: Device) -> int:
        """The MiB this request takes on `device` (a percentage resolves against the device's memory)."""
        if self.memory_percentage is not None:
            return device.devmem * self.memory_percentage // 100
        return self.memory


class ContainerDevice(_Model):
    """One device granted to a container: `<UUID>,<Type>,<Usedmem>,<Usedcores>` in HAMi's pod strings."""

    uuid: str
    type: str = Field(description="the device kind's common word")
    usedmem: MiB = 0
    usedcores: int = Field(default=0, ge=0)

    @field_validator("uuid", "type")
    @classmethod
    def _ok(cls, v: str) -> str:
        return _check_device_id(v, "device uuid/type")


ContainerPlacement = tuple[ContainerDevice, ...]
"""The devices of one kind granted to one container (empty when it asked for none)."""


class PodAllocation(_Model):
    """A pod's placement for every kind it uses: kind → one entry per container, init containers first.

    Every kind's list has exactly one entry per container of the pod, empty for containers that use none
    of that kind, so positions never shift (HAMi's padding defect is avoided by construction).
    """

    containers: int = Field(ge=0, description="number of containers (init + app) of the pod")
    by_kind: Mapping[str, tuple[ContainerPlacement, ...]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _positional(self) -> PodAllocation:
        for kind, entries in self.by_kind.items():
            if len(entries) != self.containers:
                raise ValueError(
                    f"allocation for {kind!r} has {len(entries)} container entries, the pod has {self.containers}"
                )
        return self


# --------------------------------------------------------------------------------------------------------
# Nodes, fitting and scoring
# --------------------------------------------------------------------------------------------------------


class NodeInventory(_Model):
    """What discovery found on this node for one device kind."""

    kind: str
    devices: tuple[Device, ...] = ()
    link_scores: Mapping[str, Mapping[str, int]] = Field(
        default_factory=dict, description="pairwise link scores between device UUIDs (higher is better connected)"
    )
    annotations: Mapping[str, str] = Field(default_factory=dict, description="extra node annotations to publish")


class PlacedPod(_Model):
    """A pod counted on a node: who it is and its annotations, as the scheduler last saw them.

    Fitters read these to honour what running pods reserved beyond device usage (e.g. the placement of a
    partition written in a pod annotation by an earlier fit). Before the pod's own update comes back through
    the watch, `annotations` holds only what the filter wrote for it (`NodeFit.pod_annotations`).
    """

    namespace: str
    name: str
    uid: str = ""
    annotations: Mapping[str, str] = Field(default_factory=dict)


class NodeView(BaseModel):
    """A candidate node as the scheduler sees it for one device kind: its devices and their current usage,
    and the pods that use devices of the kind there.

    The scheduler keeps one view per node and kind and updates it in place as pods come and go; a fitter
    must only read it.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    devices: list[DeviceUsage] = Field(default_factory=list)
    pods: dict[str, PlacedPod] = Field(
        default_factory=dict,
        description="`namespace/name` → the pods counted on the node that use devices of this kind "
        "(running, bound, or placed by the filter and not yet bound)",
    )
    link_scores: Mapping[str, Mapping[str, int]] = Field(default_factory=dict)
    annotations: Mapping[str, str] = Field(default_factory=dict)
    labels: Mapping[str, str] = Field(default_factory=dict)
    cpu_free: int | None = Field(default=None, description="millicores not yet requested on the node, if known")
    memory_free: int | None = Field(default=None, description="MiB not yet requested on the node, if known")


class SchedulingPolicy(_Model):
    """How to choose between feasible nodes and devices; pod annotations may override the cluster default."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    node: Literal["binpack", "spread", "best-fit", "fragmentation-aware", "usage"] = "binpack"
    device: tuple[str, ...] = ("spread",)
    weights: Mapping[str, int] = Field(default_factory=lambda: {"slot": 1, "core": 1, "memory": 1})
    workload: WorkloadProfile | None = Field(
        default=None, exclude=True, description="the request mix the fragmentation-aware policy plans for"
    )


class NodeFit(_Model):
    """One candidate node's answer for a pod: the devices per container, or why it cannot serve the pod."""

    node: str
    placement: tuple[ContainerPlacement, ...] | None = Field(
        default=None, description="one entry per container (init first); None when the node does not fit"
    )
    reason: str = Field(default="", description="why the node does not fit, readable by a user")
    score: float = 0.0
    pod_annotations: Mapping[str, str] = Field(
        default_factory=dict,
        description="annotations to write on the pod with its placement when this node is chosen (the "
        "vendor's own keys, e.g. a partition reservation); an empty value clears what an earlier decision wrote",
    )

    @model_validator(mode="after")
    def _either(self) -> NodeFit:
        if self.placement is None and not self.reason:
            raise ValueError(f"node {self.node!r} does not fit but no reason was given")
        return self

    @property
    def fits(self) -> bool:
        return self.placement is not None


# --------------------------------------------------------------------------------------------------------
# Allocation, admission and container edits
# --------------------------------------------------------------------------------------------------------


class Allocation(_Model):
    """What `hami_allocate` made of one container's recorded placement on the node.

    A vendor may answer with a bare placement instead when it has no annotations to write.
    """

    devices: ContainerPlacement = Field(description="the placement to use from now on (identifiers filled in)")
    pod_annotations: Mapping[str, str] = Field(
        default_factory=dict,
        description="annotations the node daemon writes on the pod with the container's allocation (the "
        "vendor's own keys, e.g. the identity of a partition it created)",
    )
    node_annotations: Mapping[str, str | None] = Field(
        default_factory=dict,
        description="annotations the node daemon writes on its node once the container is served, None removing "
        "one (the vendor's own keys, e.g. a vendor's node lock its runtime contract releases at Allocate); keys "
        "the daemon owns (its lock, registers, handshakes) are not the vendor's to write and are ignored",
    )


class IsolationLibrary(_Model):
    """A vendor's isolation library as the node daemon installed it on the host (`hami.node.hooklib`).

    Both are host paths. The preload file names `path`, so a container mounts the library at that same path
    and the preload file at ``/etc/ld.so.preload``.
    """

    path: str = Field(description="the library's stable name, a symlink to the installed build")
    preload_path: str = Field(description="the preload file naming `path`")


class AdmissionEdit(_Model):
    """What a vendor changes on one container (and its pod) at admission, or why it refuses the pod."""

    limits: Mapping[str, str] = Field(default_factory=dict, description="resource limits to set (defaults)")
    env: Mapping[str, str] = Field(default_factory=dict, description="env entries to add")
    pod_annotations: Mapping[str, str] = Field(default_factory=dict)
    runtime_class_name: str | None = None
    deny: str | None = Field(default=None, description="set to refuse the pod, with the reason")


class Mount(_Model):
    container_path: str
    host_path: str
    read_only: bool = True


class DeviceNode(_Model):
    container_path: str
    host_path: str
    permissions: str = "rw"


class ContainerEdits(_Model):
    """What the kubelet must add to a container (the device plugin's ContainerAllocateResponse)."""

    env: Mapping[str, str] = Field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceNode, ...] = ()
    annotations: Mapping[str, str] = Field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()
    accounting_file: str | None = Field(
        default=None,
        description="host path of the container's shared accounting file (hami.isolation's layout), which the "
        "node daemon's monitor reads for per-container usage; None when the container has none",
    )
    files: Mapping[str, str] = Field(
        default_factory=dict,
        description="host path -> text: files the node daemon writes (root-owned, mode 0644) before it answers the "
        "kubelet, such as the container's grant (hami.isolation.grant); never sent to the kubelet",
    )


# --------------------------------------------------------------------------------------------------------
# Dynamic Resource Allocation (hami.dra)
# --------------------------------------------------------------------------------------------------------

DraAttribute = str | int | bool
"""A value of a DRA device attribute: ResourceSlice attributes are typed strings, integers or booleans."""


class DeviceProcess(_Model):
    """A process on a device and the device memory it holds, as the vendor's management library counts it (the
    driver's own figure, the context's reservation included): what the node-side backstop checks grants against."""

    device_uuid: str = Field(min_length=1, description="the device's id, as discovery reports it (`Device.id`)")
    pid: int = Field(gt=0, description="the process id in the host's PID namespace")
    used_bytes: int = Field(ge=0, description="device memory the process holds")


class DrmUsageSource(_Model):
    """Where the kernel's DRM client statistics (``/proc/<pid>/fdinfo/<fd>``, `hami.drmfdinfo`) describe a vendor's
    devices, and what in them counts (`hami_drm_usage_source`): the node daemon's backstop reads the memory of the
    served containers' DRM clients there where the management library gives none per process, and the busy share of
    the devices from the engines' busy time."""

    drivers: tuple[str, ...] = Field(min_length=1, description="the ``drm-driver`` names of the vendor's devices")
    devices: Mapping[str, str] = Field(
        description="the devices' PCI addresses as ``drm-pdev`` gives them, in sysfs's form (``0000:3b:00.0``) → "
        "their ids (`Device.id`)"
    )
    memory_regions: tuple[str, ...] = Field(
        default=(), description="the regions that are the device's own memory (``vram``); none: no memory figure"
    )
    engines: tuple[str, ...] = Field(
        default=(), description="the engines whose busy time makes the device busy; none: no busy share"
    )


class DeviceReading(_Model):
    """What the vendor's management library reads from one device right now (`hami_device_readings`): the device's
    own figures, beside the grants the scheduler made and what each container's isolation library accounts.

    Every figure is optional: None where the library cannot say (not supported, not this round). Values are passed
    on as the library gives them; the node daemon (`hami.node.monitor`) checks each against the device and shows
    one that makes no sense (negative, above the device, far outside what hardware reaches) as unknown.
    """

    device_uuid: str = Field(min_length=1, description="the device's id, as discovery reports it (`Device.id`)")
    memory_used_bytes: int | None = Field(default=None, description="device memory in use, every process counted")
    memory_total_bytes: int | None = Field(default=None, description="the device's physical memory, unscaled")
    utilization_percent: float | None = Field(
        default=None, description="share of the last sample period the device was busy, percent (0-100)"
    )
    power_watts: float | None = Field(default=None, description="board power draw, watts")
    temperature_celsius: float | None = Field(default=None, description="the chip's temperature, degrees Celsius")
    memory_temperature_celsius: float | None = Field(
        default=None, description="the device memory's temperature, degrees Celsius"
    )
    driver_version: str = Field(default="", description="the driver's version, as the library reports it")


class DraDevice(_Model):
    """A vendor's facts about one device for its ResourceSlice entry (`hami_dra_device`), beside what core
    derives from the `Device` itself (kind, vendor, model, UUID, index, NUMA, memory, cores, split count).

    Every field left at its default keeps core's choice; see `hami.dra.slices` for how each is published.
    """

    attributes: Mapping[str, DraAttribute] = Field(
        default_factory=dict,
        description="extra attributes, e.g. topology identifiers; unqualified names get the driver's domain, and "
        "a name core already publishes is not the vendor's to change",
    )
    shared: bool | None = Field(
        default=None,
        description="whether several claims may hold shares of the device; None: when its split count is above 1",
    )
    published: bool = Field(
        default=True,
        description="False keeps the device out of the ResourceSlice: one that DRA cannot serve as a device or "
        "share of one (NVIDIA's GPUs in MIG mode, whose partitions are not published yet)",
    )
    memory_step_mib: int | None = Field(
        default=None, ge=1, description="the granularity of a memory share in MiB; None: the kind's memory unit"
    )
    memory_values_mib: tuple[int, ...] = Field(
        default=(),
        max_length=10,
        description="the only memory sizes a share may have (ascending, at most 10), for vendors whose fitting "
        "places fixed partitions; a request is rounded up to the next one. Empty: any multiple of the step",
    )
    cores_step: int = Field(default=1, ge=1, description="the granularity of a cores share, in percent")

    @field_validator("memory_values_mib")
    @classmethod
    def _ascending(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(b <= a for a, b in itertools.pairwise(v)) or any(x <= 0 for x in v):
            raise ValueError(f"memory_values_mib must be positive and strictly ascending, got {list(v)}")
        return v
