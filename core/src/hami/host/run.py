"""``hami run``: one command, and every process it starts, under a vendor's isolation library with a grant.

Owns turning a request (vendor, devices, memory, cores, an optional share name) into what a container of that
vendor would get, and starting the command with it:

1. the vendor is a loaded plugin whose package ships its isolation library (`hami.node.hooklib.library_source`),
   installed under ``<state>/lib/<vendor>/`` exactly as the node daemon installs it (versioned file, stable
   symlink, preload file);
2. the devices are those the vendor's discovery reports on this host (`hami_discover_devices`), by index;
3. the vendor's own ``hami_container_edits`` is asked for a pod of its own (``hami-run/<name>``, a UID derived
   from the name) holding that placement: its grant, its accounting file, its preload and its environment, the
   very answer the kubelet would get;
4. mounts become host paths: the grant directory (mounted at ``/etc/hami/grant`` in a container) moves to
   ``<state>/grants/<name>/``, the accounting directory to ``<state>/accounting/<name>/``, and every variable
   that names a path inside a mount names the host path instead; the vendor's ``hami_host_environment`` adds
   what makes a host process see exactly those devices (a container's runtime does that from its
   visible-devices variable);
5. the preload: as root, the command gets a private mount namespace in which ``/etc/ld.so.preload`` names the
   library and ``/etc/hami/grant`` is the grant, both read-only (`hami.host.confine`), exactly a container's
   view; otherwise ``LD_PRELOAD`` and ``HAMI_ISOLATION_GRANT_DIR``, which a process tree inherits. Why not the
   host's own ``/etc/ld.so.preload``: it is read by every process on the host, so it would put the library (and
   one grant) into everything, not into one command.

``--share NAME`` names the grant and the accounting file, so that commands run with the same name are one
"container": one limit, which their processes share. A share keeps its files (``<state>/runs/<NAME>.json``
records it for ``hami host status``) and a second command must ask for the same vendor, devices and limits; an
unnamed run's files are removed when its command exits.

**Trust.** As root with ``--user USER`` the grant is root's (directories 0755, file 0644, outside anything the
user can write), the command runs as USER with ``no_new_privs``, cannot unmount or mount over the read-only
preload and grant (no capability, and no user namespace to gain one: the seccomp filter refuses it), so the
core's rules hold as in a container: the environment only lowers the grant, a grant that cannot be read fails
closed, a child that drops ``LD_PRELOAD`` still gets the library. Without root (or with ``--no-namespace``) the
grant and the preload are the command's own: its user owns the state directory and can rewrite the grant, and a
child that clears ``LD_PRELOAD`` runs without the library. That limits a user's own jobs (notebooks that
should not take a whole card by mistake); it confines no one, and ``hami run`` says so on stderr.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hami.errors import HamiError
from hami.isolation.grant import GRANT_DIR, write_files
from hami.model import Container, ContainerDevice, ContainerEdits, Device, IsolationLibrary, NodeInventory, Pod
from hami.node.hooklib import IsolationLibraries, library_source
from hami.plugins import LoadedVendor, VendorPlugins
from hami.quantity import memory_mib, parse_quantity
from hami.validation import describe, nearest

__all__ = [
    "PRELOAD_PATH",
    "RUN_NAMESPACE",
    "Launch",
    "RunRequest",
    "container_flags",
    "default_state_dir",
    "plan",
    "run",
]

log = logging.getLogger(__name__)

PRELOAD_PATH = "/etc/ld.so.preload"
RUN_NAMESPACE = "hami-run"
"""The namespace of the pods `hami run` asks the vendors' edits for (never a cluster's)."""
_UID_NAMESPACE = uuid.UUID("2b8f3c51-7d0e-4a9a-b6f4-3e1d5c7a9e20")
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"


class RunRequest(BaseModel):
    """What ``hami run`` was asked, validated (errors in `hami.validation`'s format, keyed by the flags)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    vendor: str = Field(alias="--vendor", pattern=r"^[a-z0-9][a-z0-9_-]*$")
    devices: tuple[int, ...] = Field(alias="--device", min_length=1, max_length=16)
    memory: int = Field(alias="--memory", ge=0, description="MiB per device; 0 = the whole device")
    cores: int = Field(default=0, alias="--cores", ge=0, le=100, description="percent of device time; 0 = all")
    share: str | None = Field(default=None, alias="--share")
    command: tuple[str, ...] = Field(default=(), alias="COMMAND", description="none: a grant for a container")

    @field_validator("share")
    @classmethod
    def _share(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(_NAME, value):
            raise ValueError(
                f"{value!r} is not a share name: 1-63 letters, digits, '.', '_' or '-', a letter or digit first"
            )
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or not value[0]:
            raise ValueError("no command: give it after --, e.g. hami run ... -- python train.py")
        return value

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, value: Any) -> Any:
        if isinstance(value, str):
            parts = [p.strip() for p in value.split(",")]
            if not all(p.isascii() and p.isdigit() for p in parts):
                raise ValueError(f"{value!r} is not a device index or a comma-separated list of them (e.g. 0 or 0,1)")
            if len(set(parts)) != len(parts):
                raise ValueError(f"{value!r} names a device twice")
            return tuple(int(p) for p in parts)
        return value

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.isascii() and text.isdigit():
                return int(text)
            problem = f"{value!r} is not a size: MiB (3000), or a quantity with a unit (3Gi)"
            try:
                if parse_quantity(text) < 0:
                    raise ValueError(problem)
                return memory_mib(text)
            except ValueError:
                raise ValueError(problem) from None
        return value


def parse_request(values: Mapping[str, Any]) -> RunRequest:
    """`values` keyed by flag (``--memory``: its text) as a `RunRequest`. :raises HamiError: what to fix."""
    try:
        return RunRequest.model_validate(dict(values))
    except ValidationError as exc:
        raise HamiError(describe(exc, RunRequest, "hami run")) from None


def default_state_dir() -> Path:
    """``/run/hami`` for root; the user's runtime directory (or ``/tmp/hami-<uid>``) otherwise."""
    if os.geteuid() == 0:
        return Path("/run/hami")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "hami" if runtime else Path(f"/tmp/hami-{os.geteuid()}")


@dataclass
class Launch:
    """Everything needed to start the command, and what to remove after it (an unnamed run)."""

    name: str
    vendor: str
    argv: tuple[str, ...]
    env: dict[str, str]
    library: Path
    """The library as installed (its stable name): what ``/etc/ld.so.preload`` or ``LD_PRELOAD`` names."""
    grant_dir: Path
    accounting_file: Path
    files: dict[str, str]
    record: dict[str, Any]
    shared: bool
    confined: bool
    user: pwd.struct_passwd | None
    state_dir: Path
    edits: ContainerEdits = field(default_factory=ContainerEdits)
    """The vendor's answer for a container, as a container engine would apply it (`container_flags`)."""
    moved: dict[str, str] = field(default_factory=dict)
    """Container path -> host path of the mounts the run owns (its grant and accounting directories)."""
    removable: list[Path] = field(default_factory=list)


def _vendor(plugins: VendorPlugins, name: str) -> LoadedVendor:
    names = [v.name for v in plugins.vendors]
    if name in names:
        return plugins.vendor(name)
    why = next((f"; it failed to load: {f.error}" for f in plugins.failed if f.entry_point == name), "")
    why = why or next((" (disabled by HAMI_DISABLED_VENDORS)" for d in plugins.disabled if d.entry_point == name), "")
    near = nearest(name, names)
    hint = f" (did you mean {near!r}?)" if near else ""
    raise HamiError(
        f"hami run: --vendor: no vendor plugin {name!r} is loaded{why}; loaded: {', '.join(names) or 'none'}{hint}"
    )


def _library(vendor: LoadedVendor) -> Path:
    name = vendor.info.isolation_library
    if not name:
        raise HamiError(
            f"hami run: --vendor: vendor {vendor.name} ships no isolation library (its own components enforce the "
            "share): nothing can hold a process to a limit outside its runtime"
        )
    source = library_source(vendor)
    if source is None:
        raise HamiError(
            f"hami run: --vendor: vendor {vendor.name} names isolation library {name} but its package "
            f"{vendor.distribution} holds no such file (reinstall it where a C compiler is available)"
        )
    return source


def _devices(plugins: VendorPlugins, vendor: LoadedVendor, wanted: Sequence[int]) -> list[tuple[NodeInventory, Device]]:
    inventories = plugins.discover().get(vendor.name, [])
    found = {device.index: (inventory, device) for inventory in inventories for device in inventory.devices}
    chosen = []
    for index in wanted:
        if index not in found:
            listed = ", ".join(f"{i} ({d.type or inv.kind} {d.id})" for i, (inv, d) in sorted(found.items()))
            seen = f"it found {listed}" if listed else "it found none (is the driver installed? see the log above)"
            raise HamiError(f"hami run: --device: vendor {vendor.name}'s discovery has no device {index} here; {seen}")
        chosen.append(found[index])
    kinds = {inventory.kind for inventory, _ in chosen}
    if len(kinds) > 1:
        raise HamiError(
            f"hami run: --device: the devices are of different kinds ({', '.join(sorted(kinds))}); "
            "one run uses devices of one kind"
        )
    return chosen


def _under(path: str, directory: str) -> str | None:
    """`path` relative to `directory` ("" for itself), or None when it is not inside it."""
    if path == directory:
        return ""
    prefix = directory.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else None


def _pod(name: str) -> Pod:
    return Pod(
        name=name,
        namespace=RUN_NAMESPACE,
        uid=str(uuid.uuid5(_UID_NAMESPACE, name)),
        containers=(Container(name="run"),),
    )


def plan(
    request: RunRequest,
    plugins: VendorPlugins,
    state_dir: Path,
    *,
    confined: bool,
    user: pwd.struct_passwd | None = None,
    environ: Mapping[str, str] | None = None,
) -> Launch:
    """What running `request` takes: the vendor's edits for it, moved to host paths under `state_dir`.
    Writes nothing. :raises HamiError: the vendor, a device, or the vendor's edits cannot serve the request."""
    vendor = _vendor(plugins, request.vendor)
    _library(vendor)
    chosen = _devices(plugins, vendor, request.devices)
    kind = chosen[0][0].kind
    for index, (_, device) in zip(request.devices, chosen, strict=True):
        if device.devmem and request.memory > device.devmem:
            raise HamiError(
                f"hami run: --memory: {request.memory} MiB is more than device {index} has ({device.devmem} MiB)"
            )
    cores_of = plugins.kind(kind).cores_on  # a kind counting compute units grants that share of them
    placement = tuple(
        ContainerDevice(uuid=d.id, type=kind, usedmem=request.memory, usedcores=cores_of(request.cores, d))
        for _, d in chosen
    )
    name = request.share or f"run-{os.getpid()}-{secrets.token_hex(3)}"
    libraries = IsolationLibraries(state_dir / "lib")
    folder = libraries.hook_dir / vendor.name
    stable = folder / Path(vendor.info.isolation_library or "").name
    library = IsolationLibrary(path=str(stable), preload_path=str(folder / "ld.so.preload"))
    edits = plugins.container_edits(kind, _pod(name), 0, placement, library)
    by_target = {m.container_path: m for m in edits.mounts}
    grant_mount, preload_mount = by_target.get(GRANT_DIR), by_target.get(PRELOAD_PATH)
    if grant_mount is None or preload_mount is None or not edits.accounting_file:
        missing = [
            what
            for what, ok in (
                ("grant", grant_mount),
                ("/etc/ld.so.preload", preload_mount),
                ("accounting file", edits.accounting_file),
            )
            if not ok
        ]
        raise HamiError(
            f"hami run: vendor {vendor.name}'s container edits give this placement no {' nor '.join(missing)} "
            "(a mode in which its own virtualization enforces the share?): configure the vendor's mode that uses "
            "its isolation library (see its README)"
        )
    accounting_mount = next(
        (m for m in edits.mounts if not m.read_only and _under(edits.accounting_file, m.host_path) is not None), None
    )
    if accounting_mount is None:
        raise HamiError(
            f"hami run: vendor {vendor.name}'s edits mount no directory holding its accounting file "
            f"{edits.accounting_file}"
        )
    grant_dir = state_dir / "grants" / name
    accounting_dir = state_dir / "accounting" / name
    accounting_file = accounting_dir / (_under(edits.accounting_file, accounting_mount.host_path) or "accounting")
    # where each mount's content is on this host: the two the run owns moved under the state directory
    moved = {GRANT_DIR: str(grant_dir), accounting_mount.container_path: str(accounting_dir)}
    targets = sorted(edits.mounts, key=lambda m: len(m.container_path), reverse=True)
    env = dict(environ if environ is not None else os.environ)
    for key, value in edits.env.items():
        for mount in targets:
            rest = _under(value, mount.container_path)
            if rest is not None:
                base = moved.get(mount.container_path, mount.host_path)
                value = str(PurePosixPath(base) / rest) if rest else base
                break
        env[key] = value
    visible = plugins.host_environment(kind, placement, [d.index for _, d in chosen])
    if visible is None:
        raise HamiError(
            f"hami run: vendor {vendor.name} does not say how a host process sees only the chosen "
            "devices (hook hami_host_environment), so their grant could not be held to them"
        )
    env.update(visible)
    files = {}
    for path, text in edits.files.items():
        rest = _under(path, grant_mount.host_path)
        if rest is None:
            raise HamiError(f"hami run: vendor {vendor.name}'s edits write {path}, outside its grant directory")
        files[str(grant_dir / rest)] = text
    env.pop("HAMI_ISOLATION_GRANT_DIR", None)
    if confined:
        env.pop("LD_PRELOAD", None)  # /etc/ld.so.preload names the library; the grant is at /etc/hami/grant
    else:
        env["LD_PRELOAD"] = " ".join([str(stable), *filter(None, [env.get("LD_PRELOAD", "")])])
        env["HAMI_ISOLATION_GRANT_DIR"] = str(grant_dir)
    record = {
        "name": name,
        "vendor": vendor.name,
        "kind": kind,
        "devices": [
            {"index": i, "uuid": d.id, "memory_mib": request.memory, "cores": request.cores}
            for i, (_, d) in zip(request.devices, chosen, strict=True)
        ],
        "grant_dir": str(grant_dir),
        "accounting_file": str(accounting_file),
        "library": str(stable),
        "user": user.pw_name if user is not None else pwd.getpwuid(os.geteuid()).pw_name,
        "shared": request.share is not None,
    }
    return Launch(
        name,
        vendor.name,
        request.command,
        env,
        stable,
        grant_dir,
        accounting_file,
        files,
        record,
        request.share is not None,
        confined,
        user,
        state_dir,
        edits,
        moved,
    )


def container_flags(launch: Launch) -> list[str]:
    """The vendor's edits as ``docker run`` (or ``podman run``) flags, with the run's grant and accounting
    directories at their host paths: a container started with them is one more member of the share."""
    flags = []
    for mount in launch.edits.mounts:
        host = launch.moved.get(mount.container_path, mount.host_path)
        flags.append(f"-v {host}:{mount.container_path}{':ro' if mount.read_only else ''}")
    flags += [f"--device {d.host_path}:{d.container_path}:{d.permissions}" for d in launch.edits.devices]
    flags += [f"--device {name}" for name in launch.edits.cdi_devices]
    flags += [f"-e {key}={value}" for key, value in sorted(launch.edits.env.items())]
    return flags


_COMPARED = ("vendor", "devices", "user")


def prepare(launch: Launch, plugins: VendorPlugins) -> None:
    """Write what the command needs before it starts: the library, the grant, the accounting directory, the
    record of the run. A share made before must have asked the same. :raises HamiError: it cannot be written."""
    state = launch.state_dir
    try:
        for directory in (state, state / "grants", state / "accounting", state / "runs", state / "lib"):
            directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        record_path = state / "runs" / f"{launch.name}.json"
        if launch.shared and record_path.exists():
            before = json.loads(record_path.read_text())
            differs = [k for k in _COMPARED if before.get(k) != launch.record.get(k)]
            if differs:
                raise HamiError(
                    f"hami run: --share: {launch.name} was made for {_summary(before)}, not {_summary(launch.record)}"
                    f" ({', '.join(differs)} differ): ask the same, or name another share"
                )
        IsolationLibraries(state / "lib").install(plugins.vendor(launch.vendor))
        write_files(launch.files)
        launch.accounting_file.parent.mkdir(mode=0o700, exist_ok=True)
        if launch.user is not None:
            os.chown(launch.accounting_file.parent, launch.user.pw_uid, launch.user.pw_gid)
        write_files({str(record_path): json.dumps(launch.record, indent=1) + "\n"})
    except OSError as exc:
        raise HamiError(f"hami run: cannot write under the state directory {state}: {exc}") from None
    if not launch.shared:
        launch.removable += [launch.grant_dir, launch.accounting_file.parent, record_path]


def _summary(record: Mapping[str, Any]) -> str:
    devices = record.get("devices") or []
    shown = ", ".join(f"device {d.get('index')} {d.get('memory_mib')} MiB {d.get('cores')}%" for d in devices)
    return f"{record.get('vendor')} {shown} as {record.get('user')}"


def _cleanup(launch: Launch) -> None:
    for path in launch.removable:
        with contextlib.suppress(OSError):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()


def run(launch: Launch) -> int:
    """Start the command, pass on SIGINT, SIGTERM and SIGHUP, wait; its exit status (128 + signal when killed)."""
    argv: list[str] = list(launch.argv)
    if launch.confined:
        from hami.host import confine

        spec = confine.Spec(
            library=str(launch.library),
            grant_dir=str(launch.grant_dir),
            stage=str(launch.state_dir / "stage" / f"{launch.name}-{os.getpid()}"),
            uid=launch.user.pw_uid if launch.user is not None else None,
            gid=launch.user.pw_gid if launch.user is not None else None,
            user=launch.user.pw_name if launch.user is not None else None,
        )
        launch.removable.append(Path(spec.stage))
        try:
            confine.stage(spec)
        except OSError as exc:
            _cleanup(launch)
            raise HamiError(f"hami run: cannot prepare the command's /etc/ld.so.preload and /etc/hami: {exc}") from None
        argv = [sys.executable, "-m", "hami.host.confine", spec.encode(), "--", *argv]
    elif launch.user is not None:
        raise HamiError("hami run: --user needs the private namespace (root, without --no-namespace)")
    try:
        child = subprocess.Popen(argv, env=launch.env)
    except OSError as exc:
        _cleanup(launch)
        raise HamiError(f"hami run: cannot start {launch.argv[0]}: {exc.strerror}") from None
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda number, _frame: child.send_signal(number)) for s in forwarded}
    try:
        status = child.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        _cleanup(launch)
    return 128 - status if status < 0 else status
