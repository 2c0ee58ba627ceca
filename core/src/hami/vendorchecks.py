"""The checks every vendor's `hami_doctor_checks` is made of: the same question asked of each vendor's driver.

Owns how a management library, a command-line tool, device nodes, a CDI specification, a grant directory and a
tool's memory figure (against a container's grant) are judged, and the wording of each verdict, so seven vendors say
the same thing the same way. A vendor passes what is its own (how to open its library, which tool, which device
nodes, which setting names the library) and gets `Finding`s back; a vendor whose node reads its devices from its
management library, else its tool, gets the whole list from `library_else_tool`. Nothing here names a vendor, loads
a driver or runs a tool of its own accord; each function catches what its callable raises and reports it (a doctor
never prints a traceback).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import yaml

from hami.findings import Finding, Status, failed, ok, warning
from hami.isolation.grant import Grant

__all__ = [
    "CDI_DIRS",
    "cdi_spec",
    "device_nodes",
    "driver",
    "fallback",
    "loaded_path",
    "runtime_hook",
    "grant_root",
    "library_else_tool",
    "management_library",
    "tool",
    "tool_memory_against_grant",
]

DEV = Path("/dev")
"""Where device nodes are looked for (tests point it at a directory of their own)."""
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
"""Where container runtimes read CDI specifications (the CDI specification's static and dynamic directories)."""
RUNTIME_CONFIGS = (
    Path("/etc/containerd/config.toml"),
    Path("/etc/docker/daemon.json"),
    Path("/etc/crio/crio.conf"),
    Path("/etc/crio/crio.conf.d"),
)
"""The container runtimes' configuration files (containerd, Docker, CRI-O) a runtime hook is named in."""


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def management_library(
    library: str, setting: str, read: Callable[[], tuple[str, int]], *, check: str = "management library"
) -> Finding:
    """Open the vendor's management library and read it: `read` returns (what was found: path and driver version,
    the number of devices seen) and raises whatever the binding raises when it cannot. No device seen is a
    warning; any exception is a failure naming `library` and the setting that points at another copy."""
    try:
        detail, devices = read()
    except Exception as exc:  # the binding's own errors, OSError from the loader, anything else: all are findings
        return failed(
            check,
            f"{library} could not be used: {_reason(exc)}",
            f"install the vendor's driver on this node (and mount its libraries into the node daemon), or set the "
            f"vendor's {setting} to the library's path",
        )
    if devices == 0:
        return warning(
            check,
            f"{detail}; no device seen",
            "check that the kernel driver sees the devices (the vendor's tool lists them) and that the node daemon's "
            "container has /dev mounted",
        )
    return ok(check, f"{detail}; {devices} device(s)")


def driver(library: Finding, device_patterns: Sequence[str], display: str) -> list[Finding] | None:
    """One finding for a vendor whose hardware is not on this node (its library failed and none of its device nodes
    exists: a node of another vendor, in a cluster that enables several), else None: the caller goes on."""
    dev = DEV
    if library.status is Status.FAILED and not any(next(dev.glob(p), None) for p in device_patterns):
        detail = f"no {display} device node and no management library: not a node with {display} devices"
        return [ok("hardware", detail)]
    return None


def loaded_path(name: str, maps: Path = Path("/proc/self/maps")) -> str | None:
    """Where the dynamic loader found the library `name` (a file name such as ``libnvidia-ml.so.1``) that this
    process has loaded: its path in the process's memory map, or None."""
    try:
        text = maps.read_text()
    except OSError:
        return None
    stem = name.split(".so")[0]
    paths = {line.rsplit(" ", 1)[-1] for line in text.splitlines() if "/" in line}
    return next((p for p in sorted(paths) if Path(p).name.startswith(stem + ".so")), None)


def fallback(library: Finding, tool_finding: Finding, command: str) -> Finding:
    """The library's finding where discovery falls back to `command`: a library that fails while the tool works is
    a warning (devices are still served, read from the tool), not a failure."""
    if library.status is Status.FAILED and tool_finding.status is Status.OK:
        return warning(
            library.check,
            f"{library.detail}; discovery reads {command} instead",
            library.fix + " (the backstop's per-process memory needs the library)",
        )
    return library


def runtime_hook(names: Sequence[str], purpose: str, *, check: str = "container runtime hook") -> Finding:
    """The container runtime's configuration (`RUNTIME_CONFIGS`) names the vendor's runtime or hook (one of
    `names`). Nothing readable here is a warning saying where to look (the node daemon's container sees the host's
    configuration only when it is mounted); a configuration that names none of them is a failure."""
    read: list[Path] = []
    for path in RUNTIME_CONFIGS:
        files = sorted(path.glob("*")) if path.is_dir() else [path]
        for file in files:
            try:
                text = file.read_text(errors="replace")
            except OSError:
                continue
            read.append(file)
            named = [n for n in names if n in text]
            if named:
                return ok(check, f"{file} names {named[0]}")
    wanted = " or ".join(names)
    if not read:
        places = ", ".join(str(p) for p in RUNTIME_CONFIGS)
        return warning(
            check,
            f"no container runtime configuration readable here ({places})",
            f"on the host, check that the runtime is set up with {wanted} ({purpose})",
        )
    return failed(
        check,
        f"{', '.join(map(str, read))} name{'s' if len(read) == 1 else ''} no {wanted}",
        f"set the container runtime up with {wanted} ({purpose})",
    )


def tool(command: str, read: Callable[[str], str], *, needed_for: str, check: str = "management tool") -> Finding:
    """Find `command` on PATH and run it through `read` (given the executable's path; returns what it printed that
    matters: version, devices). Not found is a warning (`needed_for` says what it is used for); a tool that fails
    or prints what `read` cannot read is a failure quoting the reason."""
    exe = shutil.which(command)
    if exe is None:
        return warning(
            check, f"{command} not found on PATH", f"install {command} or add its directory to PATH ({needed_for})"
        )
    try:
        detail = read(exe)
    except Exception as exc:
        return failed(
            check,
            f"{exe}: {_reason(exc)}",
            f"run {command} by hand on the node: it must succeed and print its usual output ({needed_for})",
        )
    return ok(check, f"{exe}: {detail}")


def device_nodes(patterns: Sequence[str], *, dev: Path | None = None, check: str = "device nodes") -> Finding:
    """The vendor's device nodes (glob patterns under `dev`, default `DEV`, e.g. ``nvidia[0-9]*``): at least one,
    each a character device this process can open for reading and writing."""
    dev = DEV if dev is None else dev
    found = sorted({p for pattern in patterns for p in dev.glob(pattern)})
    shown = ", ".join(str(dev / pattern) for pattern in patterns)
    if not found:
        return failed(
            check,
            f"no {shown}",
            "load the vendor's kernel driver, and mount the host's /dev into the node daemon's container",
        )
    problems = []
    for path in found:
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror}")
            continue
        if not stat.S_ISCHR(mode):
            problems.append(f"{path} is not a character device")
        elif not os.access(path, os.R_OK | os.W_OK):
            problems.append(f"{path} is not readable and writable by uid {os.geteuid()}")
    if problems:
        return failed(
            check,
            "; ".join(problems[:4]),
            "run the node daemon privileged (the chart does), with the host's /dev mounted",
        )
    return ok(check, f"{len(found)} found ({', '.join(p.name for p in found[:8])}{', ...' if len(found) > 8 else ''})")


