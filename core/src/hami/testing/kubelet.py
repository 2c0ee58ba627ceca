"""A fake kubelet for testing device plugins over real unix sockets: the node daemon, or a vendor's own.

`FakeKubelet` serves `v1beta1.Registration` on `kubelet.sock` in a device-plugin directory of its own (a
short temporary path: unix socket paths are limited to about 100 bytes), records every registration, and
then does what the kubelet does with a new plugin: connects to its socket, asks `GetDevicePluginOptions`, and
keeps a `ListAndWatch` stream open, remembering the latest device list per resource. `restart()` behaves like
a kubelet restart: the server stops, every socket in the directory is removed, and `kubelet.sock` is created
anew, so a plugin must listen again and register again.

`PluginClient` calls one plugin exactly as the kubelet does, and `FakeKubelet.start_container` runs the
kubelet's sequence for one container: choose healthy device IDs, `GetPreferredAllocation` when the plugin
offers it, `Allocate`, then `PreStartContainer` when the plugin asks for it.

    with FakeKubelet() as kubelet:
        ...start the plugin with --device-plugin-dir kubelet.directory...
        kubelet.wait_for_registration("nvidia.com/gpu")
        devices = kubelet.wait_for_devices("nvidia.com/gpu", lambda ds: len(ds) == 10)
        edits = kubelet.start_container("nvidia.com/gpu", count=1)

Synchronous on purpose (the gRPC server runs in its own threads), so plain pytest tests can use it.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from hami.model import ContainerEdits, DeviceNode, Mount
from hami.node.proto import deviceplugin_pb2 as pb
from hami.node.proto import deviceplugin_pb2_grpc as pb_grpc

__all__ = ["DeviceState", "FakeKubelet", "PluginCallError", "PluginClient", "Registration"]

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"


@dataclass(frozen=True)
class Registration:
    """One `Register` call the fake kubelet accepted; `generation` counts kubelet (re)starts from 1."""

    resource: str
    endpoint: str
    version: str
    pre_start_required: bool
    preferred_allocation: bool
    generation: int


@dataclass(frozen=True)
class DeviceState:
    """One device of a ListAndWatch list."""

    id: str
    healthy: bool
    numa: tuple[int, ...] = ()


class PluginCallError(Exception):
    """A plugin answered a call with an error status; `code` is the status name, `details` its message."""

    def __init__(self, method: str, code: str, details: str) -> None:
        self.method = method
        self.code = code
        self.details = details
        super().__init__(f"{method}: {code}: {details}")


def _states(response: pb.ListAndWatchResponse) -> list[DeviceState]:
    return [
        DeviceState(d.ID, d.health == "Healthy", tuple(int(n.ID) for n in d.topology.nodes)) for d in response.devices
    ]


def _edits(response: pb.ContainerAllocateResponse) -> ContainerEdits:
    return ContainerEdits(
        env=dict(response.envs),
        mounts=tuple(
            Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in response.mounts
        ),
        devices=tuple(
            DeviceNode(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in response.devices
        ),
        annotations=dict(response.annotations),
        cdi_devices=tuple(c.name for c in response.cdi_devices),
    )


class PluginClient:
    """The kubelet's side of one plugin's socket."""

    def __init__(self, socket_path: Path, timeout: float = 10.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        self._stub: Any = pb_grpc.DevicePluginStub(self._channel)

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            call: Any = exc  # the error raised by a call is also its grpc.Call, with code() and details()
            code = call.code().name if hasattr(call, "code") else "UNKNOWN"
            details = call.details() if hasattr(call, "details") else str(exc)
            raise PluginCallError(method, code, details or "") from None

    def options(self) -> pb.DevicePluginOptions:
        answer: pb.DevicePluginOptions = self._call("GetDevicePluginOptions", pb.Empty())
        return answer

    def list_and_watch(self) -> ListAndWatchStream:
        """Open a ListAndWatch stream; iterate it for device lists, `cancel()` it when done."""
        return ListAndWatchStream(self._stub.ListAndWatch(pb.Empty()))

    def preferred_allocation(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available), must_include_deviceIDs=list(must_include), allocation_size=size
                )
            ]
        )
        answer: pb.PreferredAllocationResponse = self._call("GetPreferredAllocation", request)
        return list(answer.container_responses[0].deviceIDs)

    def allocate(self, container_requests: Sequence[Sequence[str]]) -> list[ContainerEdits]:
        """Allocate for one or more containers (device IDs each); :raises PluginCallError: the plugin refused."""
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids)) for ids in container_requests]
        )
        answer: pb.AllocateResponse = self._call("Allocate", request)
        return [_edits(r) for r in answer.container_responses]

    def pre_start_container(self, device_ids: Sequence[str]) -> None:
        self._call("PreStartContainer", pb.PreStartContainerRequest(devices_ids=list(device_ids)))

    def close(self) -> None:
        self._channel.close()


class ListAndWatchStream:
    """An open ListAndWatch call."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __iter__(self) -> Iterator[list[DeviceState]]:
        try:
            for response in self._call:
                yield _states(response)
        except grpc.RpcError:
            return

    def cancel(self) -> None:
        self._call.cancel()


