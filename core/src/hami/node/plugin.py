"""One device-plugin gRPC server: one extended resource on one unix socket, served with `grpc.aio`.

ListAndWatch follows the shape of gRPC's own health service: the plugin keeps the current device list and
a version number under an `asyncio.Condition`; each stream sends the full list when it opens, then waits on
the condition and sends again only when the version moved, so a health change reaches the kubelet at once
and an unchanged discovery sends nothing. Stopping the plugin wakes every stream and ends it.

GetPreferredAllocation answers from the device list alone (`preferred_ids`), or, for the count resource of a
daemon given a `prefer` function, from what that function finds of the pod being started (`hami.node.preferred`:
``hami.io/numa-alignment``), run in a worker thread like Allocate; a `MisalignedError` becomes the RPC's error,
which the kubelet reports on the pod.

Allocate runs the blocking allocation (cluster reads and writes, vendor hooks) in a worker thread so the event
loop keeps serving other plugins' streams; `hami.node.allocate` serializes allocations per node. An
`AllocationError` becomes the RPC's error status with its message, which the kubelet reports on the pod.

Everything here runs on the daemon's event loop; `set_devices` must be called from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

import grpc

from hami.model import ContainerEdits
from hami.node.allocate import AllocationError
from hami.node.devices import AdvertisedDevice, PreferredRequest, ResourceRole, ServedResource, preferred_ids
from hami.node.preferred import MisalignedError
from hami.node.proto import deviceplugin_pb2 as pb
from hami.node.proto import deviceplugin_pb2_grpc as pb_grpc

__all__ = ["AllocateFunction", "PreferFunction", "ResourcePlugin", "to_response"]

log = logging.getLogger(__name__)

AllocateFunction = Callable[[str, Sequence[Sequence[str]]], list[ContainerEdits]]
"""(device kind, device IDs per container request) → edits per container; raises `AllocationError`."""

PreferFunction = Callable[[str, Sequence["PreferredRequest"], Mapping[str, AdvertisedDevice]], list[list[str] | None]]
"""(device kind, the kubelet's container requests, advertised ID → device) → per request the IDs to prefer, or None
for the daemon's own answer (`preferred_ids`); raises `MisalignedError` to refuse (`hami.node.preferred`)."""

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


def to_response(edits: ContainerEdits) -> pb.ContainerAllocateResponse:
    """A vendor's container edits as the kubelet's `ContainerAllocateResponse`."""
    return pb.ContainerAllocateResponse(
        envs=dict(edits.env),
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in edits.mounts
        ],
        devices=[
            pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in edits.devices
        ],
        annotations=dict(edits.annotations),
        cdi_devices=[pb.CDIDevice(name=name) for name in edits.cdi_devices],
    )


def _device(d: AdvertisedDevice) -> pb.Device:
    device = pb.Device(ID=d.id, health=HEALTHY if d.healthy else UNHEALTHY)
    if d.numa >= 0:
        device.topology.nodes.append(pb.NUMANode(ID=d.numa))
    return device


class ResourcePlugin:
    """The device-plugin server of one resource: its socket, its device list, its streams."""

    def __init__(
        self,
        resource: ServedResource,
        directory: Path,
        allocate: AllocateFunction,
        prefer: PreferFunction | None = None,
    ) -> None:
        self.resource = resource
        self.socket_path = directory / resource.socket_name
        self.allocate_function = allocate
        self.prefer_function = prefer if resource.role == ResourceRole.COUNT else None
        self.devices: tuple[AdvertisedDevice, ...] = ()
        self._physical: Mapping[str, str] = {}
        self._version = 0
        self._stopping = False
        self._changed = asyncio.Condition()
        self._server: grpc.aio.Server | None = None
        self._inode: int | None = None
        self.streams = 0
        """ListAndWatch streams open now."""

    # ---------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Listen on the socket (replacing a stale file of the same name)."""
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._stopping = False
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        self._inode = os.stat(self.socket_path).st_ino
        log.info("serving %s on %s", self.resource.name, self.socket_path)

    async def stop(self, grace: float | None = None) -> None:
        """End the streams, stop serving (in-flight calls get `grace` seconds), remove our socket file."""
        async with self._changed:
            self._stopping = True
            self._changed.notify_all()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        if self.socket_present:
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        self._inode = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    @property
    def socket_present(self) -> bool:
        """True while the socket file this server created is still there (the kubelet removes it on restart)."""
        try:
            return self._inode is not None and os.stat(self.socket_path).st_ino == self._inode
        except FileNotFoundError:
            return False

    async def set_devices(self, devices: Sequence[AdvertisedDevice]) -> bool:
        """Replace the device list; open streams send it when it differs. True when it changed."""
        new = tuple(devices)
        if new == self.devices:
            return False
        async with self._changed:
            self.devices = new
            self._physical = {d.id: d.device for d in new}
            self._version += 1
            self._changed.notify_all()
        return True

    def options(self) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    # ---------------------------------------------------------------------------------- the service

    async def GetDevicePluginOptions(  # noqa: N802 - gRPC method names
        self, request: pb.Empty, context: grpc.aio.ServicerContext[pb.Empty, pb.DevicePluginOptions]
    ) -> pb.DevicePluginOptions:
        return self.options()

    async def ListAndWatch(  # noqa: N802
        self, request: pb.Empty, context: grpc.aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse]
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        sent = -1
        self.streams += 1
        try:
            while True:
                async with self._changed:
                    while not self._stopping and self._version == sent:
                        await self._changed.wait()
                    if self._stopping:
                        return
                    sent, devices = self._version, self.devices
                yield pb.ListAndWatchResponse(devices=[_device(d) for d in devices])
        finally:
            self.streams -= 1

    async def GetPreferredAllocation(  # noqa: N802
        self,
        request: pb.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse],
    ) -> pb.PreferredAllocationResponse:
        requests = [
            PreferredRequest(list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size)
            for r in request.container_requests
        ]
        preferred: list[list[str] | None] = [None] * len(requests)
        if self.prefer_function is not None:
            by_id = {d.id: d for d in self.devices}
            try:
                preferred = await asyncio.to_thread(self.prefer_function, self.resource.kind, requests, by_id)
            except MisalignedError as exc:
                log.warning("GetPreferredAllocation of %s refused: %s", self.resource.name, exc)
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            except Exception:  # a preference is never worth failing the pod for
                log.exception("GetPreferredAllocation of %s: answering from the device list", self.resource.name)
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=ids
                    if ids is not None
                    else preferred_ids(r.available, r.must_include, r.size, self._physical)
                )
                for r, ids in zip(requests, preferred, strict=True)
            ]
        )

    async def Allocate(  # noqa: N802
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse]
    ) -> pb.AllocateResponse:
        requests = [list(r.devices_ids) for r in request.container_requests]
        if self.resource.role != ResourceRole.COUNT:  # the count resource's Allocate serves the container
            return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse() for _ in requests])
        try:
            edits = await asyncio.to_thread(self.allocate_function, self.resource.kind, requests)
        except AllocationError as exc:
            log.warning("Allocate of %s refused: %s", self.resource.name, exc)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except Exception as exc:  # the allocator answers every failure itself; this is a bug
            log.exception("Allocate of %s failed", self.resource.name)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in the HAMi node daemon: {exc!r}")
        return pb.AllocateResponse(container_responses=[to_response(e) for e in edits])

    async def PreStartContainer(  # noqa: N802
        self,
        request: pb.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[pb.PreStartContainerRequest, pb.PreStartContainerResponse],
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()