def _cdi_documents(dirs: Iterable[Path]) -> tuple[list[tuple[Path, dict[str, object]]], list[str]]:
    documents: list[tuple[Path, dict[str, object]]] = []
    problems: list[str] = []
    for directory in dirs:
        try:
            entries = sorted(directory.iterdir())
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append(f"{directory}: {exc.strerror}")
            continue
        for path in entries:
            if path.suffix not in (".yaml", ".yml", ".json"):
                continue
            try:
                text = path.read_text()
                document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
            except (OSError, ValueError, yaml.YAMLError) as exc:
                problems.append(f"{path}: {_reason(exc).splitlines()[0]}")
                continue
            if isinstance(document, dict):
                documents.append((path, document))
    return documents, problems


def cdi_spec(
    kind: str,
    names: Sequence[str],
    *,
    dirs: Sequence[Path] | None = None,
    alternative: str = "",
    check: str = "CDI specification",
) -> Finding:
    """The CDI specifications of `kind` (``nvidia.com/gpu``) in `dirs` (default `CDI_DIRS`) name every device in
    `names` (the names the vendor's container edits use: UUIDs, indices). None there is a warning (a runtime set up
    with the vendor's hook instead needs none: `alternative` says how to check that); devices missing from them, or a
    specification that cannot be read, are failures: a container given such a name does not start."""
    dirs = CDI_DIRS if dirs is None else dirs
    documents, problems = _cdi_documents(dirs)
    specs = [(path, doc) for path, doc in documents if doc.get("kind") == kind]
    declared: set[str] = set()
    for _, doc in specs:
        devices = doc.get("devices")
        for device in devices if isinstance(devices, list) else ():
            if isinstance(device, dict) and isinstance(device.get("name"), str):
                declared.add(device["name"])
    if problems:
        return failed(
            check,
            "; ".join(problems[:3]),
            "fix or regenerate the specification (the runtime refuses to start containers while one cannot be read)",
        )
    where = " or ".join(str(d) for d in dirs)
    if not specs:
        return warning(
            check,
            f"no specification of kind {kind} in {where}",
            "generate one with the vendor's CDI tool if the container runtime uses CDI"
            + (f"; otherwise {alternative}" if alternative else ""),
        )
    missing = [n for n in names if n not in declared]
    files = ", ".join(str(p) for p, _ in specs)
    if missing:
        return failed(
            check,
            f"{files} lack{'s' if len(specs) == 1 else ''} {len(missing)} device(s) seen here: "
            + ", ".join(missing[:4]),
            "regenerate the CDI specification after a driver or device change (a container given a name the "
            "specification lacks does not start)",
        )
    return ok(check, f"{files}: all {len(names)} device(s) declared")


