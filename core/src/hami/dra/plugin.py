"""The DRA kubelet plugin: `NodePrepareResources` / `NodeUnprepareResources` on a unix socket, and the kubelet
plugin-registry handshake that makes the kubelet call them.

Two `grpc.aio` servers on the daemon's event loop:

* **registration**, on `<pluginRegistryDir>/<driver>-reg.sock`: the kubelet's plugin watcher finds the socket,
  calls `GetInfo` (type ``DRAPlugin``, the driver name, the service socket, supported version
  ``v1.DRAPlugin``) and reports the outcome through `NotifyRegistrationStatus`;
* **the DRA service**, on `<draPluginDir>/<driver>/dra.sock`.

Preparing a claim (in a worker thread, one claim at a time per node):

1. the claim is read from the API and must still have the UID the kubelet names (a recreated claim is another);
2. its allocated devices of this driver and node become placements (`hami.dra.claims`): the consumed memory and
   cores of a share, or the whole device;
3. each share must fit beside what the node's device-plugin pods and its other prepared claims hold
   (`hami.dra.claims.NodeUsage`): a device the scheduler extender gave to a pod is not prepared for a claim;
4. per device kind, the vendor's `hami_allocate` and `hami_container_edits` run for the claim (the claim stands
   for the pod: its name, namespace and UID, one container named ``claim``), the files the edits name (the
   grant) are written, and one CDI spec file carries the edits (`hami.dra.cdi`);
5. the answer names, per allocated device, its CDI device; it is recorded on the host
   (`<draPluginDir>/<driver>/claims/<UID>.json`) so a repeated call (the kubelet retries, the daemon restarts)
   gets the same answer without asking the vendor again, and unpreparing finds what to undo.

Unpreparing runs the vendor's `hami_release` with the recorded placements and removes the spec file, the
written files and the record; an unknown claim is already unprepared. Failures are per claim, in the answer's
``error``, as the kubelet expects; the RPC itself fails only on a bug.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from hami.cluster.port import Cluster, ClusterError, NotFoundError, meta
from hami.dra import cdi
from hami.dra.claims import ClaimError, ClaimShare, Served, claim_shares, pod_usage
from hami.dra.proto import dra_pb2 as pb
from hami.dra.proto import dra_pb2_grpc as pb_grpc
from hami.dra.proto import pluginregistration_pb2 as reg
from hami.dra.proto import pluginregistration_pb2_grpc as reg_grpc
from hami.dra.slices import PublishedDevice
from hami.errors import HamiError
from hami.isolation.grant import write_files
from hami.model import Container, ContainerDevice, ContainerEdits, ContainerPlacement, IsolationLibrary, Pod
from hami.plugins import VendorPlugins
from hami.signing import PlacementKeys, SignatureError

__all__ = ["PLUGIN_TYPE", "SUPPORTED_VERSIONS", "ClaimRef", "DraPlugin", "Prepared"]

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin",)
CLAIM_CONTAINER = "claim"


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None


@dataclass(frozen=True, slots=True)
class Prepared:
    """What preparing one claim made: the answer, and what unpreparing undoes."""

    claim: ClaimRef
    devices: tuple[PreparedDevice, ...]
    placements: Mapping[str, ContainerPlacement]
    """Kind → the claim's placement (after `hami_allocate`)."""
    annotations: Mapping[str, str]
    """The pod annotations the vendors' allocations returned (their release reads them)."""
    spec: str
    files: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "claim": [self.claim.namespace, self.claim.name, self.claim.uid],
            "devices": [[d.request, d.device, list(d.cdi_ids), d.share_id] for d in self.devices],
            "placements": {k: [d.model_dump() for d in p] for k, p in self.placements.items()},
            "annotations": dict(self.annotations),
            "spec": self.spec,
            "files": list(self.files),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Prepared:
        ns, name, uid = raw["claim"]
        return cls(
            ClaimRef(ns, name, uid),
            tuple(PreparedDevice(r, d, tuple(ids), s) for r, d, ids, s in raw["devices"]),
            {k: tuple(ContainerDevice(**d) for d in p) for k, p in raw["placements"].items()},
            dict(raw["annotations"]),
            str(raw["spec"]),
            tuple(raw["files"]),
        )


def claim_pod(claim: ClaimRef, annotations: Mapping[str, str] | None = None) -> Pod:
    """The pod the vendor hooks see for a claim: the claim's identity, one container."""
    return Pod(
        name=claim.name,
        namespace=claim.namespace,
        uid=claim.uid,
        annotations=dict(annotations or {}),
        containers=(Container(name=CLAIM_CONTAINER),),
    )


