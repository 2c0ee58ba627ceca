"""The vendor contract: every hook a vendor plugin may implement, grouped by the phase of a pod's life.

A vendor plugin is a module (or object) registered under the entry-point group ``hami.vendors`` whose
functions are marked with ``hami.hookimpl`` and named after the specifications below. The host
(`hami.plugins.VendorPlugins`) is the only caller; it always passes keyword arguments, so an implementation
may accept fewer parameters than the specification lists, and the contract can grow without breaking
plugins.

Two kinds of hook:

* **broadcast** hooks are called on every loaded vendor (metadata, discovery);
* **routed** hooks carry a ``kind`` argument and are called only on the vendor that declared that device
  kind in `hami_vendor_info`, so an implementation never sees another vendor's devices. Routed hooks are
  ``firstresult``: the vendor's single answer is the answer.

Rules that keep the cluster fast and safe:

* fitting and scoring receive **all candidate nodes in one call** (a 5,000-node filter makes one call per
  vendor involved, not one per node);
* a hook answers impossible input with a reason (a `NodeFit` without placement, an `AdmissionEdit` with
  ``deny``, a `hami.errors.RequestError`), never with an unexpected exception;
* hooks are pure with respect to cluster state: they read what they are given and return decisions; the
  services do the writing.

The guide for plugin authors, with one section per hook, is ``docs/plugin-guide.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pluggy

from hami.findings import Finding
from hami.isolation.grant import Grant
from hami.model import (
    AdmissionEdit,
    Allocation,
    Container,
    ContainerEdits,
    ContainerPlacement,
    ContainerRequest,
    Device,
    DeviceKind,
    DeviceProcess,
    DeviceReading,
    DraDevice,
    DrmUsageSource,
    IsolationLibrary,
    NodeFit,
    NodeInventory,
    NodeView,
    Pod,
    SchedulingPolicy,
    VendorInfo,
)

PROJECT = "hami"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

BROADCAST_HOOKS = ("hami_vendor_info", "hami_vendor_settings", "hami_discover_devices", "hami_doctor_checks")
"""Hooks the core calls on every vendor. Every other hook is routed by device kind."""


# --------------------------------------------------------------------------------------------------------
# Metadata
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def hami_vendor_info() -> VendorInfo:
    """Describe the vendor: its name, device kinds with their resource names and annotation keys, and
    its isolation library.

    Required. Called once when the plugin loads; the answer must not change afterwards.

    :returns: a `hami.model.VendorInfo`. Names must be unique across installed vendors; the core refuses
        the later of two plugins that claim the same vendor name, common word or resource name.
    """


@hookspec(firstresult=True)
def hami_vendor_settings(raw: Mapping[str, Any]) -> Any:
    """Validate this vendor's section of the configuration and return the settings object.

    Called once at load with the vendor's own section (``{}`` when the configuration has none). The
    object returned is passed back as ``settings`` to every other hook of this vendor.

    :param raw: the vendor's configuration section as parsed from the configuration file.
    :returns: any object (a pydantic model is recommended), or None when the vendor has no settings.
    :raises ValueError: (pydantic's ``ValidationError`` included) with a message naming the bad key; the
        host reports it as a configuration error and refuses to start.
    """


# --------------------------------------------------------------------------------------------------------
# Discovery (node side)
# --------------------------------------------------------------------------------------------------------


@hookspec
def hami_discover_devices(settings: Any) -> list[NodeInventory]:
    """Find this vendor's devices on the node the daemon runs on.

    Broadcast: every vendor answers for itself. Called at start-up and periodically; a device whose
    health changed must be reported with its new ``health`` so the daemon can tell the kubelet.

    :param settings: this vendor's settings (see `hami_vendor_settings`).
    :returns: one `hami.model.NodeInventory` per device kind present on the node (an empty list when the
        vendor's driver is absent: say so in the log, do not raise).
    """


@hookspec(firstresult=True)
def hami_node_devices(
    kind: DeviceKind,
    annotations: Mapping[str, str],
    node: str,
    capacity: Mapping[str, str],
    labels: Mapping[str, str],
    settings: Any,
) -> list[Device] | None:
    """Read a node's devices of ``kind`` from the vendor's own node annotation (scheduler side).

    Routed; optional. For a kind whose devices a vendor component publishes in a form of its own rather than
    HAMi's register encodings (MetaX's ``metax-tech.com/node-gpu-devices`` JSON), or derives from the node's
    capacity in a way of its own (AWS Neuron's cores per device): the scheduler calls it whenever it reads a node,
    instead of decoding ``kind.annotations.node_register`` itself. Where the hook answers for a node without
    annotations (if only ``[]``), the node daemon leaves that key to the vendor's `NodeInventory.annotations`;
    where it answers None there (a vendor that only adjusts HAMi's register as it reads it, as Biren's 100 cores),
    the daemon publishes the register as for any kind.

    :param annotations: the node's annotations.
    :param node: the node's name (for devices HAMi names after their node, as Enflame's DRS cards).
    :param capacity: the node's ``status.capacity``, quantities as the API server writes them.
    :param labels: the node's labels.
    :returns: the devices (``[]`` when the node publishes none of this kind), or None to fall back to the
        register annotation and capacity. A malformed annotation is logged and answered with ``[]``; never raise.
    """


# --------------------------------------------------------------------------------------------------------
# Requests and admission (webhook and scheduler)
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def hami_container_request(kind: DeviceKind, container: Container, pod: Pod, settings: Any) -> ContainerRequest | None:
    """Read what one container asks of one of this vendor's device kinds.

    Routed. Called only for containers that mention at least one of ``kind``'s resource names. Use
    `hami.requests.read_share_request` for HAMi's shared rules and add the vendor's own.

    :param kind: the device kind (one of those declared in `hami_vendor_info`).
    :param container: the container, with its resource limits and requests as written.
    :param pod: the whole pod (annotations may change how resources are read).
    :returns: a `hami.model.ContainerRequest`, or None when the container asks for nothing of this kind.
    :raises hami.errors.RequestError: a value cannot be read; the message names the resource and the fix.
    """


@hookspec(firstresult=True)
def hami_admission_defaults(kind: DeviceKind, container: Container, pod: Pod, settings: Any) -> AdmissionEdit | None:
    """Apply the vendor's admission defaults to one container, or refuse the pod.

    Routed. Called by the admission webhook for every init and app container that mentions ``kind``'s
    resources, after `hami_container_request` accepted it. Applying the answer twice must give the same pod.

    :returns: an `hami.model.AdmissionEdit` (limits to set, env to add, pod annotations, runtime class, or
        ``deny`` with a reason), or None for no change.
    """


# --------------------------------------------------------------------------------------------------------
# Fitting and scoring (scheduler extender and simulator)
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
    settings: Any,
) -> list[NodeFit]:
    """Decide, for every candidate node at once, which devices would serve the pod's requests of ``kind``.

    Routed; one call per pod and vendor, whatever the number of nodes. The views carry current usage and
    the pods counted on each node (`NodeView.pods`, with their annotations), and must not be modified (the
    scheduler commits the chosen placement itself).

    :param requests: one entry per container, init containers first; None for containers without a
        request of this kind.
    :param nodes: the candidate nodes that have devices of this kind.
    :param policy: the node and device policies in force for this pod (cluster defaults overridden by the
        pod's annotations).
    :returns: one `hami.model.NodeFit` per node, in any order: a placement (one entry per container, with
        each device's granted memory and cores) or a reason a user can act on, such as
        ``"2/8 devices: insufficient memory"``. A placement must never exceed a device's free slots,
        memory or cores, and feasibility must not depend on the order devices are listed in. A fit may
        carry ``pod_annotations`` (the vendor's own keys): the scheduler writes them on the pod together
        with the placement when it chooses that node, and keeps them in the node's view for later fits.
        A kind whose fits are a function of the pod's spec, the policy and the node's view alone may say so
        (`DeviceKind.reusable_fits`): the scheduler then asks only for the nodes changed since a pod alike.
    """


@hookspec(firstresult=True)
def hami_score_nodes(
    kind: DeviceKind,
    pod: Pod,
    fits: Sequence[NodeFit],
    nodes: Mapping[str, NodeView],
    policy: SchedulingPolicy,
    settings: Any,
) -> Mapping[str, float] | None:
    """Score the feasible placements of ``kind`` under the node policy; higher is preferred.

    Routed; optional. When no vendor answers, the scheduler uses HAMi's node score
    (``10 × (used/count + usedcores/totalcores + usedmem/totalmem)`` after the placement, highest first
    for binpack, lowest first for spread).

    :param fits: the feasible fits returned by `hami_fit_nodes`.
    :param nodes: the same node views, by name.
    :returns: node name → score for every fit given, or None to use the default.
    """


# --------------------------------------------------------------------------------------------------------
# Allocation (node side, when the kubelet starts the container)
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def hami_allocate(
    kind: DeviceKind, pod: Pod, container_index: int, devices: ContainerPlacement, settings: Any
) -> Allocation | ContainerPlacement | None:
    """Make a recorded placement real on this node, e.g. create the partition a placement reserved.

    Routed; optional. Called by the node daemon inside the kubelet's Allocate, before
    `hami_container_edits`, serialized per node.

    :param pod: the pod as it is now, with the annotations the scheduler and earlier allocations wrote.
    :param container_index: the container's position (init containers first).
    :param devices: the devices the scheduler recorded for this container.
    :returns: an `hami.model.Allocation` (the placement to use from now on, with identifiers filled in, and
        pod annotations for the daemon to write, such as the identity of what was created), or a bare
        placement, or None to keep the recorded one.
    :raises hami.errors.HamiError: the placement cannot be made; the message is passed to the kubelet.
    """


@hookspec
def hami_release(kind: DeviceKind, pod: Pod, placements: Sequence[ContainerPlacement], settings: Any) -> None:
    """Undo what `hami_allocate` made for a pod that has finished or was deleted.

    Routed; optional. Called by the node daemon once per finished pod; must tolerate being called for a
    pod whose allocation was never made or was already released.
    """


@hookspec
def hami_reconcile(kind: DeviceKind, pods: Sequence[Pod], settings: Any) -> None:
    """After a restart of the node daemon: undo what `hami_allocate` made for pods that are no longer here.

    Routed; optional. Called once at the daemon's start, when it could list the pods, with every pod bound to
    this node that has not finished (pending ones included). Whatever `hami_allocate` made for a pod not in
    ``pods`` (deleted while the daemon was down, or left by an Allocate that died half-way) is to be undone;
    a pod's own annotations are not to be trusted for it (the pod's owner may have written them).
    """


@hookspec(firstresult=True)
def hami_simulated_devices(
    kind: DeviceKind, devices: Sequence[Device], driver: Mapping[str, Mapping[str, Any]], settings: Any
) -> None:
    """This node runs on simulated devices (`hami.node.simulated`): these are its devices of `kind`, and what
    the vendor's driver would say about each beyond its register entry.

    Routed, optional, node daemon only. Called every discovery round of a daemon with ``simulatedInventory``
    (which then calls no ``hami_discover_devices``), with the devices the inventory lists for this node. The
    vendor keeps them where its own discovery keeps what the driver reported, so that `hami_allocate` and
    `hami_container_edits` find the same facts as on real hardware, and asks no driver about them. A vendor
    whose edits need nothing but the register entry does not implement it.

    :param devices: the node's devices of `kind`, as the inventory lists them (unhealthy ones included).
    :param driver: device id → the inventory entry's ``driver`` facts for it (keys are the vendor's, documented
        in its README; an empty mapping when the entry gives none).
    :raises hami.errors.HamiError: a fact the vendor needs is missing or malformed; the message names the device
        and the key (the daemon logs it, naming the inventory file, and keeps serving the devices).
    """


# --------------------------------------------------------------------------------------------------------
# Dynamic Resource Allocation (node side, hami.dra)
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def hami_dra_device(kind: DeviceKind, device: Device, settings: Any) -> DraDevice | None:
    """The vendor's facts about one of its devices for the node's ResourceSlice: extra attributes (topology
    identifiers), and the share policy its fitting allows (whether the device is shared, the memory step or
    fixed partition sizes, the cores step).

    Routed; optional. Called by the node daemon when it publishes DRA devices (``draDriver`` set), for each
    healthy device discovery reported. Without an answer, core publishes what the `Device` says.

    :returns: a `hami.model.DraDevice`, or None for core's defaults.
    """


# --------------------------------------------------------------------------------------------------------
# Container edits (node side, the answer to the kubelet)
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def hami_container_edits(
    kind: DeviceKind,
    pod: Pod,
    container_index: int,
    devices: ContainerPlacement,
    settings: Any,
    library: IsolationLibrary | None,
) -> ContainerEdits:
    """What the kubelet must add to the container so it sees its devices and its isolation library.

    Routed. Called by the node daemon in Allocate with the container's (possibly allocated) placement.
    Must be deterministic: the same placement gives the same edits.

    :param library: this vendor's isolation library as the daemon installed it on the host (mount
        ``library.path`` at the same path and ``library.preload_path`` at ``/etc/ld.so.preload``), or None
        when none is installed (the vendor names none, its package ships none, or no daemon is involved).
    :returns: a `hami.model.ContainerEdits`: env (visible devices, memory and core limits), mounts (the
        isolation library, its ``/etc/ld.so.preload``, the shared accounting directory), device nodes, and
        CDI device names.
    """


# --------------------------------------------------------------------------------------------------------
# Outside Kubernetes (`hami run`, a process tree on the host)
# --------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def hami_device_processes(kind: DeviceKind, settings: Any) -> Sequence[DeviceProcess] | None:
    """The processes using this node's devices of `kind`, each with the device memory it holds.

    Routed, optional, node daemon only. The node-side backstop (`hami.node.backstop`) compares what the driver
    counts per process with what each container was granted: the driver's count cannot be changed from inside a
    container, so it catches what the in-process isolation library cannot (a static binary, raw device calls, a
    process that patched its own memory). Answer from the management library the vendor's device plugin uses
    (NVML's ``nvmlDeviceGetComputeRunningProcesses``); PIDs in the host's namespace, as those libraries give them.
    Answer for `kind`'s devices only (the daemon adds up the answers of every kind it serves), each process once per
    device with its memory on that device, in bytes, under the device's `Device.id`.

    :returns: the processes (an empty list when none), or None when the vendor cannot say this round.
    """


@hookspec(firstresult=True)
def hami_drm_usage_source(kind: DeviceKind, settings: Any) -> DrmUsageSource | None:
    """Where the kernel's DRM client statistics describe this node's devices of `kind`, and what in them counts.

    Routed, optional, node daemon only. For a vendor whose kernel driver is a DRM driver that publishes the
    per-client keys of Linux's ``Documentation/gpu/drm-usage-stats.rst`` in ``/proc/<pid>/fdinfo/<fd>``. The node
    daemon's backstop then reads the served containers' processes' open DRM files (`hami.drmfdinfo`): their memory in
    `memory_regions`, as the device's, where `hami_device_processes` answers None (the management library has no
    per-process memory), and the busy time of `engines`, as the devices' busy share the Node publishes. Answer only
    what your driver is known to publish (its documentation, or a check on the hardware): a region or engine the
    driver does not fill in reads as nothing used. Give the devices by their PCI address (sysfs's form, as
    ``drm-pdev`` names them) → `Device.id`; embed `hami.drmfdinfo.DrmFdinfo` in your settings to offer the same
    ``drmFdinfo`` options as the other vendors and build the answer with its ``source``.

    :returns: the source, or None where the vendor does not read fdinfo (not a DRM driver, turned off, no devices).
    """


@hookspec(firstresult=True)
def hami_device_readings(kind: DeviceKind, settings: Any) -> Sequence[DeviceReading] | None:
    """What the management library reads from this node's devices of `kind` now: memory in use, busy share, power,
    temperatures, the driver's version.

    Routed, optional, node daemon only. The node monitor (`hami.node.monitor`) asks at each scrape and exports the
    answers in HAMi's and HAMi-WebUI's device families (`hami_host_gpu_*`, `hami_memory_used`, `hami_core_util`,
    `hami_device_power`, `hami_device_temperature`), where the dashboard and the `usage` device policy read them.
    Answer from the library your device plugin uses (NVML's ``nvmlDeviceGetMemoryInfo``,
    ``nvmlDeviceGetUtilizationRates``, ``nvmlDeviceGetPowerUsage``, ``nvmlDeviceGetTemperature``), one reading per
    device under its `Device.id`, a figure the library cannot give left None. Pass figures on as read: the monitor
    shows nonsense (negative, above the device) as unknown. Keep it cheap: it runs at every scrape.

    :returns: the readings (an empty list when there are no devices), or None when the vendor cannot say this round.
    """


@hookspec(firstresult=True)
def hami_host_environment(
    kind: DeviceKind, devices: ContainerPlacement, indices: Sequence[int], settings: Any
) -> Mapping[str, str] | None:
    """The variables that make a process on the host, outside any container, see exactly `devices`, in order.

    Routed, optional. `hami run` calls it beside `hami_container_edits`: a container's runtime reads the
    container's visible-devices variable (``NVIDIA_VISIBLE_DEVICES``) and hides the other devices, while a host
    process sees every device unless the vendor's runtime is told otherwise (``CUDA_VISIBLE_DEVICES``). Device
    `i` of the answer must be device `i` of the placement, since the grant's limits are by that index.

    :param devices: the placement `hami run` made (device UUIDs and types from this vendor's discovery).
    :param indices: each device's index as this vendor's discovery reported it (`Device.index`).
    :returns: the variables, or None when a host process cannot be limited to these devices (then `hami run`
        refuses, saying so).
    """


# --------------------------------------------------------------------------------------------------------
# Diagnosis (`hami doctor`)
# --------------------------------------------------------------------------------------------------------


@hookspec
def hami_doctor_checks(settings: Any, grant: Grant | None) -> list[Finding]:
    """Check what this vendor needs on this node (or, with a `grant`, in this container) and say what to do.

    Broadcast: every vendor answers for itself; optional. `hami doctor` calls it after core's checks. On a node
    (`grant` None): the management library and tool found (path, version), the devices seen, the driver against
    what the isolation library hooks, the device nodes, the container runtime's configuration (CDI specification
    or runtime hook), the vendor's grant directories. In a container (`grant`: this vendor's grant, as the isolation
    library reads it from ``/etc/hami/grant/<vendor>.grant``): the memory the vendor's tool reports against it.
    Build each finding with `hami.vendorchecks` where one fits, so every vendor says the same thing the same
    way.

    :param grant: None on a node; in a container, the grant the isolation library reads.
    :returns: one `hami.findings.Finding` per check (ok, warning or failed, with the one thing to do). A
        missing driver, a tool printing something unexpected or a permission error is a finding, never an exception:
        the core turns an exception into a failed finding naming the vendor, and reports it as a bug.
    """