class _Watch:
    """The kubelet's ListAndWatch of one registered plugin, on a thread."""

    def __init__(self, kubelet: FakeKubelet, registration: Registration) -> None:
        self.kubelet = kubelet
        self.registration = registration
        self.client = PluginClient(kubelet.directory / registration.endpoint)
        self.stream: ListAndWatchStream | None = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"kubelet-watch-{registration.resource}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.kubelet._set_options(self.registration.resource, self.client.options())
            self.stream = self.client.list_and_watch()
            if self.stopped.is_set():
                self.stream.cancel()
            for devices in self.stream:
                self.kubelet._set_devices(self.registration.resource, devices, self)
        except PluginCallError as exc:
            log.warning("fake kubelet: plugin %s did not answer: %s", self.registration.resource, exc)
        finally:
            self.kubelet._stream_ended(self)

    def stop(self) -> None:
        self.stopped.set()
        if self.stream is not None:
            self.stream.cancel()
        self.thread.join(timeout=5)
        self.client.close()


class _RegistrationService:
    def __init__(self, kubelet: FakeKubelet, generation: int) -> None:
        self.kubelet = kubelet
        self.generation = generation

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:  # noqa: N802
        if request.version != API_VERSION:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"unsupported API version {request.version!r}; want {API_VERSION}"
            )
        if not request.resource_name or "/" not in request.resource_name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid resource name {request.resource_name!r}")
        registration = Registration(
            resource=request.resource_name,
            endpoint=request.endpoint,
            version=request.version,
            pre_start_required=request.options.pre_start_required,
            preferred_allocation=request.options.get_preferred_allocation_available,
            generation=self.generation,
        )
        self.kubelet._registered(registration)
        return pb.Empty()