class DraPlugin:
    """The DRA driver's kubelet plugin for one node."""

    def __init__(
        self,
        cluster: Cluster,
        plugins: VendorPlugins,
        node: str,
        driver: str,
        devices: Callable[[], Mapping[str, PublishedDevice]],
        *,
        plugin_dir: Path,
        registry_dir: Path,
        cdi_dir: Path,
        library_of: Callable[[str], IsolationLibrary | None] | None = None,
        served: Callable[[], Iterable[Served]] | None = None,
        placement_keys: PlacementKeys | None = None,
    ) -> None:
        self.cluster = cluster
        self.plugins = plugins
        self.node = node
        self.driver = driver
        self.devices = devices
        """Device name → what it stands for, as the node's slice publishes it now."""
        self.library_of = library_of or (lambda vendor: None)
        self.served = served or (lambda: ())
        """The containers the node daemon served (its own record, `hami.node.pods`), counted before annotations."""
        self.placement_keys = placement_keys
        """With keys, a pod not served yet counts by its signed placement, not by what its owner wrote."""
        self.socket_path = plugin_dir / driver / "dra.sock"
        self.registration_path = registry_dir / f"{driver}-reg.sock"
        self.state_dir = plugin_dir / driver / "claims"
        self.cdi_dir = cdi_dir
        self.registered = False
        self.registration_error = ""
        self._serial = threading.Lock()
        self._servers: list[grpc.aio.Server] = []
        self._inodes: dict[Path, int] = {}

    # ---------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Serve the DRA service, then the registration socket (the kubelet calls the service once registered)."""
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.registration_path.parent.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for path, servicer in ((self.socket_path, DraService(self)), (self.registration_path, Registration(self))):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            server = grpc.aio.server()
            if isinstance(servicer, DraService):
                pb_grpc.add_DRAPluginServicer_to_server(servicer, server)
            else:
                reg_grpc.add_RegistrationServicer_to_server(servicer, server)
            server.add_insecure_port(f"unix://{path}")
            await server.start()
            self._servers.append(server)
            self._inodes[path] = os.stat(path).st_ino
        log.info("DRA driver %s: serving on %s, registering through %s", self.driver, self.socket_path,
                 self.registration_path)  # fmt: skip

    async def stop(self, grace: float | None = None) -> None:
        servers, self._servers = self._servers, []
        await asyncio.gather(*(s.stop(grace) for s in servers), return_exceptions=True)
        for path in list(self._inodes):
            if self._present(path):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        self._inodes.clear()
        self.registered = False

    def _present(self, path: Path) -> bool:
        try:
            return os.stat(path).st_ino == self._inodes.get(path)
        except FileNotFoundError:
            return False

    @property
    def serving(self) -> bool:
        return bool(self._servers)

    async def ensure_listening(self) -> None:
        """Listen again when a socket was removed (the kubelet cleans its plugin directories when it restarts)."""
        if self.serving and all(self._present(p) for p in (self.socket_path, self.registration_path)):
            return
        if self.serving:
            log.info("a socket of DRA driver %s was removed: listening again", self.driver)
            await self.stop(grace=0)
        await self.start()

    # ---------------------------------------------------------------------------------- records

    def _record_path(self, uid: str) -> Path:
        return self.state_dir / f"{cdi.safe_name(uid)}.json"

    def _load(self, uid: str) -> Prepared | None:
        try:
            return Prepared.from_json(json.loads(self._record_path(uid).read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("DRA record of claim %s is unreadable (%s); preparing it again", uid, exc)
            return None

    def prepared(self) -> list[Prepared]:
        """Every claim prepared on this node, from the records."""
        out = []
        for path in sorted(self.state_dir.glob("*.json")):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                out.append(Prepared.from_json(json.loads(path.read_text())))
        return out

    def _save(self, prepared: Prepared) -> None:
        path = self._record_path(prepared.claim.uid)
        write_files({str(path): json.dumps(prepared.to_json(), sort_keys=True)})

    # ---------------------------------------------------------------------------------- prepare

    def prepare(self, claim: ClaimRef) -> Prepared:
        """Prepare one claim (see the module's doc). :raises ClaimError: with the reason for the kubelet."""
        with self._serial:
            done = self._load(claim.uid)
            if done is not None:
                return done
            try:
                obj = self.cluster.get("resourceclaims", claim.name, claim.namespace)
            except NotFoundError:
                raise ClaimError(f"claim {claim.namespace}/{claim.name} does not exist") from None
            except ClusterError as exc:
                raise ClaimError(f"cannot read claim {claim.namespace}/{claim.name}: {exc}") from None
            if meta(obj).get("uid") != claim.uid:
                raise ClaimError(
                    f"claim {claim.namespace}/{claim.name} has UID {meta(obj).get('uid')}, not {claim.uid}: "
                    "it was deleted and created again"
                )
            devices = self.devices()
            shares = claim_shares(obj, self.driver, self.node, devices)
            self._check_free(claim, shares, devices)
            return self._make(claim, shares)

    def _check_free(
        self, claim: ClaimRef, shares: Sequence[ClaimShare], devices: Mapping[str, PublishedDevice]
    ) -> None:
        try:
            pods, _ = self.cluster.list("pods")
        except ClusterError as exc:
            raise ClaimError(f"cannot read the pods of node {self.node} to check the claim's devices: {exc}") from None
        usage = pod_usage(self.plugins, pods, self.node, served=self.served(), authentic=self._authentic)
        for other in self.prepared():
            for placement in other.placements.values():
                usage.add(f"claim {other.claim.namespace}/{other.claim.name}", placement)
        for share in shares:
            reason = usage.refusal(share, devices[share.device])
            if reason is not None:
                raise ClaimError(f"claim {claim.namespace}/{claim.name}: {reason}")
            usage.add(f"claim {claim.namespace}/{claim.name}", (share.placement,))

    def _authentic(self, annotations: Mapping[str, str], uid: str) -> Mapping[str, str]:
        if self.placement_keys is None:
            return annotations
        try:
            return {**annotations, **self.placement_keys.verify(annotations, uid, self.node).annotations}
        except SignatureError:
            return annotations  # an unsigned pod is not served by the daemon under signing; it holds what it says

    def _make(self, claim: ClaimRef, shares: Sequence[ClaimShare]) -> Prepared:
        by_kind: dict[str, list[ClaimShare]] = {}
        for share in shares:
            by_kind.setdefault(share.kind, []).append(share)
        annotations: dict[str, str] = {}
        placements: dict[str, ContainerPlacement] = {}
        specs: dict[str, ContainerEdits] = {}
        cdi_ids: dict[str, tuple[str, ...]] = {}
        files: list[str] = []
        try:
            for kind, group in sorted(by_kind.items()):
                pod = claim_pod(claim, annotations)
                allocation = self.plugins.allocate(kind, pod, 0, tuple(s.placement for s in group))
                placements[kind] = allocation.devices
                annotations.update(allocation.pod_annotations)
                pod = claim_pod(claim, annotations)
                library = self.library_of(self.plugins.owner(kind).name)
                edits = self.plugins.container_edits(kind, pod, 0, allocation.devices, library)
                try:
                    write_files(edits.files)
                except OSError as exc:
                    raise ClaimError(f"cannot write {exc.filename} for claim {claim.name}: {exc.strerror}") from None
                files.extend(edits.files)
                name = cdi.cdi_device_name(claim.uid, kind)
                specs[name] = edits
                cdi_ids[kind] = (f"{cdi.cdi_kind(self.driver)}={name}", *edits.cdi_devices)
            spec = cdi.spec_path(self.cdi_dir, self.driver, claim.uid)
            try:
                cdi.write_spec(spec, self.driver, specs)
            except OSError as exc:
                raise ClaimError(f"cannot write the CDI spec {spec}: {exc.strerror}") from None
        except BaseException as exc:
            self._undo(claim, placements, annotations, files)
            if isinstance(exc, ClaimError):
                raise
            if isinstance(exc, HamiError):
                raise ClaimError(f"claim {claim.namespace}/{claim.name}: {exc}") from None
            raise
        prepared = Prepared(
            claim,
            tuple(PreparedDevice(s.request, s.device, cdi_ids[s.kind], s.share_id) for s in shares),
            placements,
            annotations,
            str(spec),
            tuple(files),
        )
        try:
            self._save(prepared)
        except OSError as exc:
            self._undo(claim, placements, annotations, files)
            cdi.remove_spec(spec)
            raise ClaimError(f"cannot record claim {claim.name} under {self.state_dir}: {exc.strerror}") from None
        given = ", ".join(f"{s.device} {s.placement.usedmem} MiB {s.placement.usedcores}%" for s in shares)
        log.info("prepared claim %s/%s: %s", claim.namespace, claim.name, given)
        return prepared

    def _undo(
        self, claim: ClaimRef, placements: Mapping[str, ContainerPlacement], annotations: Mapping[str, str],
        files: Sequence[str],
    ) -> None:  # fmt: skip
        pod = claim_pod(claim, annotations)
        for kind, placement in placements.items():
            try:
                self.plugins.release(kind, pod, [placement])
            except Exception:
                log.exception("releasing the %s devices of claim %s/%s failed", kind, claim.namespace, claim.name)
        for name in files:
            with contextlib.suppress(OSError):
                Path(name).unlink()

    # ---------------------------------------------------------------------------------- unprepare

    def unprepare(self, claim: ClaimRef) -> None:
        """Undo what preparing the claim made; a claim never prepared here is already unprepared."""
        with self._serial:
            done = self._load(claim.uid)
            if done is None:
                return
            self._undo(done.claim, done.placements, done.annotations, done.files)
            cdi.remove_spec(Path(done.spec))
            with contextlib.suppress(FileNotFoundError):
                self._record_path(claim.uid).unlink()
            log.info("unprepared claim %s/%s", claim.namespace, claim.name)


def _ref(claim: pb.Claim) -> ClaimRef:
    return ClaimRef(claim.namespace, claim.name, claim.uid)


class DraService(pb_grpc.DRAPluginServicer):  # type: ignore[misc]
    """The kubelet's DRA v1 service, answering per claim."""

    def __init__(self, plugin: DraPlugin) -> None:
        self.plugin = plugin

    def _prepare(self, claims: Sequence[pb.Claim]) -> pb.NodePrepareResourcesResponse:
        response = pb.NodePrepareResourcesResponse()
        for claim in claims:
            answer = response.claims[claim.uid]
            try:
                done = self.plugin.prepare(_ref(claim))
            except ClaimError as exc:
                log.warning("not preparing claim %s/%s: %s", claim.namespace, claim.name, exc)
                answer.error = str(exc)
                continue
            except Exception as exc:
                log.exception("preparing claim %s/%s failed", claim.namespace, claim.name)
                answer.error = f"internal error in the HAMi node daemon: {exc!r}"
                continue
            for d in done.devices:
                device = answer.devices.add(
                    request_names=[d.request] if d.request else [], pool_name=self.plugin.node,
                    device_name=d.device, cdi_device_ids=list(d.cdi_ids),
                )  # fmt: skip
                if d.share_id:
                    device.share_id = d.share_id
        return response

    def _unprepare(self, claims: Sequence[pb.Claim]) -> pb.NodeUnprepareResourcesResponse:
        response = pb.NodeUnprepareResourcesResponse()
        for claim in claims:
            answer = response.claims[claim.uid]
            try:
                self.plugin.unprepare(_ref(claim))
            except Exception as exc:
                log.exception("unpreparing claim %s/%s failed", claim.namespace, claim.name)
                answer.error = f"cannot unprepare claim {claim.namespace}/{claim.name}: {exc!r}"
        return response

    async def NodePrepareResources(  # noqa: N802 - gRPC method names
        self, request: pb.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.NodePrepareResourcesResponse:
        return await asyncio.to_thread(self._prepare, list(request.claims))

    async def NodeUnprepareResources(  # noqa: N802
        self, request: pb.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.NodeUnprepareResourcesResponse:
        return await asyncio.to_thread(self._unprepare, list(request.claims))


class Registration(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    """The kubelet plugin watcher's handshake: who we are, where the service is, and the watcher's verdict."""

    def __init__(self, plugin: DraPlugin) -> None:
        self.plugin = plugin

    async def GetInfo(  # noqa: N802
        self, request: reg.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.plugin.driver,
            endpoint=str(self.plugin.socket_path),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    async def NotifyRegistrationStatus(  # noqa: N802
        self, request: reg.RegistrationStatus, context: grpc.aio.ServicerContext[Any, Any]
    ) -> reg.RegistrationStatusResponse:
        self.plugin.registered = request.plugin_registered
        self.plugin.registration_error = request.error
        if request.plugin_registered:
            log.info("the kubelet registered DRA driver %s", self.plugin.driver)
        else:
            log.error("the kubelet refused DRA driver %s: %s", self.plugin.driver, request.error)
        return reg.RegistrationStatusResponse()