def grant_root(root: Path, *, owner: int = 0, check: str = "grant directory") -> Finding:
    """The vendor's grant directories (``<root>/<pod uid>_<container>/<vendor>.grant``, GRANT.md): `root` and
    each directory in it owned by `owner` (root) and writable by no one else, each file too. Containers see them
    read-only; a grant a tenant could write would let it raise its own limits."""
    try:
        entries = [root, *sorted(p for p in root.iterdir())]
    except FileNotFoundError:
        return ok(check, f"{root} not made yet (the node daemon makes it at the first Allocate)")
    except OSError as exc:
        return failed(check, f"{root}: {exc.strerror}", "run hami doctor as root (as the node daemon runs)")
    problems: list[str] = []
    checked = 0
    for directory in entries:
        paths = [directory]
        if directory != root and directory.is_dir() and not directory.is_symlink():
            try:
                paths += sorted(directory.iterdir())
            except OSError as exc:
                problems.append(f"{directory}: {exc.strerror}")
        for path in paths:
            try:
                st = path.lstat()
            except OSError as exc:
                problems.append(f"{path}: {exc.strerror}")
                continue
            checked += 1
            if stat.S_ISLNK(st.st_mode):
                problems.append(f"{path} is a symbolic link")
            elif st.st_uid != owner:
                problems.append(f"{path} is owned by uid {st.st_uid}, not {owner}")
            elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                problems.append(f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o})")
    if problems:
        return failed(
            check,
            "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""),
            f"let only the node daemon write under {root}: chown -R root:root and chmod go-w (a grant a container "
            "can write lets it lift its own limits)",
        )
    return ok(check, f"{root}: {checked} entries, root-owned, writable by no one else")


def tool_memory_against_grant(
    command: str, grant: Grant, read: Callable[[], Sequence[int]], *, check: str = "memory the tool reports"
) -> Finding:
    """In a container: the total memory per device the vendor's tool reports (`read`, MiB, in the container's
    device order) against the grant's limits. A larger figure means the tool does not go through the isolation
    library (statically linked, or the library not preloaded): users then see the whole card."""
    try:
        totals = list(read())
    except Exception as exc:
        return warning(
            check,
            f"{command} could not be read: {_reason(exc)}",
            f"run {command} in the container to see the memory it reports",
        )
    if not totals:
        return warning(check, f"{command} reports no device", "check that the container was given devices")
    wrong = []
    for i, (device, total) in enumerate(zip(grant.devices, totals, strict=False)):
        limit = device.memory_bytes >> 20
        if device.memory_bytes and abs(total - limit) > 1:
            wrong.append(f"device {i}: {total} MiB reported, {limit} MiB granted")
    if wrong:
        return failed(
            check,
            "; ".join(wrong),
            f"{command} is not going through the isolation library: check that /etc/ld.so.preload names it and that "
            f"{command} is dynamically linked (file $(which {command}))",
        )
    shown = ", ".join(f"{t} MiB" for t in totals)
    return ok(check, f"{command} reports {shown}, as granted")


def library_else_tool(
    grant: Grant | None,
    *,
    vendor: str,
    library: str,
    setting: str,
    read_library: Callable[[], tuple[str, int]],
    library_words: str,
    tool_name: str,
    command: str,
    read_tool: Callable[[str], str],
    tool_memory: Callable[[], Sequence[int]],
    device_patterns: Sequence[str],
    grants: Path,
    more: Sequence[Callable[[], Finding]] = (),
) -> list[Finding]:
    """The checks of a vendor whose node reads its devices from its management library, else from its tool.

    In a container (`grant`): the memory per device `tool_memory` reads from the tool (MiB), against the grant. On a
    node: the library (`management_library`: the file `library`, the setting `setting` that names it,
    `read_library` opening it and giving where it was loaded from and how many devices it sees); when there is no
    driver at all (`driver`), only that; else whether the tool stands in for a missing library (`fallback`), the
    tool (`tool`: `command`, the configured path, read by `read_tool`), the device nodes, the vendor's `more`
    checks (each called only when there is a driver) and the grant directory `grants`.

    :param vendor: the vendor's name in messages (``Hygon``).
    :param library_words: the library's name in messages (``ROCm SMI``).
    :param tool_name: the tool's name in messages (``hy-smi``).
    """
    if grant is not None:
        return [tool_memory_against_grant(tool_name, grant, tool_memory)]
    found = management_library(library, setting, read_library)
    nodes = device_nodes(device_patterns)
    absent = driver(found, device_patterns, vendor)
    if absent is not None:
        return absent
    tool_finding = tool(command, read_tool, needed_for=f"discovery's fallback without {library_words}")
    return [
        fallback(found, tool_finding, tool_name),
        tool_finding,
        nodes,
        *(check() for check in more),
        grant_root(grants),
    ]