class FakeKubelet:
    """A kubelet's device-manager side, on a device-plugin directory of its own."""

    def __init__(self, directory: Path | None = None, *, watch: bool = True) -> None:
        self._owns_directory = directory is None
        self.directory = directory or Path(
            tempfile.mkdtemp(prefix="kubelet-", dir="/tmp" if Path("/tmp").is_dir() else None)
        )
        self.socket_path = self.directory / "kubelet.sock"
        self.watch = watch
        self.registrations: list[Registration] = []
        self.generation = 0
        self._server: grpc.Server | None = None
        self._changed = threading.Condition()
        self._devices: dict[str, list[DeviceState]] = {}
        self._updates: dict[str, int] = {}
        self._options: dict[str, pb.DevicePluginOptions] = {}
        self._watches: dict[str, _Watch] = {}
        self._clients: dict[Path, PluginClient] = {}

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self) -> FakeKubelet:
        self.generation += 1
        self.directory.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-kubelet"))
        pb_grpc.add_RegistrationServicer_to_server(_RegistrationService(self, self.generation), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving and watching; remove the directory if the fake kubelet made it."""
        self._shut_down()
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def restart(self) -> None:
        """What a kubelet restart does to plugins: every socket removed, `kubelet.sock` created anew."""
        self._shut_down()
        for path in self.directory.iterdir():
            if path.is_socket():
                path.unlink()
        with self._changed:
            self._devices.clear()
            self._options.clear()
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self.start()

    def _shut_down(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        with self._changed:
            watches = list(self._watches.values())
            self._watches.clear()
        for w in watches:
            w.stop()

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------------------------- what plugins did

    def _registered(self, registration: Registration) -> None:
        with self._changed:
            self.registrations.append(registration)
            old = self._watches.pop(registration.resource, None)
            self._changed.notify_all()
        if old is not None:
            threading.Thread(target=old.stop, daemon=True).start()  # a re-registration replaces the stream
        if self.watch:
            watch = _Watch(self, registration)
            with self._changed:
                self._watches[registration.resource] = watch

    def _set_options(self, resource: str, options: pb.DevicePluginOptions) -> None:
        with self._changed:
            self._options[resource] = options
            self._changed.notify_all()

    def _set_devices(self, resource: str, devices: list[DeviceState], watch: _Watch) -> None:
        with self._changed:
            if self._watches.get(resource) not in (watch, None):
                return
            self._devices[resource] = devices
            self._updates[resource] = self._updates.get(resource, 0) + 1
            self._changed.notify_all()

    def _stream_ended(self, watch: _Watch) -> None:
        with self._changed:
            self._changed.notify_all()

    def _wait(self, ready: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                value = ready()
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"fake kubelet: {what} within {timeout} s")
                self._changed.wait(left)

    def wait_for_registration(
        self, resource: str, *, generation: int | None = None, timeout: float = 10.0
    ) -> Registration:
        """The latest registration of `resource` (with this kubelet `generation`, default the current one)."""
        want = self.generation if generation is None else generation

        def found() -> Registration | None:
            for r in reversed(self.registrations):
                if r.resource == resource and r.generation == want:
                    return r
            return None

        registration: Registration = self._wait(found, timeout, f"no registration of {resource} (generation {want})")
        return registration

    def devices(self, resource: str) -> list[DeviceState] | None:
        """The latest ListAndWatch list of `resource`, None before the first one."""
        with self._changed:
            return self._devices.get(resource)

    def updates(self, resource: str) -> int:
        """How many ListAndWatch lists of `resource` arrived so far (across streams)."""
        with self._changed:
            return self._updates.get(resource, 0)

    def options(self, resource: str) -> pb.DevicePluginOptions | None:
        with self._changed:
            return self._options.get(resource)

    def wait_for_devices(
        self,
        resource: str,
        predicate: Callable[[list[DeviceState]], bool] = lambda devices: True,
        *,
        timeout: float = 10.0,
    ) -> list[DeviceState]:
        """Wait until the latest list of `resource` satisfies `predicate`; returns it."""

        def ready() -> tuple[list[DeviceState]] | None:
            devices = self._devices.get(resource)
            return (devices,) if devices is not None and predicate(devices) else None  # an empty list is an answer

        result: tuple[list[DeviceState]] = self._wait(
            ready, timeout, f"the devices of {resource} did not get as expected"
        )
        return result[0]

    # ---------------------------------------------------------------------------------- calling plugins

    def client(self, resource: str) -> PluginClient:
        """A client for the plugin that registered `resource` last with this kubelet."""
        latest = [r for r in self.registrations if r.resource == resource and r.generation == self.generation]
        if not latest:
            raise LookupError(f"fake kubelet: no plugin registered {resource} with this kubelet")
        path = self.directory / latest[-1].endpoint
        client = self._clients.get(path)
        if client is None:
            client = self._clients[path] = PluginClient(path)
        return client

    def start_container(
        self, resource: str, count: int, *, device_ids: Sequence[str] | None = None, numa_node: int | None = None
    ) -> ContainerEdits:
        """The kubelet's calls for one container asking for `count` of `resource`; returns its edits.

        Device IDs are chosen among the healthy ones of the latest list (or given as `device_ids`); with
        `numa_node`, among those on that NUMA node only, as the Topology Manager (``single-numa-node``) offers
        them when it put the container's CPUs there. As the kubelet's device manager, it asks the plugin's
        `GetPreferredAllocation` only when there is a choice (more IDs offered than wanted).
        :raises PluginCallError: the plugin refused the allocation (or the preference: the kubelet then fails the
            pod's admission).
        """
        client = self.client(resource)
        options = self.options(resource) or client.options()
        ids = list(device_ids) if device_ids is not None else None
        if ids is None:
            healthy = [
                d.id for d in self.devices(resource) or [] if d.healthy and (numa_node is None or numa_node in d.numa)
            ]
            if len(healthy) < count:
                raise LookupError(f"fake kubelet: {resource} has {len(healthy)} healthy devices, {count} wanted")
            ids = healthy[:count]
            if options.get_preferred_allocation_available and len(healthy) > count:
                ids = client.preferred_allocation(healthy, [], count)
        edits = client.allocate([ids])
        if options.pre_start_required:
            client.pre_start_container(ids)
        return edits[0]
