"""The container's grant: the limits the node daemon decided at Allocate, in the file the isolation library reads.

Owns the grant's format (``GRANT.md`` beside this module documents it; ``grant.c`` is the library's reader) and
its writer on the node side. A vendor's container edits build a `Grant` from the placement and call
`grant_edits`: it names the file the node daemon writes (``ContainerEdits.files``: root-owned, written before
the kubelet gets its answer) and the read-only mount of its directory at `GRANT_DIR`, where the library reads it
before the environment. While that directory exists in a container the library expects a grant and fails closed
without one; the environment may only lower what it grants.
"""

from __future__ import annotations

import os
import re
import struct
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from hami.model import Mount

__all__ = [
    "CONTROL_SIZE",
    "GRANT_DIR",
    "PIDS_FILE",
    "POLICIES",
    "DeviceGrant",
    "Grant",
    "GrantError",
    "from_limits",
    "grant_edits",
    "grant_host_dir",
    "parse",
    "render_pid_map",
    "set_grant_control",
    "write_files",
    "write_pid_map",
]

GRANT_DIR = "/etc/hami/grant"
"""Where every container with an isolation library sees its grant directory (``HAMI_ISO_GRANT_DIR`` in C)."""
PIDS_FILE = "pids"
"""The node daemon's map of the container's device processes to their host pids, in the grant directory (GRANT.md)."""
POLICIES = ("default", "force", "disable")
MAX_DEVICES = 16
CONTROL_SIZE = MAX_DEVICES * 16
"""``<vendor>.control``: per device a u32 mode (0 none, 1 lift, 2 yield), 4 bytes padding, a u64 CLOCK_REALTIME
deadline (little-endian), the node daemon's control words for a container with a grant (GRANT.md)."""
_UUID = re.compile(r"[!-~]{1,63}")
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,15}")


class GrantError(ValueError):
    """A grant that cannot be written or read (says which field and why)."""


@dataclass(frozen=True)
class DeviceGrant:
    memory_bytes: int  # 0 = the whole device
    cores: int  # percent of device time; 0 or 100 = the whole device
    uuid: str = ""


@dataclass(frozen=True)
class Grant:
    devices: tuple[DeviceGrant, ...]
    policy: str = "default"
    priority: int = 1  # 0 high, 1 normal (HAMi's CUDA_TASK_PRIORITY)
    oversubscribe: bool = False
    context_bytes: int = 0  # what the driver reserves per process and device for a context, counted (0: nothing)

    def render(self) -> str:
        """The file's text (``GRANT.md``). :raises GrantError: a field the library could not read back."""
        if not 1 <= len(self.devices) <= MAX_DEVICES:
            raise GrantError(f"a grant lists 1 to {MAX_DEVICES} devices, not {len(self.devices)}")
        if self.policy not in POLICIES:
            raise GrantError(f"policy {self.policy!r} is not one of {', '.join(POLICIES)}")
        if not 0 <= self.priority <= 1000:
            raise GrantError(f"priority {self.priority} is not within 0-1000")
        lines = ["hami-grant 1", f"policy {self.policy}", f"priority {self.priority}",
                 f"oversubscribe {int(self.oversubscribe)}"]  # fmt: skip
        if not 0 <= self.context_bytes < 1 << 64:
            raise GrantError(f"context {self.context_bytes} is not a byte count")
        if self.context_bytes:
            lines.append(f"context {self.context_bytes}")
        for i, device in enumerate(self.devices):
            if not 0 <= device.memory_bytes < 1 << 64:
                raise GrantError(f"device {i}: memory {device.memory_bytes} is not a byte count")
            if not 0 <= device.cores <= 100:
                raise GrantError(f"device {i}: cores {device.cores} is not a percentage")
            if device.uuid and not _UUID.fullmatch(device.uuid):
                raise GrantError(f"device {i}: UUID {device.uuid!r} is not 1-63 printable characters")
            uuid = f" {device.uuid}" if device.uuid else ""
            lines.append(f"device {i} {device.memory_bytes} {device.cores}{uuid}")
        lines.append("end")
        return "\n".join(lines) + "\n"


def parse(text: str) -> Grant:
    """Read a grant as the library does (the same rules as ``grant.c``). :raises GrantError: why it is not one."""
    lines = [(n, line.replace("\t", " ").split(" ")) for n, line in enumerate(text.split("\n"), 1)]
    lines = [(n, [w for w in words if w]) for n, words in lines]  # words as grant.c reads them: only " " and tab
    words = [(n, w) for n, w in lines if w and not w[0].startswith("#")]
    if not words or words[0][1] != ["hami-grant", "1"]:
        raise GrantError("not 'hami-grant 1' (a grant of another version or no grant)")
    policy, priority, oversubscribe, ended, context = "default", 1, False, False, 0
    devices: list[DeviceGrant] = []
    for n, w in words[1:]:
        if ended:
            raise GrantError(f"line {n}: text after 'end'")
        key, values = w[0], w[1:]
        if key == "policy" and len(values) == 1 and values[0] in POLICIES:
            policy = values[0]
        elif key == "priority" and len(values) == 1 and _number(values[0], 1000) is not None:
            priority = int(values[0])
        elif key == "oversubscribe" and len(values) == 1 and values[0] in ("0", "1"):
            oversubscribe = values[0] == "1"
        elif key == "context" and len(values) == 1 and (number := _number(values[0], (1 << 64) - 1)) is not None:
            context = number
        elif key == "device" and len(values) in (3, 4):
            index, memory, cores = (_number(values[0], MAX_DEVICES - 1), _number(values[1], (1 << 64) - 1),
                                    _number(values[2], 100))  # fmt: skip
            if index is None or memory is None or cores is None or (len(values) == 4 and len(values[3]) > 63):
                raise GrantError(f"line {n}: '{key}' is not a grant line (GRANT.md)")
            if index != len(devices):
                raise GrantError(f"line {n}: device {index} where device {len(devices)} was due")
            devices.append(DeviceGrant(memory, cores, values[3] if len(values) == 4 else ""))
        elif key == "end" and not values:
            ended = True
        else:
            raise GrantError(f"line {n}: '{key}' is not a grant line (GRANT.md)")
    if not devices:
        raise GrantError("no device")
    if not ended:
        raise GrantError("incomplete (no 'end' line)")
    return Grant(tuple(devices), policy, priority, oversubscribe, context)


def _number(text: str, high: int) -> int | None:
    if not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if value <= high else None


def grant_edits(host_dir: PurePosixPath, vendor: str, grant: Grant) -> tuple[Mount, dict[str, str]]:
    """The read-only mount of `host_dir` at `GRANT_DIR` and the files to write there (``<vendor>.grant`` and its
    control words, ``<vendor>.control``, none set), for ``ContainerEdits.mounts`` and ``.files``. `host_dir` must
    be the container's own and outside any directory mounted writable into it."""
    if not _NAME.fullmatch(vendor):
        raise GrantError(f"vendor name {vendor!r} is not a short lower-case name")
    files = {
        str(host_dir / f"{vendor}.grant"): grant.render(),
        str(host_dir / f"{vendor}.control"): "\0" * CONTROL_SIZE,
    }
    return Mount(container_path=GRANT_DIR, host_path=str(host_dir)), files


def grant_host_dir(mounts: Sequence[Mount]) -> str | None:
    """The host directory of a container's grant, from its container edits' mounts (the read-only one at
    `GRANT_DIR`); None when the container has none."""
    return next((m.host_path for m in mounts if m.container_path == GRANT_DIR and m.read_only), None)


def render_pid_map(entries: Sequence[tuple[int, int, int]]) -> str:
    """The ``pids`` file's text: one ``<container pid> <host pid> <pid namespace inode>`` line per entry, sorted,
    so the same processes give the same text."""
    return "".join(f"{inner} {host} {namespace}\n" for inner, host, namespace in sorted(set(entries)))


def write_pid_map(host_dir: str | os.PathLike[str], text: str) -> None:
    """Replace the ``pids`` file of the grant directory `host_dir` with `text` whole (a temporary file in the same
    directory renamed over it, mode 0644). The directory is not made: a released container's is gone, and stays
    so. :raises OSError: it could not be written (the directory is gone, among others)."""
    directory = Path(host_dir)
    if not directory.is_dir():
        raise FileNotFoundError(2, "no such directory", str(directory))
    with tempfile.NamedTemporaryFile("w", dir=directory, prefix=f".{PIDS_FILE}.", delete=False) as out:
        out.write(text)
        temporary = Path(out.name)
    try:
        temporary.chmod(0o644)
        os.replace(temporary, directory / PIDS_FILE)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def from_limits(
    limits: Sequence[tuple[int, int, str]], policy: str = "default", priority: int = 1, oversubscribe: bool = False
) -> Grant:
    """A grant from (memory MiB, cores percent, uuid) per device, as placements record them."""
    return Grant(tuple(DeviceGrant(mib << 20, cores, uuid) for mib, cores, uuid in limits), policy, priority,
                 oversubscribe)  # fmt: skip


def write_files(files: Mapping[str, str]) -> None:
    """Write `files` (``ContainerEdits.files``) as the node daemon does before answering the kubelet: each
    whole or not at all (a temporary file renamed over it), mode 0644 in directories of mode 0755, so that only
    the daemon's user (root) can change them. :raises OSError: one could not be written."""
    for name, text in files.items():
        path = Path(name)
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as out:
            out.write(text)
            temporary = Path(out.name)
        temporary.chmod(0o644)
        os.replace(temporary, path)


def set_grant_control(host_dir: str | os.PathLike[str], vendor: str, device: int, mode: int, until_ns: int) -> None:
    """Ask a granted container's processes, on `device`, to lift their compute limit (mode 1) or yield (2) until
    `until_ns` (``time.time_ns()``; it lapses by itself), or withdraw a request (0): the control words the library
    reads from the read-only grant directory (the accounting file's are ignored once a grant exists, since the
    container can write those). Written in place, the deadline first (the processes have the file mapped)."""
    if not 0 <= device < MAX_DEVICES:
        raise GrantError(f"device {device} is not within 0-{MAX_DEVICES - 1}")
    with open(Path(host_dir) / f"{vendor}.control", "r+b") as handle:
        if mode == 0:
            os.pwrite(handle.fileno(), struct.pack("<I", 0), device * 16)
        os.pwrite(handle.fileno(), struct.pack("<Q", until_ns), device * 16 + 8)
        os.pwrite(handle.fileno(), struct.pack("<I", mode), device * 16)
